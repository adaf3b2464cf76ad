"""``--task efl_sentence_prediction``: EFL, every task as entailment between the input and a label
description (Wang et al. 2021, "Entailment as Few-Shot Learner"; IDPG Table 1's EFL row).

On top of ``peft_sentence_prediction`` (same data, same truncation, same criterion and metrics):

- the task's hypotheses (``data/label_descriptions.py``): one description of the entailed class
  (binary tasks), one description per class, or, for sentence-pair tasks, the second sentence itself.
  Descriptions are encoded with the BPE the data was prepared with (``preprocessing/data_bpe.py``), and every
  input is truncated so that it fits with the longest ``</s> d </s>`` (they count as inserted tokens);
- the head (``modules/entailment_head.py``) is the MNLI head ([contradiction, neutral, entailment]),
  read as binary [not entailed, entailed]; it is registered under ``--classification-head-name``
  (``mnli`` in the method record: fairseq's ``roberta.large.mnli`` head of that name loads as is);
- training (``train_step``): each batch of B examples becomes its B x C pairs
  (``modules/entailment_pairs.py``) with binary targets (gold pair entailed, others not), trained
  with the criterion's cross-entropy: EFL's binary entailment loss. The training "accuracy" is
  therefore over pairs;
- validation (``valid_step``, fairseq-train and fairseq-validate alike): the criterion sees the model
  through ``EntailmentScores``, which returns the class scores [B, C] of the original examples from
  their pairs; accuracy, F1, MCC are those of argmax over the classes against the original labels.
  The validation loss is the cross-entropy of those class scores (for one hypothesis per example it
  equals the binary entailment loss; with C descriptions it is the softmax over their log-odds).

Regression (STS-B) and MNLI are refused in one line (``label_descriptions.REFUSED``).
"""

import contextlib
import logging
from dataclasses import dataclass, field

from fairseq.tasks import register_task
from omegaconf import OmegaConf, open_dict

from fairseq_idpg.data.label_descriptions import hypotheses_for
from fairseq_idpg.errors import ConfigError
from fairseq_idpg.layout import bpe_places
from fairseq_idpg.modules.entailment_head import install_entailment_head
from fairseq_idpg.modules.entailment_pairs import append_hypotheses, class_scores, description_suffixes, pair_targets
from fairseq_idpg.optim import mark_head
from fairseq_idpg.preprocessing.data_bpe import encode_with_data_bpe, find_data_bpe

from .model_protocol import inserted_tokens
from .peft_sentence_prediction import PeftSentencePredictionConfig, PeftSentencePredictionTask

logger = logging.getLogger(__name__)


@dataclass
class EflSentencePredictionConfig(PeftSentencePredictionConfig):
    efl_bpe_path: str = field(
        default="",
        metadata={
            "help": "the BPE the data was prepared with, to encode the label descriptions: the WordPiece "
            "vocab.txt (or its folder) or the GPT-2 BPE folder; default: found by the sha256 in task.json"
        },
    )


def _writable(cfg):
    return open_dict(cfg) if OmegaConf.is_config(cfg) else contextlib.ExitStack()


class EntailmentScores:
    """Stands for the model in the criterion at validation: ``model(src_tokens [B, T], ...)`` ->
    (class scores [B, C], extra), from the model's binary logits on the B x C pairs."""

    def __init__(self, model, task):
        self._model, self._task = model, task

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, src_tokens, src_lengths=None, **kwargs):
        pairs = self._task.pairs(src_tokens)
        logits, extra = self._model(pairs, **kwargs)
        return class_scores(logits, self._task.num_pairs, self._task.entailed_index), extra


@register_task("efl_sentence_prediction", dataclass=EflSentencePredictionConfig)
class EflSentencePredictionTask(PeftSentencePredictionTask):
    def __init__(self, cfg, data_dictionary, label_dictionary):
        super().__init__(cfg, data_dictionary, label_dictionary)
        if self.info is None:
            raise ConfigError(
                f"--task efl_sentence_prediction needs the task.json of {cfg.data} (scripts/prepare_data.py)"
            )
        self.hypotheses = hypotheses_for(self.info.task)  # one-line refusal for STS-B and MNLI
        if cfg.regression_target:
            raise ConfigError(f"EFL classifies {self.info.task} by entailment: drop --regression-target")
        self.hypotheses.check(self.info.num_classes)
        self.entailed_index = self.hypotheses.entailed_index(self.info.labels)
        self.suffixes = self.suffix_lengths = self.bpe_place = None
        self.num_pairs = 1
        if self.hypotheses.kind == "description":
            bpe, place = find_data_bpe(self.info, cfg.efl_bpe_path or None, places_of=bpe_places)
            self.bpe_place = place
            ids = encode_with_data_bpe(self.hypotheses.texts, self.source_dictionary, bpe, place)
            d = self.source_dictionary
            self.suffixes, self.suffix_lengths = description_suffixes(ids, eos=d.eos(), pad=d.pad())
            self.num_pairs = len(ids)
            logger.info(f"EFL {self.info.task}: descriptions {list(self.hypotheses.texts)} -> {ids} ({bpe} {place})")

    @property
    def suffix_budget(self):
        """Positions the longest ``</s> d </s>`` takes from every input (0 for sentence-pair tasks)."""
        return 0 if self.suffix_lengths is None else int(self.suffix_lengths.max())

    def build_model(self, cfg, from_checkpoint=False):
        from fairseq import models

        with _writable(cfg):
            cfg.max_positions = self.cfg.max_positions
        model = models.build_model(cfg, self, from_checkpoint)
        install_entailment_head(model, self.cfg.classification_head_name)
        self.set_num_inserted_tokens(inserted_tokens(model) + self.suffix_budget)
        return mark_head(model)

    # ------------------------------------------------------------------ pairs
    def pairs(self, src_tokens):
        """[B, T] inputs -> [B * C, T'] entailment pairs (the inputs themselves for sentence-pair tasks)."""
        if self.suffixes is None:
            return src_tokens
        return append_hypotheses(src_tokens, self.source_dictionary.pad(), self.suffixes, self.suffix_lengths)

    def pair_sample(self, sample):
        """A batch of examples as the batch of their pairs with binary targets (EFL's training examples)."""
        pairs = self.pairs(sample["net_input"]["src_tokens"])
        not_pad = pairs.ne(self.source_dictionary.pad())
        return {
            **sample,
            "net_input": {"src_tokens": pairs, "src_lengths": not_pad.sum(dim=1)},
            "target": pair_targets(sample["target"].view(-1), self.num_pairs, self.entailed_index),
            "nsentences": pairs.size(0),
            "ntokens": int(not_pad.sum()),
        }

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        return super().train_step(self.pair_sample(sample), model, criterion, optimizer, update_num, ignore_grad)

    def valid_step(self, sample, model, criterion):
        return super().valid_step(sample, EntailmentScores(model, self), criterion)
