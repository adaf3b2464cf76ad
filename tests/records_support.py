"""Run records as fairseq_idpg/run/record.py writes them (results.json), with chosen scores, for the results tests.

write_record(tmp_path, task="RTE", method="dpt", lr=1e-3, seed=2, dev=70.0)      # full data: dev reported
write_record(tmp_path, few_shot=100, data_seed=3, dev=60.0, test=58.0)          # sampled: test reported
"""

import hashlib
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence


def curve(values: Sequence[float], every: int = 100, metric: str = "accuracy", split: str = "valid") -> List[dict]:
    """fairseq-train's validations: ``values[i]`` at ``(i + 1) * every`` updates."""
    return [{"updates": (i + 1) * every, "split": split, metric: v, "loss": 1.0} for i, v in enumerate(values)]


def record(
    task: str = "SST-2",
    method: str = "m-idpg-phm",
    lr: float = 5e-3,
    head_lr: Optional[float] = None,
    seed: int = 1,
    dev: float = 80.0,
    test: Optional[float] = None,
    metric: str = "accuracy",
    model: str = "standin",
    label: Optional[str] = None,
    few_shot: Optional[int] = None,
    dev_from_train: Optional[int] = None,
    data_seed: Optional[int] = None,
    select_on: str = "valid",
    curve: Optional[List[dict]] = None,
    results: Optional[Dict[str, Dict[str, float]]] = None,
    budget: Optional[str] = None,
    diverged: Optional[dict] = None,
    cost: Optional[dict] = None,
) -> dict:
    """One results.json: ``dev`` is the metric on ``select_on``, ``test`` (if given) on its official set;
    ``diverged`` (``{"update", "reason"}``): a diverged run's, with no scores."""
    sampled = few_shot is not None or dev_from_train is not None
    scores = {select_on: {metric: dev, "loss": 0.5}}
    if test is not None:
        scores[select_on.replace("valid", "test")] = {metric: test, "loss": 0.6}
    scores.update(results or {})
    provenance = {
        "raw": f"/data/{task}", "bpe": "wordpiece", "few_shot": few_shot, "dev_from_train": dev_from_train,
        "seed": (data_seed if data_seed is not None else 1) if sampled else None,
    }  # fmt: skip
    out = {
        "task": task,
        "model": model,
        "method": method,
        "metric": metric,
        "select_on": select_on,
        "score": dev,
        "results": scores,
        "seed": seed,
        "lr": lr,
        "updates": 300,
        "total_batch": 32,
        "config": {
            "data": {"provenance": provenance, "train_examples": few_shot or 1000},
            **({"head_lr": head_lr} if head_lr is not None else {}),
        },
        "git": {"commit": "0" * 40, "dirty": False},
        "timings": {"train": 1.0},
        "finished": "2026-01-01 00:00:00",
    }
    if label is not None:
        out["label"] = label
    if budget is not None:  # a sweep's name for the budget, as in its records
        out["budget"] = budget
    if curve is not None:
        out["curve"] = curve
    if diverged is not None:
        out.update(diverged=diverged, score=None, results={})
    if cost is not None:  # {"seconds_per_update", "peak_memory_mb", "memory"}, as run.sh records them
        out["cost"] = cost
    return out


def write_record(root: Path, **fields) -> Path:
    """``record(**fields)`` in ``root/checkpoints/<model>/<task>/<method>/lr<lr>.seed<seed>.<hash8>/results.json``."""
    data = record(**fields)
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:8]
    folder = Path(root) / "checkpoints" / data["model"] / data["task"] / data["method"]
    folder = folder / f"lr{data['lr']:g}.seed{data['seed']}.{digest}"
    folder.mkdir(parents=True)
    path = folder / "results.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def write_finished_run(folder: Path, config: dict, **fields) -> Path:
    """A finished run folder as run.sh leaves it, without training: ``config.json`` (a plan's configuration)
    and ``results.json`` (``record(**fields)`` with that configuration). Returns the folder."""
    data = record(lr=config["lr"], seed=config["seed"], **fields)
    data.update(config=config, run=Path(folder).name, updates=config["updates"])
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (Path(folder) / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    return Path(folder)
