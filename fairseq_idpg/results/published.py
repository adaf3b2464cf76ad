"""The papers' published tables, as data: ``fairseq_idpg/published/<name>.yaml``, one file per table.

A file names its paper, table, backbone, split and statistic, and its ``columns`` (the paper's
header, this project's task name, the metric); ``sections`` hold the rows per budget (``full``,
``K=100``, ...; DPT: per T5 backbone too), each row with the paper's name, this project's method
(``fairseq_idpg/methods.py``), ``mean`` (one number per column, null where the paper's cell is not
available), optionally ``std`` and the paper's ``average``.

    lookup("idpg-table1")            # budget, task, method, row, mean, std
    lookup("dpt-table1@t5-base")     # one backbone of a multi-backbone table (default: default_backbone)
"""

from functools import lru_cache
from pathlib import Path
from typing import List, Tuple

import pandas as pd
import yaml

from fairseq_idpg.errors import ConfigError

PUBLISHED_DIR = Path(__file__).resolve().parents[1] / "published"


class PublishedError(ConfigError):
    """An unknown table name or backbone, said in one line."""


def names() -> List[str]:
    return sorted(p.stem for p in PUBLISHED_DIR.glob("*.yaml"))


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    """The table file as data (``name``: the file's stem)."""
    path = PUBLISHED_DIR / f"{name}.yaml"
    if not path.is_file():
        raise PublishedError(f"unknown published table {name!r}; available: {', '.join(names())}")
    return yaml.safe_load(path.read_text())


def describe(spec: str) -> str:
    """``idpg-table1: IDPG ..., Table 1 (roberta.large)`` (--help, the table's note)."""
    name, _ = parse_name(spec)
    table = load(name)
    backbones = sorted({s["backbone"] for s in table["sections"] if "backbone" in s})
    extra = f"; @{', @'.join(backbones)}" if backbones else ""
    return f"{spec}: {table['paper'].split(' (')[0]}, {table['table']} ({table['backbone']}{extra})"


def legend(spec: str) -> str:
    """``idpg-table3 (roberta.large)``: the plots' name for the published ticks, with the paper's backbone."""
    name, backbone = parse_name(spec)
    table = load(name)
    return f"{name} ({backbone or table.get('default_backbone') or table['backbone']})"


def parse_name(spec: str) -> Tuple[str, str]:
    name, _, backbone = spec.partition("@")
    return name, backbone


def rows(table: dict) -> pd.DataFrame:
    """Every number of a table, long: backbone, budget, row, method, task, mean, std; plus the
    paper's ``average`` per row (task ``average``)."""
    tasks = [c["task"] for c in table["columns"]]
    out = []
    for section in table["sections"]:
        for row in section["rows"]:
            std = row.get("std") or [None] * len(tasks)
            if len(row["mean"]) != len(tasks) or len(std) != len(tasks):
                raise PublishedError(f"{table['table']} row {row['row']!r}: {len(tasks)} columns, other counts given")
            common = {"backbone": section.get("backbone", ""), "budget": section["budget"], "row": row["row"],
                      "method": row["method"]}  # fmt: skip
            for task, mean, sd in zip(tasks, row["mean"], std, strict=False):
                out.append({**common, "task": task, "mean": mean, "std": sd})
            if row.get("average") is not None:
                out.append({**common, "task": "average", "mean": row["average"], "std": None})
    return pd.DataFrame(out).astype({"mean": float, "std": float})


def lookup(spec: str) -> pd.DataFrame:
    """The per-task numbers of ``name[@backbone]`` to put beside measured cells (budget, task,
    method, row, mean, std); a multi-backbone table gives its ``default_backbone`` unless one is named."""
    name, backbone = parse_name(spec)
    table = load(name)
    numbers = rows(table)
    backbones = sorted(set(numbers["backbone"]) - {""})
    if backbones:
        backbone = backbone or table.get("default_backbone", backbones[-1])
        if backbone not in backbones:
            raise PublishedError(f"{name} has no backbone {backbone!r}; available: {', '.join(backbones)}")
        numbers = numbers[numbers["backbone"] == backbone]
    elif backbone:
        raise PublishedError(f"{name} has one backbone ({table['backbone']}); drop @{backbone}")
    return numbers[(numbers["task"] != "average") & numbers["mean"].notna()].reset_index(drop=True)
