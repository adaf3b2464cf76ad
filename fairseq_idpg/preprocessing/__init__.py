"""Data preparation: raw task files -> fairseq binarized data (``scripts/prepare_data.py``).

``formats`` holds one reader per raw file format and the table of the twelve tasks;
``prepare`` the pipeline (validate, sample, BPE-encode, binarize). See docs/data.md.
"""

from .formats import TASKS, Example, PrepareError, TaskSpec, get_task
from .prepare import encode, make_splits, prepare

__all__ = ["TASKS", "Example", "PrepareError", "TaskSpec", "get_task", "encode", "make_splits", "prepare"]
