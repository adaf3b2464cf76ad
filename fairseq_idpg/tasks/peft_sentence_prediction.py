"""``--task peft_sentence_prediction``: fairseq's sentence_prediction for the prepared data,
aware of the tokens a parameter-efficient method inserts into the input.

Differences from fairseq's ``sentence_prediction`` (everything else is inherited):

- Inputs are always truncated to fit: ``tokens + inserted tokens <= --max-positions``
  (IDPG / DPT insert t prompt vectors that take ordinary positions: IDPG appendix A.4, Figure 5).
  Pairs are truncated longest-first on the texts, so ``<s>``, the separators and the
  final ``</s>`` are always kept (fairseq's ``--shorten-method truncate`` cuts the end of
  the concatenation, final ``</s>`` included, and is ignored here).
- The hook: after ``build_model``, the model's ``num_inserted_tokens`` attribute (0 when
  absent, e.g. fine-tuning, adapters, LoRA) sets the truncation budget. Datasets are
  loaded after the model in fairseq-train and fairseq-validate; loading one earlier with
  another budget is an error, not a silent mis-truncation.
- The classification head's parameters are marked for ``--optimizer adam_head_lr --head-lr``
  (``fairseq_idpg/optim.py``).
- ``--num-classes`` may be omitted when the data folder has the ``task.json`` written by
  ``scripts/prepare_data.py``; the task hands that ``TaskInfo`` to the models it builds as
  ``task.info`` (the task-model protocol: ``tasks/model_protocol.py``).
- Runs trained together on one backbone (``fairseq_idpg.fused``): in a member's thread ``FUSED_MEMBER`` is
  that member, and the task hands it the model it built (to take the group's frozen backbone) and each training
  step (to the group's one forward and backward for all members); everywhere else it is None and nothing changes.
- fairseq-validate (and any evaluation command, whose parser has ``--path``) scores in batches of
  ``EVAL_BATCH_SIZE`` sentences when neither ``--batch-size`` nor ``--max-tokens`` is given (fairseq
  refused to start without one).
"""

import contextvars
import logging
import os
import sys
from dataclasses import dataclass

import numpy as np
from fairseq.data import (
    IdDataset,
    NestedDictionaryDataset,
    NumelDataset,
    NumSamplesDataset,
    OffsetTokensDataset,
    RawLabelDataset,
    RightPadDataset,
    SortDataset,
    StripTokenDataset,
    data_utils,
)
from fairseq.tasks import register_task
from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask
from omegaconf import open_dict

from fairseq_idpg.data import TruncatedSentencesDataset
from fairseq_idpg.data.task_info import TaskInfo
from fairseq_idpg.errors import ConfigError
from fairseq_idpg.modules.prompts.insertion import MIN_INPUT_TOKENS
from fairseq_idpg.optim import mark_head

from .model_protocol import inserted_tokens

logger = logging.getLogger(__name__)
EVAL_BATCH_SIZE = 32  # fairseq-validate's batch when none is given: a score does not depend on it
BATCH_FLAGS = ("--batch-size", "--max-sentences", "--bsz", "--max-tokens")
# the fused group's member whose run this context is (its ``joined(model)`` and ``train_step(...)``); None alone
FUSED_MEMBER = contextvars.ContextVar("fused_member", default=None)


@dataclass
class PeftSentencePredictionConfig(SentencePredictionConfig):
    pass


