"""Run records as one table: every ``results.json`` (a run folder of ``scripts/run.sh``) and every
``*.json`` under a ``records`` folder (a sweep's copies), one row per run.

A row holds what the table needs: the cell (model, budget, task, label), the method, lr and
``head_lr`` (the classification head's own, ``--head-lr``; NaN where the head trained at the lr),
seed and data seed, the metric, the dev score that selects (``dev``: the metric on ``select_on``),
the reported split and its score (``reported``), and the learning curve. The reported split is the
official set: ``test`` (``test1`` when ``valid1`` selects) where the record has it (sampled data:
few-shot or dev-from-train, whose dev set comes from train; split-dev, whose ``test`` is the half of
the dev set that does not select), else the selection split itself (full data: the papers report GLUE dev).
"""

import json
import math
from pathlib import Path
from typing import Iterable, List, Optional

import pandas as pd

from fairseq_idpg.errors import ConfigError
from fairseq_idpg.sweep_spec import SPLIT_DEV, few_shot_budget

REQUIRED = ("task", "model", "method", "metric", "select_on", "results", "seed", "lr")
CELL = ["model", "budget", "task", "label"]
LRS = ["lr", "head_lr"]  # a run's learning rates: the grid a cell selects from
REPLICATE = ["seed", "data_seed"]  # one run of a cell at one lr: fairseq-train's seed and the data sample's
SWEEP_FIELDS = ("label", "budget")  # what a sweep adds to the results.json it copies to its records


class RecordsError(ConfigError):
    """A record set that cannot make a table, said in one line."""


def record_files(folder: Path) -> List[Path]:
    """``results.json`` files below ``folder``, and every ``*.json`` below a folder named ``records``."""
    found = []
    for path in sorted(folder.rglob("*.json")):
        inside = path.relative_to(folder).parts[:-1]
        if path.name == "results.json" or folder.name == "records" or "records" in inside:
            found.append(path)
    return found


def model_name(model: str) -> str:
    """``standin``, ``roberta.large``, or a model folder's last name (as run.sh names checkpoints/)."""
    return Path(str(model)).name or str(model)


def default_budget(budget: str) -> str:
    """The budget whose published numbers a table takes: ``K=1000 (CR: 775)`` -> ``K=1000``; others as they are."""
    return budget.split(" (")[0]


def budget_of(record: dict) -> str:
    """``full``, ``K=<few_shot>``, ``dev<N>`` (dev-from-train) or ``split-dev``, from the data's provenance."""
    provenance = ((record.get("config") or {}).get("data") or {}).get("provenance") or {}
    if provenance.get("few_shot") is not None:
        return few_shot_budget(provenance["few_shot"])
    if provenance.get("dev_from_train") is not None:
        return f"dev{provenance['dev_from_train']}"
    if provenance.get("split_dev"):
        return SPLIT_DEV
    return "full"


def reported_split(results: dict, select_on: str) -> str:
    """The official set where the record has it (``valid`` -> ``test``, ``valid1`` -> ``test1``), else ``select_on``."""
    official = select_on.replace("valid", "test", 1)
    return official if official in results else select_on


def metric_value(results: dict, split: str, metric: str, path: Path) -> float:
    value = (results.get(split) or {}).get(metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise RecordsError(f"{path}: no {metric} on {split} in its results ({value!r})")
    return float(value)


def row_of(record: dict, path: Path) -> dict:
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise RecordsError(f"{path}: not a run record (no {', '.join(missing)})")
    results, metric, select_on = record["results"], record["metric"], record["select_on"]
    diverged = bool(record.get("diverged"))  # a result without scores (run.sh: a NaN or inf loss)
    split = select_on if diverged else reported_split(results, select_on)
    provenance = ((record.get("config") or {}).get("data") or {}).get("provenance") or {}
    head_lr = (record.get("config") or {}).get("head_lr")  # absent: the head trained at the lr
    return {
        "model": model_name(record["model"]),
        "budget": record.get("budget") or budget_of(record),  # a sweep's name for it, else the provenance's
        "task": record["task"],
        "label": record.get("label") or record["method"],
        "method": record["method"],
        "lr": float(record["lr"]),
        "head_lr": math.nan if head_lr is None else float(head_lr),
        "seed": int(record["seed"]),
        "data_seed": provenance.get("seed"),
        "metric": metric,
        "select_on": select_on,
        "dev": math.nan if diverged else metric_value(results, select_on, metric, path),
        "split": split,
        "reported": math.nan if diverged else metric_value(results, split, metric, path),
        "diverged": diverged,
        "curve": [] if diverged else record.get("curve") or [],
        # what the run cost (records written before these were recorded have none: NaN)
        **{k: cost_value(record, k) for k in ("seconds_per_update", "peak_memory_mb")},
        "memory": (record.get("cost") or {}).get("memory") or "",
        "file": str(path),
    }


def cost_value(record: dict, key: str) -> float:
    value = (record.get("cost") or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def same_run(a: dict, b: dict) -> bool:
    """One run's results.json and its copy in a sweep's records (which adds its label and budget)."""
    return {k: v for k, v in a.items() if k not in SWEEP_FIELDS} == {
        k: v for k, v in b.items() if k not in SWEEP_FIELDS
    }


def read_records(folders: Iterable[Path]) -> pd.DataFrame:
    """One row per run found below ``folders``. A folder with no record, an unreadable record, or
    two different records of one run (cell, lrs, seed, data seed) is a ``RecordsError``; the same
    run found twice (a run folder and its copy in a sweep's records) counts once."""
    rows, seen = [], {}
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise RecordsError(f"{folder}: not a directory")
        files = record_files(folder)
        if not files:
            raise RecordsError(f"{folder}: no run records (results.json, or *.json under a records folder)")
        for path in files:
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                raise RecordsError(f"{path}: unreadable ({e})") from None
            if not isinstance(record, dict):
                raise RecordsError(f"{path}: not a run record (not a JSON object)")
            row = row_of(record, path)
            key = tuple(row[k] for k in CELL + LRS + REPLICATE)
            key = tuple(None if isinstance(v, float) and math.isnan(v) else v for v in key)  # NaN != NaN
            if key in seen:
                first, first_record = seen[key]
                if same_run(first_record, record):
                    continue
                raise RecordsError(
                    f"two records of one run ({', '.join(map(str, key))}): {first} and {path}; remove one"
                )
            seen[key] = (path, record)
            rows.append(row)
    return pd.DataFrame(rows)


def curve_points(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs' learning curves, long: cell columns, ``seed``, ``updates``, ``value`` (the record's
    metric on its selection split, as fairseq-train logged it at each validation)."""
    points = []
    for run in runs.itertuples(index=False):
        for point in run.curve:
            value: Optional[float] = point.get(run.metric)
            if point.get("split", "valid") == run.select_on and isinstance(value, (int, float)):
                points.append({**{k: getattr(run, k) for k in CELL}, "seed": run.seed, "data_seed": run.data_seed,
                               "updates": int(point["updates"]), "value": float(value)})  # fmt: skip
    return pd.DataFrame(points, columns=CELL + REPLICATE + ["updates", "value"])
