"""A finished run's record, ``results.json``: the scores as numbers, the configuration, the commit, the
timings, the learning curve and the command; and finding the runs of a work folder."""

import json
import shlex
import subprocess
import time
from pathlib import Path

from fairseq_idpg.errors import RunError
from fairseq_idpg.files import write_json
from fairseq_idpg.layout import REPO, SAMPLE_DIR

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
        try:
            config = read_run_file(config_file)
        except DamagedRecord:
            continue  # a half-written config.json: never a match
        if all(config.get(k) == v for k, v in match.items()):
            found.append(config_file.parent)
    return found


class DamagedRecord(RunError):
    """A run folder's results.json or config.json that is not a JSON mapping (a half-written file): its
    ``path`` and ``why``; said as run.sh's one line."""

    def __init__(self, path, why):
        super().__init__(
            f"{path} is damaged ({why}): move it away and the same command resumes the run from its "
            "checkpoints (or scores them again), or --restart trains it again"
        )
        self.path, self.why = path, why


REQUIRED = {"results.json": ("results", "metric"), "config.json": ()}


def read_run_file(path):
    """The mapping in a run folder's ``results.json`` or ``config.json``; None when there is none;
    ``DamagedRecord`` (one line naming the file and what to do) when it is not a JSON mapping."""
    path = Path(path)
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as e:  # a half-written file: truncated JSON
        raise DamagedRecord(path, f"not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise DamagedRecord(path, f"a JSON {type(data).__name__}, not a mapping")
    lacking = [key for key in REQUIRED.get(path.name, ()) if key not in data]
    if lacking:
        raise DamagedRecord(path, "no " + ", ".join(f'"{k}"' for k in lacking))
    return data


def read_run_folder(folder):
    """A run folder's finished record (results.json), or None when it has not finished; ``DamagedRecord``
    when its results.json or config.json is damaged. Reads only: no lock is needed."""
    read_run_file(Path(folder) / "config.json")
    return read_run_file(Path(folder) / "results.json")


def training_cost(log, memory):
    """A record's ``cost``: seconds per update from fairseq-train's log (``logs.training_speed``), and the trainer's
    peak memory where this process trained it (``execution.peak_memory``; None for a run trained before, or in a
    fused group, whose process is shared)."""
    from fairseq_idpg.logs import training_speed

    speed = training_speed(log)
    return {
        "seconds_per_update": None if speed is None else round(speed, 4),
        "peak_memory_mb": memory["mb"] if memory else None,
        "memory": memory["of"] if memory else None,
    }


def made_up_sample(config):
    """The made-up sample folder a run's data was prepared from (an offline stand-in job without data), or None."""
    raw = ((config.get("data") or {}).get("provenance") or {}).get("raw")
    return raw if raw and Path(raw).resolve().is_relative_to(SAMPLE_DIR.resolve()) else None


def write_record(p, results, diverged=None, extra=None):
    """Print the scores and write results.json: the scores, the configuration, the commit, the timings. A
    diverged run (``diverged``: where and why) is a result without scores: ``score`` None, ``results`` {}.
    ``extra``: more fields (a fused run's ``fused_with``: the runs it trained with)."""
    request, config, save, timings = p.request, p.config, p.folder, p.timings
    log = (save / "train.log").read_text(encoding="utf-8", errors="replace")
    updates, batch, lr, metric = config["updates"], config["batch"], config["lr"], config["metric"]
    print(f"\n== {p.task} | model {request.model} | method {request.method} | {updates} updates, batch {batch}, "
          f"lr {lr:g}")  # fmt: skip
    show_scores(results, metric)
    sample = made_up_sample(config)
    if sample:
        print(f"note: trained and scored on made-up sample data ({sample}): the score says nothing about {p.task}")
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
        **({"made_up_sample": sample} if sample else {}),
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
        "curve": learning_curve(log),
        "cost": training_cost(log, p.memory),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": shlex.join(["scripts/run.sh", *p.argv]),
        **(extra or {}),
    }
    write_json(record, save / "results.json")


def training_device():
    """Where fairseq-train ran: the first visible CUDA device's name (as fairseq picks it), else "cpu"."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
