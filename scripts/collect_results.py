#!/usr/bin/env python3
"""Collect the main job's results (``scripts/run.sh``) into a Markdown table for docs/results.md.

    python scripts/collect_results.py                          # every method under checkpoints/standin
    python scripts/collect_results.py --tasks SST-2,RTE --methods m-idpg-phm,prompt-tuning-5

Reads every run folder ``CHECKPOINTS/MODEL/TASK/METHOD/<run>/results.json`` (run.sh writes one folder
per configuration: ``lr<lr>.seed<seed>.<hash>``; a ``METHOD/results.json`` of older versions counts
as one run) and the trained-parameter count fairseq-train logged in ``train.log`` beside it ("num.
trained", classification head included). One row per method, one column per task with the score
on the dev split that selected the checkpoint (the task's metric): runs that differ only by seed
are averaged (mean ± std over the seeds), and where several learning rates (or budgets) were run
the best mean is shown, with its lr. "-" where a run is missing.
"""

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAINED = re.compile(r"num\. (?:shared )?model params: [\d,]+ \(num\. trained: ([\d,]+)\)")


def read_run(folder):
    """results.json of one run folder (with ``trained``: the count in its train.log, or None), or None."""
    results = folder / "results.json"
    if not results.is_file():
        return None
    run = json.loads(results.read_text())
    log = folder / "train.log"
    found = TRAINED.search(log.read_text(errors="replace")) if log.is_file() else None
    run["trained"] = int(found.group(1).replace(",", "")) if found else None
    return run


def runs_of(method_dir):
    """Every run of a method on a task: one per configuration folder (and an older single results.json)."""
    if not method_dir.is_dir():
        return []
    folders = [method_dir] + sorted(p for p in method_dir.iterdir() if p.is_dir())
    return [run for run in map(read_run, folders) if run is not None]


def score(run):
    """The run's dev score (as a number) on the split that selected its checkpoint."""
    if "score" in run:
        return float(run["score"])
    return float(run["results"][run.get("select_on", "valid")][run["metric"]])


def best_setting(runs):
    """(runs, mean, std) of the setting (lr, updates, batch) with the best mean over its seeds."""
    groups = {}
    for run in runs:
        groups.setdefault((run.get("lr"), run.get("updates"), run.get("total_batch")), []).append(run)
    scored = []
    for group in groups.values():
        values = [score(r) for r in group]
        scored.append((statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None, group))
    mean, std, group = max(scored, key=lambda s: s[0])
    return group, mean, std


def cell(runs):
    if not runs:
        return "-"
    group, mean, std = best_setting(runs)
    metric = group[0]["metric"]
    if std is None:
        return f"{mean:g} ({metric})"
    return f"{mean:.2f} ± {std:.2f} ({metric}, {len(group)} seeds)"


def table(root, tasks, methods):
    runs = {(t, m): runs_of(root / t / m) for t in tasks for m in methods}
    lines = [
        "| method | trained (incl. head) | " + " | ".join(f"{t} dev" for t in tasks) + " | lr | updates (batch) |",
        "|---|---:|" + "---:|" * len(tasks) + "---:|---|",
    ]
    for m in methods:
        chosen = {t: best_setting(runs[t, m])[0] for t in tasks if runs[t, m]}
        if not chosen:
            continue
        done = [r for group in chosen.values() for r in group]
        trained = next((r["trained"] for r in done if r["trained"] is not None), None)
        cells = [cell(runs[t, m]) for t in tasks]
        lr = " / ".join(sorted({f"{r['lr']:g}" if "lr" in r else "?" for r in done}))
        updates = " / ".join(
            f"{chosen[t][0].get('updates', '?')} ({chosen[t][0].get('total_batch', '?')})" if t in chosen else "-"
            for t in tasks
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
        else sorted({d.name for t in tasks if (root / t).is_dir() for d in (root / t).iterdir() if d.is_dir()})
    )
    print(table(root, tasks, methods))
    return 0


if __name__ == "__main__":
    sys.exit(main())
