"""What the project's tasks ask of a model, and what they hand it: the task-model protocol.

``peft_sentence_prediction`` builds the model, then loads the datasets (fairseq-train and
fairseq-validate load them after ``build_model``). In between it reads:

- ``num_inserted_tokens`` (``InsertsTokens``): positions the model inserts into every input
  (the t prompt vectors of prompt tuning, IDPG, DPT). The task truncates inputs to
  ``--max-positions`` minus that; 0 for models without the attribute (fine-tuning, adapters).

``idpg_sentence_prediction`` also looks for ``SentenceCacheModel``: a model that wants a
per-example cache (IDPG's sentence representation M(x)) gets, for every split loaded,
``attach_sentence_cache(slot, identity, dataset)``, and its batches carry
``net_input["sentence_ids"]``.

Models see the prepared data only through ``task.info`` (``data/task_info.TaskInfo``, or None
when the folder has no task.json), read at build time, never through files.
"""

from typing import Any, Dict, Protocol, runtime_checkable


@runtime_checkable
class InsertsTokens(Protocol):
    num_inserted_tokens: int


@runtime_checkable
class SentenceCacheModel(Protocol):
    def wants_sentence_cache(self) -> bool:
        """Whether this model, as configured, reads a cached per-example representation."""

    def attach_sentence_cache(self, slot: int, identity: Dict[str, Any], dataset) -> None:
        """Open (or create) the cache of one loaded split; ``slot`` tags its ``sentence_ids``."""


def inserted_tokens(model) -> int:
    return int(model.num_inserted_tokens) if isinstance(model, InsertsTokens) else 0


def task_info(task):
    """The ``TaskInfo`` a task hands to the models it builds (None: no prepared task.json)."""
    return getattr(task, "info", None)


def task_is_pair(task):
    """Whether the task's inputs are sentence pairs; None when it cannot be told."""
    pair = getattr(task, "is_pair", None)
    if pair is None and task_info(task) is not None:
        pair = task_info(task).pair
    return None if pair is None else bool(pair)
