"""``--criterion sentence_prediction_metrics``: fairseq's ``sentence_prediction`` (same loss,
same flags) that also logs the papers' GLUE metrics at corpus level during validation.

- 2-class classification: ``f1`` (positive class = label index 1), ``acc_and_f1`` and
  ``mcc``, besides fairseq's ``accuracy``. Evaluation batches add their confusion counts
  ``tp, fp, fn, tn`` to the logging output; they are summed over batches and workers, so
  the logging outputs stay summable (fast stat sync).
- ``--regression-target``: ``pearson``, ``spearman`` and ``pearson_and_spearman``.
  Evaluation batches add their ``[prediction, target]`` rows (a float32 CPU tensor under
  ``pred_target``); the logging outputs are then all-gathered between workers, and a
  ``PredictionMeter`` concatenates the rows of every batch.

Training batches log what ``sentence_prediction`` logs (loss, accuracy) and nothing more.
Evaluation means model and criterion both in eval mode, as fairseq-train's validation and
fairseq-validate set them. All scores are x 100; see ``fairseq_idpg/metrics.py`` and
``docs/metrics.md``.
"""

import functools
import pickle
from dataclasses import dataclass

import torch
from fairseq import utils
from fairseq.criterions import register_criterion
from fairseq.criterions.sentence_prediction import (
    SentencePredictionConfig,
    SentencePredictionCriterion,
)
from fairseq.distributed import utils as distributed_utils
from fairseq.logging import metrics
from omegaconf import II

from fairseq_idpg import metrics as glue_metrics
from fairseq_idpg.errors import ConfigError

COUNTS = ("tp", "fp", "fn", "tn")
PAIRS = "pred_target"
PRIORITY = 20  # after loss (10) and accuracy (10), like fairseq's derived meters
GATHER_HEADER = 4  # bytes all_gather_list prepends to each worker's pickle


@dataclass
class SentencePredictionMetricsConfig(SentencePredictionConfig):
    all_gather_list_size: int = II("common.all_gather_list_size")


class _LogitsRecorder:
    """Stands for the model in ``sentence_prediction``'s forward and keeps the logits."""

    def __init__(self, model):
        self._model = model
        self.logits = None

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        output = self._model(*args, **kwargs)
        self.logits = output[0]
        return output


def _from_counts(metric, meters):
    return round(metric(*(meters["_" + key].sum for key in COUNTS)), 2)


def _temporary_aggregators():
    """The active aggregators that have no name.

    Named ones ("default", "train", "valid", ...) are saved in checkpoints and reloaded by
    meter class name from ``fairseq.logging.meters``, where ``PredictionMeter`` is not;
    "valid" is never reset either. fairseq-train's validation and fairseq-validate read
    their results from temporary aggregators.
    """
    named = {id(agg) for agg in metrics._aggregators.values()}
    return [agg for agg in metrics.get_active_aggregators() if id(agg) not in named]


@register_criterion("sentence_prediction_metrics", dataclass=SentencePredictionMetricsConfig)
class SentencePredictionMetricsCriterion(SentencePredictionCriterion):
    def __init__(self, cfg: SentencePredictionMetricsConfig, task):
        super().__init__(cfg, task)
        size = cfg.all_gather_list_size
        self.all_gather_list_size = size if isinstance(size, int) else 16384

    def forward(self, model, sample, reduce=True):
        recorder = _LogitsRecorder(model)
        loss, sample_size, logging_output = super().forward(recorder, sample, reduce)
        if model.training or self.training:
            return loss, sample_size, logging_output
        logits = recorder.logits.detach()
        targets = model.get_targets(sample, [logits]).view(-1)
        if self.regression_target:
            pairs = torch.stack([logits.reshape(-1).float(), targets.float()], dim=1)
            logging_output[PAIRS] = pairs.cpu()
            self._check_gather_size(logging_output, sample_size)
        elif logits.size(-1) == 2:
            preds = logits.argmax(dim=-1)
            counts = glue_metrics.confusion_counts(preds.cpu().numpy(), targets.cpu().numpy())
            logging_output.update(zip(COUNTS, counts, strict=False))
        return loss, sample_size, logging_output

    def _check_gather_size(self, logging_output, sample_size):
        """Fail clearly where ``all_gather_list`` would fail with "exceeds max_size"."""
        if distributed_utils.get_data_parallel_world_size() == 1:
            return
        gathered = utils.move_to_cpu([[logging_output], sample_size])  # as the trainer sends
        size = GATHER_HEADER + len(pickle.dumps(gathered))
        if size > self.all_gather_list_size:
            raise ConfigError(
                f"sentence_prediction_metrics: a validation batch of {sample_size} "
                f"regression examples needs {size} bytes to be gathered between workers, "
                f"more than --all-gather-list-size {self.all_gather_list_size}; raise "
                f"--all-gather-list-size or lower --batch-size / --max-tokens (valid)."
            )

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        """Log the parent's metrics, then the GLUE metrics of evaluation outputs."""
        super().reduce_metrics(logging_outputs)
        if any("tp" in log for log in logging_outputs):
            for key in COUNTS:
                total = int(sum(log.get(key, 0) for log in logging_outputs))
                metrics.log_scalar_sum("_" + key, total)
            for name, metric in glue_metrics.BINARY_METRICS.items():
                metrics.log_derived(name, functools.partial(_from_counts, metric), PRIORITY)
        blocks = [log[PAIRS] for log in logging_outputs if PAIRS in log]
        if blocks:
            pairs = torch.cat(blocks).numpy()
            for agg in _temporary_aggregators():
                for name, metric in glue_metrics.REGRESSION_METRICS.items():
                    if name not in agg:
                        agg.add_meter(name, glue_metrics.PredictionMeter(metric), PRIORITY)
                    agg[name].update(pairs)

    def logging_outputs_can_be_summed(self) -> bool:
        """Summable (fast stat sync) except in evaluation with ``--regression-target``,
        whose per-example rows must be gathered, not summed."""
        return not (self.regression_target and not self.training)
