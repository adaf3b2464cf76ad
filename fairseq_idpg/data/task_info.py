"""``task.json``: what ``scripts/prepare_data.py`` records about a prepared data folder.

The one owner of that file's schema: prepare writes it (``TaskInfo.write``), the task reads it
(``TaskInfo.read``: ``--num-classes`` and the sentence-pair layout), the main job reads the
metric, splits and ``provenance`` from it (what the folder was made from: the raw folder, the
sha256 of each raw file and of the BPE files, the sampling; ``preprocessing/prepare.py``), to
prepare again when they differ from what it would prepare now. Models never read files: the task
hands them its ``info``.
"""

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional

from fairseq_idpg.errors import ConfigError

FILE_NAME = "task.json"


@dataclass(frozen=True)
class TaskInfo:
    task: str  # canonical name, e.g. "SST-2"
    num_classes: int  # 1 for regression
    regression: bool
    pair: bool  # sentence pairs: <s> A </s></s> B </s>
    metric: str  # the paper's metric: --best-checkpoint-metric
    splits: Dict[str, int]  # split -> examples
    bpe: Optional[str] = None
    labels: Optional[List[str]] = None  # label-dictionary order; None for regression
    few_shot: Optional[int] = None
    dev_from_train: Optional[int] = None
    seed: Optional[int] = None  # of the few-shot / dev sampling, or of the split-dev halves
    provenance: Optional[Dict[str, Any]] = None  # raw, raw_sha256, bpe, bpe_sha256, the sampling, seed
    split_dev: bool = False  # each dev file split in half: valid{i} selects, test{i} is scored (written where set)
    extra: Dict[str, Any] = field(default_factory=dict)  # keys written by other tools

    @property
    def num_outputs(self) -> int:
        """Outputs of the classification head (``--num-classes``)."""
        return 1 if self.regression else int(self.num_classes)

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "TaskInfo":
        known = {f.name for f in fields(cls)} - {"extra"}
        missing = [k for k in ("task", "num_classes", "regression", "pair", "metric", "splits") if k not in values]
        if missing:
            raise ConfigError(f"{FILE_NAME} lacks {', '.join(missing)} (rewrite it with scripts/prepare_data.py)")
        extra = {k: v for k, v in values.items() if k not in known}
        return cls(**{k: v for k, v in values.items() if k in known}, extra=extra)

    def to_dict(self) -> Dict[str, Any]:
        values = asdict(self)
        extra = values.pop("extra")
        if not values["split_dev"]:  # added later: the task.json of other data stays as it was
            del values["split_dev"]
        return {**values, **extra}

    @staticmethod
    def path(data_dir) -> str:
        return os.path.join(str(data_dir), FILE_NAME)

    @classmethod
    def exists(cls, data_dir) -> bool:
        return os.path.isfile(cls.path(data_dir))

    @classmethod
    def read(cls, data_dir) -> Optional["TaskInfo"]:
        """The folder's TaskInfo, or None when it has no task.json (data prepared by other means)."""
        path = cls.path(data_dir)
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as f:
            try:
                return cls.from_dict(json.load(f))
            except (json.JSONDecodeError, ValueError) as e:
                raise ConfigError(f"{path}: {e}") from None

    def write(self, data_dir) -> None:
        with open(self.path(data_dir), "w", encoding="utf-8") as f:
            f.write(json.dumps(self.to_dict(), indent=2) + "\n")

    def replace(self, **changes) -> "TaskInfo":
        return TaskInfo.from_dict({**self.to_dict(), **changes})
