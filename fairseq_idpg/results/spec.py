"""What a sweep specification (``fairseq_idpg/sweep.py``, ``examples/*/*.yaml``) says of its table:
the published table to put beside, the rows (its labels, in order), the columns (its tasks) and the
budgets. ``--spec`` keeps only the runs of those cells, so a checkpoints folder holding other runs
gives the spec's table."""

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import pandas as pd
import yaml

from .records import RecordsError


@dataclass
class TableSpec:
    published: Optional[str]
    labels: List[str]
    tasks: List[str]
    budgets: List[str]


def budgets_of(budget) -> List[str]:
    """The spec's ``budget`` as the table's budget names: ``full``, ``K=<k>`` per few_shot, ``dev<N>``."""
    if budget in (None, "full"):
        return ["full"]
    if isinstance(budget, dict) and "few_shot" in budget:
        shots = budget["few_shot"] if isinstance(budget["few_shot"], list) else [budget["few_shot"]]
        return [f"K={k}" for k in shots]
    if isinstance(budget, dict) and "dev_from_train" in budget:
        return [f"dev{budget['dev_from_train']}"]
    raise RecordsError(f"budget {budget!r}: full, or a mapping with few_shot or dev_from_train")


def read_spec(path) -> TableSpec:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise RecordsError(f"--spec {path}: unreadable ({e})") from None
    if not isinstance(data, dict) or "methods" not in data or "tasks" not in data:
        raise RecordsError(f"--spec {path}: not a sweep specification (no methods or tasks)")
    labels = [m if isinstance(m, str) else str(m.get("label", m.get("method"))) for m in data["methods"]]
    return TableSpec(data.get("published"), labels, list(data["tasks"]), budgets_of(data.get("budget")))


def keep(runs: pd.DataFrame, spec: TableSpec) -> pd.DataFrame:
    """The runs of the spec's cells; none is a ``RecordsError``."""
    kept = runs[runs["label"].isin(spec.labels) & runs["task"].isin(spec.tasks) & runs["budget"].isin(spec.budgets)]
    if kept.empty:
        raise RecordsError(
            f"no record of the spec's cells (labels {', '.join(spec.labels)}; tasks {', '.join(spec.tasks)}; "
            f"budgets {', '.join(spec.budgets)})"
        )
    return kept
