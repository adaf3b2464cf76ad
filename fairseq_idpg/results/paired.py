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

Two methods of one record set, compared seed by seed (a study's question: does B beat A?):

    python -m fairseq_idpg.results.paired docs/results/standin-baselines2026/records --methods lora loreft

Each method's runs of a task are those of the lr the table reports (``choose_runs``' ``mean-dev``: the best mean
dev score), and each of A's runs is paired with B's run of the same task, seed and data seed; the rows are as
above, per task, with B's lr beside A's.
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


def paired_methods(records: pd.DataFrame, a: str, b: str) -> tuple:
    """``paired`` of method (label) ``a`` against ``b`` within one record set: per task, each at the lr the table
    reports (``table.choose_runs``, mean-dev), paired by seed and data seed. The rows' ``label`` is "b - a", their
    ``lr`` a's and ``lr_b`` b's."""
    from .table import choose_runs

    missing = [label for label in (a, b) if label not in set(records["label"])]
    if missing:
        known = ", ".join(sorted(set(records["label"])))
        raise RecordsError(f"--methods: no record of {' or '.join(missing)} (the records hold {known})")
    chosen = choose_runs(records[records["label"].isin([a, b])])
    sides = [chosen[chosen["label"] == label] for label in (a, b)]
    lrs = [{task: runs["lr"].iloc[0] for task, runs in side.groupby("task")} for side in sides]
    # paired by task, seed and data seed, whatever each method's lr
    table, lonely = paired(*(side.assign(label=f"{b} - {a}", lr=0.0, head_lr=None) for side in sides))
    if not table.empty:
        table = table.assign(lr=table["task"].map(lrs[0]), lr_b=table["task"].map(lrs[1]))
    return table, lonely


def markdown(table: pd.DataFrame, names=("A", "B")) -> str:
    a, b = names
    lines = [
        f"| task | method | lr | n | {a} | {b} | {b} - {a} (paired) | p | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in table.itertuples():
        lr = f"{r.lr:g}" if "lr_b" not in table else f"{r.lr:g} / {r.lr_b:g}"
        lines.append(
            f"| {r.task} | {r.label} | {lr} | {r.n} | {r.mean_a:.1f} ± {r.std_a:.1f} | {r.mean_b:.1f} ± "
            f"{r.std_b:.1f} | {r.difference:+.1f} ± {r.difference_std:.1f} | {r.p:.2f} | {r.verdict} |"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fairseq_idpg.results.paired", description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="a records folder (or run folders' parent): the first way")
    p.add_argument("b", nargs="?", help="a records folder: the second way (none with --methods)")
    p.add_argument("--names", nargs=2, default=None, metavar=("A", "B"), help="the two ways' names")
    p.add_argument("--methods", nargs=2, metavar=("A", "B"), help="compare method B with method A in folder a")
    opts = p.parse_args(argv)
    if (opts.b is None) == (opts.methods is None):
        print("paired: error: give two records folders, or one and --methods A B", file=sys.stderr)
        return 2
    names = opts.names or opts.methods or ("A", "B")
    try:
        if opts.methods:
            table, lonely = paired_methods(read_records([opts.a]), *opts.methods)
        else:
            table, lonely = paired(read_records([opts.a]), read_records([opts.b]))
    except RecordsError as e:
        print(f"paired: error: {e}", file=sys.stderr)
        return 2
    if table.empty:
        where = f"{opts.methods[1]}'s runs in {opts.a}" if opts.methods else opts.b
        print(f"paired: error: no run has its pair in {where} (same task, seed)", file=sys.stderr)
        return 2
    print(markdown(table, names))
    for r in lonely.to_dict("records"):
        side = names[0] if r["_merge"] == "left_only" else names[1]
        lr = "" if opts.methods else f" lr {r['lr']:g}"
        print(f"only in {side}: {r['task']} {r['label']}{lr} seed {r['seed']} (left out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
