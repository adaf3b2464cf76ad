"""Named training recipes of the methods: what ``scripts/run.sh TASK --method NAME`` runs.

A method is a fairseq model/architecture plus its flags and the paper's optimisation
settings. Model modules register theirs at import (``register_method``); the main job
(``fairseq_idpg/recipe.py``) looks them up, so adding a method never touches the recipe.

    register_method(
        "m-idpg-phm", ["--arch", "roberta_idpg", "--idpg-preset", "m-idpg-phm"],
        lr=5e-3, scheduler="fixed", description="IDPG Table 1, M-IDPG-PHM")

``frozen_backbone`` methods get the pretrained checkpoint as ``--backbone PATH`` (loaded
frozen at build time, see ``models/frozen_roberta.py``); full fine-tuning gets it as
``--restore-file``. The encoder size flags are always read from the checkpoint, so the
same method runs on roberta.large, roberta.base or the stand-in.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass(frozen=True)
class Method:
    name: str
    train_args: List[str]
    lr: Optional[float] = None  # None: the task's fine-tuning lr (recipe table)
    scheduler: str = "polynomial_decay"  # or "fixed" (IDPG's released scripts: constant lr)
    warmup: float = 0.06  # fraction of updates (polynomial_decay only)
    frozen_backbone: bool = True
    description: str = ""
    extra: Dict[str, str] = field(default_factory=dict)


METHODS: Dict[str, Method] = {}


def register_method(name, train_args, **kwargs):
    if name in METHODS:
        raise ValueError(f"method {name!r} registered twice")
    METHODS[name] = Method(name, list(train_args), **kwargs)
    return METHODS[name]


register_method(
    "finetune",
    ["--arch", "roberta"],
    frozen_backbone=False,
    description="full fine-tuning (fairseq's RoBERTa GLUE recipe)",
)
