"""python -m fairseq_idpg.results DIR [DIR ...]: a paper's table from the run records below the folders.

python -m fairseq_idpg.results checkpoints/roberta.large                   # Markdown on stdout
python -m fairseq_idpg.results sweeps/idpg/records --published idpg-table1 --out-dir tables/idpg
python -m fairseq_idpg.results checkpoints --select best-per-seed --format csv
"""

import argparse
import sys
from pathlib import Path

from . import plots, published
from .records import RecordsError, curve_points, read_records
from .spec import keep, read_spec
from .table import SELECTION_TEXT, SELECTIONS, cells, choose_runs, cost_markdown, long_table, markdown


def parse_args(argv):
    tables = "\n".join("  " + published.describe(name) for name in published.names())
    p = argparse.ArgumentParser(
        prog="python -m fairseq_idpg.results",
        description="A paper's table from run records (results.json of run folders, *.json under a records folder).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"published tables (--published NAME[@BACKBONE]; fairseq_idpg/published/):\n{tables}\n\n"
        "Scores: mean ± sample std (ddof 1) over seeds of the official test set where a record has one "
        "(sampled dev sets; split-dev: the dev half that did not select), else of the selection dev split. "
        "docs/results-tables.md.",
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="folders searched recursively for records")
    p.add_argument(
        "--select",
        choices=SELECTIONS,
        default="mean-dev",
        help=f"mean-dev (default): {SELECTION_TEXT['mean-dev']}; best-per-seed: {SELECTION_TEXT['best-per-seed']}",
    )
    p.add_argument("--published", metavar="NAME", help="the published table to put beside (see below)")
    p.add_argument(
        "--spec",
        metavar="YAML",
        help="a sweep specification (examples/*/): its cells only, its row and column order, its published table",
    )
    p.add_argument("--format", choices=("markdown", "csv"), default="markdown", help="what stdout gets")
    p.add_argument("--out-dir", metavar="DIR", help="write table.md, table.csv, bars.png, curves.png there")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        table_spec = read_spec(args.spec) if args.spec else None
        name = args.published or (table_spec.published if table_spec else None)
        paper = published.lookup(name) if name else None
        runs = read_records(args.dirs)
        if table_spec:
            runs = keep(runs, table_spec)
    except (RecordsError, published.PublishedError) as e:
        print(f"results: error: {e}", file=sys.stderr)
        return 2
    chosen = choose_runs(runs, args.select)
    order = (
        {"labels": table_spec.labels, "tasks": table_spec.tasks, "spec_methods": table_spec.methods}
        if table_spec
        else {}
    )
    long = long_table(cells(chosen), paper, **order)
    text = markdown(long, args.select, published.describe(name) if name else None) + cost_markdown(chosen)
    csv = long.to_csv(index=False, float_format="%.6g")
    print(text if args.format == "markdown" else csv, end="")
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(text)
        (out / "table.csv").write_text(csv)
        plots.bar_figure(long, published.legend(name) if name else "paper").savefig(out / "bars.png", dpi=100)
        plots.curve_figure(curve_points(chosen), long).savefig(out / "curves.png", dpi=100)
        print(f"wrote {out}/table.md, table.csv, bars.png, curves.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
