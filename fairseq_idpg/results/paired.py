"""Two record sets of the same runs, compared run by run: ``python -m fairseq_idpg.results.paired A B``.

    python -m fairseq_idpg.results.paired docs/results/standin-fused-dropout/alone/records \
        docs/results/standin-fused-dropout/fused/records --names alone fused

The same configurations trained two ways (alone and trained together with ``--fuse``; two machines; two
versions of the code) are two draws of one distribution where the two ways differ only in their random
draws (dropout masks). Each run of A is paired with the run of B of the same cell, lr, seed and data seed; per
cell and lr, printed: both ways' reported score (mean +- std over the seeds), the paired difference B - A
(mean +- std), the paired t-test's p (scipy's ``ttest_rel``) and the verdict: "agree" when the mean difference
is within the seeds' spread (at most the larger of the two ways' std), else "differ"; "one seed" where a cell has
a single pair (no spread: no verdict). Runs found on one side only are listed and left out.
"""

import argparse
import sys

import pandas as pd

from .records import CELL, LRS, REPLICATE, RecordsError, read_records

KEY = CELL + LRS + REPLICATE


def paired(a: pd.DataFrame, b: pd.DataFrame) -> tuple:
    """(one row per cell and lr: n, mean and std of each way's reported score and of the paired difference b - a,
    p, verdict; the runs found on one side only). ``a``, ``b``: ``read_records`` tables."""
    from scipy.stats import ttest_rel

    both = pd.merge(a, b, on=KEY, suffixes=("_a", "_b"), how="outer", indicator=True)
    lonely = both[both["_merge"] != "both"]
    both = both[both["_merge"] == "both"].copy()
    both["difference"] = both["reported_b"] - both["reported_a"]
    rows = []
    for key, runs in both.groupby(CELL + LRS, dropna=False, sort=True):
        spread = max(runs["reported_a"].std(), runs["reported_b"].std())
        p = ttest_rel(runs["reported_b"], runs["reported_a"]).pvalue if len(runs) > 1 else float("nan")
        mean = runs["difference"].mean()
        rows.append(
            {
                **dict(zip(CELL + LRS, key, strict=True)),
                "n": len(runs),
                "mean_a": runs["reported_a"].mean(),
                "std_a": runs["reported_a"].std(),
                "mean_b": runs["reported_b"].mean(),
                "std_b": runs["reported_b"].std(),
                "difference": mean,
                "difference_std": runs["difference"].std(),
                "p": p,
                # one pair has no spread to hold the difference to: no verdict (nan would read as "differ")
                "verdict": "one seed" if len(runs) < 2 else "agree" if abs(mean) <= spread else "differ",
            }
        )
    return pd.DataFrame(rows), lonely[KEY + ["_merge"]]


def markdown(table: pd.DataFrame, names=("A", "B")) -> str:
    a, b = names
    lines = [
        f"| task | method | lr | n | {a} | {b} | {b} - {a} (paired) | p | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.task} | {r.label} | {r.lr:g} | {r.n} | {r.mean_a:.1f} ± {r.std_a:.1f} | {r.mean_b:.1f} ± "
            f"{r.std_b:.1f} | {r.difference:+.1f} ± {r.difference_std:.1f} | {r.p:.2f} | {r.verdict} |"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fairseq_idpg.results.paired", description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="a records folder (or run folders' parent): the first way")
    p.add_argument("b", help="a records folder: the second way")
    p.add_argument("--names", nargs=2, default=("A", "B"), metavar=("A", "B"), help="the two ways' names")
    opts = p.parse_args(argv)
    try:
        table, lonely = paired(read_records([opts.a]), read_records([opts.b]))
    except RecordsError as e:
        print(f"paired: error: {e}", file=sys.stderr)
        return 2
    if table.empty:
        print(f"paired: error: no run of {opts.a} has its pair in {opts.b} (same cell, lr, seed)", file=sys.stderr)
        return 2
    print(markdown(table, opts.names))
    for r in lonely.to_dict("records"):
        side = opts.names[0] if r["_merge"] == "left_only" else opts.names[1]
        print(f"only in {side}: {r['task']} {r['label']} lr {r['lr']:g} seed {r['seed']} (left out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
