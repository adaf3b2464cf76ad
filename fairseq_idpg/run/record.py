"""A finished run's record, ``results.json``: the scores as numbers, the configuration, the commit, the
timings, the learning curve and the command; and finding the runs of a work folder."""

import json
import shlex
import subprocess
import time
from pathlib import Path

from fairseq_idpg.layout import REPO

SHOWN_METRICS = ("accuracy", "f1", "acc_and_f1", "mcc", "pearson", "spearman", "pearson_and_spearman", "loss")


def learning_curve(log):
    """The validations of a train.log, the last one per (split, updates): a resumed run repeats some."""
    from fairseq_idpg.logs import curve

    points = {(c["split"], c["updates"]): c for c in curve(log, SHOWN_METRICS)}
    return sorted(points.values(), key=lambda c: (c["updates"], c["split"]))


def show_scores(results, metric):
    for subset, values in results.items():
        shown = {k: v for k, v in values.items() if k in SHOWN_METRICS}
        print(f"{subset}: " + ", ".join(f"{k} {v}" for k, v in shown.items()) + f"   (paper metric: {metric})")


def git_state(repo=REPO):
    """{"commit", "dirty"} of the checkout holding this code; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        if head.returncode:
            return None
        # --no-optional-locks: a read-only look (no index refresh written)
        status = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if not status.returncode else None}
    except (OSError, subprocess.TimeoutExpired):
        return None


def find_runs(work, name, task, method, **match):
    """Run folders of ``WORK/checkpoints/<name>/<task>/<method>`` whose config.json has the given
    values (e.g. ``seed=2, lr=5e-3``), oldest first."""
    root = Path(work) / "checkpoints" / name / task / method
    found = []
    for config_file in sorted(root.glob("*/config.json"), key=lambda p: p.stat().st_mtime):
        config = json.loads(config_file.read_text())
        if all(config.get(k) == v for k, v in match.items()):
            found.append(config_file.parent)
    return found


def write_record(p, results, diverged=None):
    """Print the scores and write results.json: the scores, the configuration, the commit, the timings. A
    diverged run (``diverged``: where and why) is a result without scores: ``score`` None, ``results`` {}."""
    request, config, save, timings = p.request, p.config, p.folder, p.timings
    updates, batch, lr, metric = config["updates"], config["batch"], config["lr"], config["metric"]
    print(f"\n== {p.task} | model {request.model} | method {request.method} | {updates} updates, batch {batch}, "
          f"lr {lr:g}")  # fmt: skip
    show_scores(results, metric)
    timings["total"] = round(time.time() - p.start, 1)
    print("times: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    print(f"run folder: {save}")
    record = {
        "task": p.task,
        "model": request.model,
        "method": request.method,
        "metric": metric,
        "select_on": config["select_on"],
        "score": None if diverged else results[config["select_on"]].get(metric),
        **({"diverged": diverged} if diverged else {}),
        "results": results,
        "seed": request.seed,
        "lr": lr,
        "updates": updates,
        "total_batch": batch,
        "config": config,
        "run": save.name,
        "git": git_state(),
        "timings": timings,
        "device": training_device(),  # what the timings (and CUDA's own random streams) were measured on
        # the dev metrics fairseq-train logged at each validation (its --log-format json lines)
        "curve": learning_curve((save / "train.log").read_text(encoding="utf-8", errors="replace")),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": shlex.join(["scripts/run.sh", *p.argv]),
    }
    (save / "results.json").write_text(json.dumps(record, indent=1) + "\n")


def training_device():
    """Where fairseq-train ran: the first visible CUDA device's name (as fairseq picks it), else "cpu"."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