@register_task("peft_sentence_prediction", dataclass=PeftSentencePredictionConfig)
class PeftSentencePredictionTask(SentencePredictionTask):
    def __init__(self, cfg, data_dictionary, label_dictionary):
        super().__init__(cfg, data_dictionary, label_dictionary)
        self.info = TaskInfo.read(cfg.data) if isinstance(cfg.data, str) and os.path.isdir(cfg.data) else None
        self.is_pair = self.info.pair if self.info is not None else _pair_from_folders(cfg.data)
        self.num_inserted_tokens = 0
        self._loaded_with = {}  # split -> num_inserted_tokens used for its truncation

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        default_eval_batch_size(parser)

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        check_data(cfg)
        return super().setup_task(cfg, **kwargs)

    # ------------------------------------------------------------------ the hook
    def set_num_inserted_tokens(self, n):
        """Reserve ``n`` positions per example for tokens a method inserts (prompts)."""
        n = int(n)
        if self.cfg.max_positions - n < MIN_INPUT_TOKENS:
            raise ConfigError(
                f"{n} inserted tokens do not fit --max-positions {self.cfg.max_positions}: "
                f"at most {self.cfg.max_positions - MIN_INPUT_TOKENS} leave room for the input"
            )
        stale = [s for s, used in self._loaded_with.items() if used != n]
        if stale:
            raise RuntimeError(
                f"split(s) {', '.join(stale)} were loaded before the model was built, with "
                f"a budget for {self._loaded_with[stale[0]]} inserted tokens instead of {n}"
            )
        self.num_inserted_tokens = n

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        self.set_num_inserted_tokens(inserted_tokens(model))
        model = mark_head(model)
        member = FUSED_MEMBER.get()
        if member is not None:
            member.joined(model)
        return model

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        member = FUSED_MEMBER.get()
        if member is None:
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        return member.train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    # ------------------------------------------------------------------ data
    def _load_split(self, key, split, dictionary, combine):
        path = os.path.join(self.cfg.data, key, split)
        empty = os.path.isfile(f"{path}.bin") and os.path.getsize(f"{path}.bin") == 0  # np.memmap refuses it
        dataset = None if empty else data_utils.load_indexed_dataset(path, dictionary, combine=combine)
        if empty or (dataset is not None and len(dataset) == 0):
            raise ConfigError(
                f"{path}.bin/.idx: no rows (an empty binarized split; prepare the data again with "
                f"scripts/prepare_data.py)"
            )
        return dataset

    def load_dataset(self, split, combine=False, **kwargs):
        input0 = self._load_split("input0", split, self.source_dictionary, combine)
        if input0 is None:
            raise ConfigError(
                f"dataset not found: {os.path.join(self.cfg.data, 'input0', split)}.bin/.idx "
                f"(splits are written by scripts/prepare_data.py)"
            )

        input1 = self._load_split("input1", split, self.source_dictionary, combine)
        src_tokens = TruncatedSentencesDataset(
            input0,
            input1,
            init_token=self.cfg.init_token,
            separator_token=self.cfg.separator_token,
            max_tokens=self.cfg.max_positions - self.num_inserted_tokens,
        )
        if src_tokens.num_truncated:
            logger.info(f"{split}: truncated {src_tokens.num_truncated} of {len(src_tokens)} examples")

        dataset = {
            "id": IdDataset(),
            "net_input": {
                "src_tokens": RightPadDataset(src_tokens, pad_idx=self.source_dictionary.pad()),
                "src_lengths": NumelDataset(src_tokens, reduce=False),
            },
            "nsentences": NumSamplesDataset(),
            "ntokens": NumelDataset(src_tokens, reduce=True),
        }
        target = self._load_targets(split, combine)
        if target is not None:
            dataset["target"] = target

        dataset = NestedDictionaryDataset(dataset, sizes=[src_tokens.sizes])
        if not self.cfg.no_shuffle:
            with data_utils.numpy_seed(self.cfg.seed):
                shuffle = np.random.permutation(len(src_tokens))
            dataset = SortDataset(dataset, sort_order=[shuffle])
        logger.info(f"loaded {split}: {len(dataset)} examples")
        self._loaded_with[split] = self.num_inserted_tokens
        self.datasets[split] = dataset
        return dataset

    def _load_targets(self, split, combine):
        if not self.cfg.regression_target:
            labels = self._load_split("label", split, self.label_dictionary, combine)
            if labels is None:
                raise ConfigError(
                    f"{self.cfg.data}: no labels for split {split!r} ({os.path.join(self.cfg.data, 'label', split)}"
                    f".bin/.idx; scripts/prepare_data.py writes them for every split)"
                )
            labels = StripTokenDataset(labels, id_to_strip=self.label_dictionary.eos())
            return OffsetTokensDataset(labels, offset=-self.label_dictionary.nspecial)
        path = os.path.join(self.cfg.data, "label", f"{split}.label")
        if not os.path.exists(path):
            raise ConfigError(f"{self.cfg.data}: no labels for split {split!r} ({path}; scripts/prepare_data.py)")
        with open(path) as f:
            rows = [line.split() for line in f]
        bad = next((i for i, r in enumerate(rows) if len(r) != self.cfg.num_classes), None)
        if bad is not None:
            raise ConfigError(
                f"{path}, line {bad + 1}: expected {self.cfg.num_classes} regression value(s), found {len(rows[bad])}"
            )
        return RawLabelDataset([[float(x) for x in r] for r in rows])


def default_eval_batch_size(parser, argv=None):
    """An evaluation parser (it has ``--path``: fairseq-validate) given no batch flag gets ``--batch-size
    EVAL_BATCH_SIZE`` as its default: fairseq asserts that one is set before it loads anything. Training keeps
    fairseq's own check: its batch is part of the recipe."""
    argv = sys.argv[1:] if argv is None else argv
    given = any(arg.split("=", 1)[0] in BATCH_FLAGS for arg in argv)
    if "--path" in parser._option_string_actions and not given:
        parser.set_defaults(batch_size=EVAL_BATCH_SIZE)


def check_data(cfg):
    """The data folder exists, has the files the task reads, and agrees with ``--num-classes`` (which
    its task.json sets when not given)."""
    data = cfg.data
    if not isinstance(data, str) or not os.path.isdir(data):
        raise ConfigError(f"DATA {data}: no such folder (expected a folder prepared by scripts/prepare_data.py)")
    for need in ("input0/dict.txt",) + (() if cfg.regression_target else ("label/dict.txt",)):
        if not os.path.isfile(os.path.join(data, need)):
            raise ConfigError(f"DATA {data} lacks {need} (expected a folder prepared by scripts/prepare_data.py)")
    info = TaskInfo.read(data)
    if info is None:
        if cfg.num_classes <= 0:
            raise ConfigError(f"--num-classes is required: {TaskInfo.path(data)} (prepare_data.py writes it) not found")
        return
    if cfg.num_classes <= 0:
        with open_dict(cfg):
            cfg.num_classes = info.num_outputs
    elif cfg.num_classes != info.num_outputs:
        what = "a regression score" if info.regression else f"{info.num_outputs} classes"
        raise ConfigError(
            f"--num-classes {cfg.num_classes}: the data in {data} has {what} ({TaskInfo.path(data)}); "
            f"give --num-classes {info.num_outputs} or leave it out"
        )
    if info.regression != bool(cfg.regression_target):
        raise ConfigError(
            f"{data} holds {info.task}, a {'regression' if info.regression else 'classification'} task: "
            f"{'give' if info.regression else 'drop'} --regression-target"
        )


def _pair_from_folders(data):
    """Data prepared without task.json: pairs have an ``input1/`` beside ``input0/``."""
    if not isinstance(data, str) or not os.path.isdir(os.path.join(data, "input0")):
        return None
    return os.path.isdir(os.path.join(data, "input1"))
