"""What a sweep specification (``fairseq_idpg/sweep_spec.py``, ``examples/*/*.yaml``) says of its table:
the published table to put beside, the rows (its labels, in order), the columns (its tasks) and the
budgets, read by the sweep's own loader. ``--spec`` keeps only the runs of those cells, so a
checkpoints folder holding other runs gives the spec's table."""

from dataclasses import dataclass
from typing import Dict, List, Optional

import pandas as pd

from .records import RecordsError


@dataclass
class TableSpec:
    published: Optional[str]
    methods: Dict[str, str]  # the rows: label -> method, in the spec's order
    tasks: List[str]
    budgets: List[str]

    @property
    def labels(self) -> List[str]:
        return list(self.methods)


def read_spec(path) -> TableSpec:
    from fairseq_idpg.errors import SweepError
    from fairseq_idpg.sweep_spec import load_spec

    try:
        spec = load_spec(path)
    except SweepError as e:
        raise RecordsError(f"--spec {e}") from None
    runs = spec.runs
    ordered = lambda values: list(dict.fromkeys(values))  # noqa: E731
    return TableSpec(
        spec.published,
        {r.label: r.method for r in runs},
        ordered(r.task for r in runs),
        ordered(r.budget for r in runs),
    )


def keep(runs: pd.DataFrame, spec: TableSpec) -> pd.DataFrame:
    """The runs of the spec's cells; none is a ``RecordsError``."""
    kept = runs[runs["label"].isin(spec.labels) & runs["task"].isin(spec.tasks) & runs["budget"].isin(spec.budgets)]
    if kept.empty:
        raise RecordsError(
            f"no record of the spec's cells (labels {', '.join(spec.labels)}; tasks {', '.join(spec.tasks)}; "
            f"budgets {', '.join(spec.budgets)})"
        )
    return kept
