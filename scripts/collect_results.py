#!/usr/bin/env python3
"""Collect the main job's results (``scripts/run.sh``) into a Markdown table for docs/results.md.

    python scripts/collect_results.py                          # every method under checkpoints/standin
    python scripts/collect_results.py --tasks SST-2,RTE --methods m-idpg-phm,prompt-tuning-5

Reads ``CHECKPOINTS/MODEL/TASK/METHOD/results.json`` (written by run.sh after fairseq-validate) and
the trained-parameter count fairseq-train logged in ``train.log`` beside it ("num. trained",
classification head included). One row per method, one column per task with the task's metric
on the dev set; "-" where a run is missing.
"""

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAINED = re.compile(r"num\. (?:shared )?model params: [\d,]+ \(num\. trained: ([\d,]+)\)")


def read_run(folder):
    """(results dict, trained parameters or None) of one run folder, or None without results.json."""
    results = folder / "results.json"
    if not results.is_file():
        return None
    run = json.loads(results.read_text())
    log = folder / "train.log"
    found = TRAINED.search(log.read_text(errors="replace")) if log.is_file() else None
    run["trained"] = int(found.group(1).replace(",", "")) if found else None
    return run


def table(root, tasks, methods):
    runs = {(t, m): read_run(root / t / m) for t in tasks for m in methods}
    lines = [
        "| method | trained (incl. head) | " + " | ".join(f"{t} dev" for t in tasks) + " | lr | updates (batch) |",
        "|---|---:|" + "---:|" * len(tasks) + "---:|---|",
    ]
    for m in methods:
        done = [runs[t, m] for t in tasks if runs[t, m]]
        if not done:
            continue
        trained = next((r["trained"] for r in done if r["trained"] is not None), None)
        cells = [
            f"{r['results']['valid'][r['metric']]} ({r['metric']})" if r else "-" for r in (runs[t, m] for t in tasks)
        ]
        lr = " / ".join(sorted({f"{r['lr']:g}" if "lr" in r else "?" for r in done}))
        updates = " / ".join(
            f"{r.get('updates', '?')} ({r.get('total_batch', '?')})" if r else "-" for r in (runs[t, m] for t in tasks)
        )
        count = f"{trained:,}" if trained is not None else "?"
        lines.append(f"| {m} | {count} | " + " | ".join(cells) + f" | {lr} | {updates} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoints", default=str(REPO / "checkpoints"), help="run.sh's checkpoints folder")
    p.add_argument("--model", default="standin", help="the model's folder name under --checkpoints (default standin)")
    p.add_argument("--tasks", default="SST-2,RTE")
    p.add_argument("--methods", help="comma-separated, in table order (default: every method found)")
    args = p.parse_args(argv)
    root = Path(args.checkpoints) / args.model
    if not root.is_dir():
        p.error(f"--checkpoints/--model: {root} does not exist (run scripts/run.sh first)")
    tasks = args.tasks.split(",")
    methods = (
        args.methods.split(",")
        if args.methods
        else sorted({d.name for t in tasks if (root / t).is_dir() for d in (root / t).iterdir()})
    )
    print(table(root, tasks, methods))
    return 0


if __name__ == "__main__":
    sys.exit(main())
