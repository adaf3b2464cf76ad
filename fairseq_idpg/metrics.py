"""The GLUE metrics of the papers, as plain numpy/scipy functions, and the meter that
collects per-example regression predictions for them.

All scores are in percent (x 100), as fairseq logs accuracy. Degenerate inputs give 0
instead of NaN, with no warning (the conventions of scikit-learn's ``zero_division=0``):

- ``f1``: 0 when there is no true and no predicted positive (2 tp + fp + fn = 0);
- ``mcc``: 0 when a row or column of the confusion matrix is empty, e.g. every prediction
  (or every label) is one class;
- ``pearson`` / ``spearman``: 0 with fewer than 2 examples or when predictions or targets
  are constant (the correlation is undefined there).

The criterion that logs them is ``fairseq_idpg/criterions/sentence_prediction_metrics.py``
(see ``docs/metrics.md``).
"""

import math

import numpy as np
from fairseq.logging.meters import Meter


def confusion_counts(preds, targets):
    """``(tp, fp, fn, tn)`` as Python ints for binary predictions; positive = label 1."""
    preds = np.asarray(preds).reshape(-1) == 1
    targets = np.asarray(targets).reshape(-1) == 1
    tp = int(np.sum(preds & targets))
    fp = int(np.sum(preds & ~targets))
    fn = int(np.sum(~preds & targets))
    return tp, fp, fn, int(preds.size) - tp - fp - fn


def accuracy(tp, fp, fn, tn):
    """Accuracy x 100 from the binary confusion counts (0 for no examples)."""
    total = tp + fp + fn + tn
    return 100.0 * (tp + tn) / total if total else 0.0


def f1(tp, fp, fn, tn=0):
    """F1 of the positive class x 100: ``2 tp / (2 tp + fp + fn)``; 0 when undefined."""
    denominator = 2 * tp + fp + fn
    return 100.0 * 2 * tp / denominator if denominator else 0.0


def acc_and_f1(tp, fp, fn, tn):
    """Mean of accuracy and F1, both x 100 (MRPC, QQP)."""
    return (accuracy(tp, fp, fn, tn) + f1(tp, fp, fn)) / 2


def mcc(tp, fp, fn, tn):
    """Matthews correlation x 100 (CoLA); 0 when a confusion-matrix margin is empty."""
    tp, fp, fn, tn = (float(c) for c in (tp, fp, fn, tn))  # products overflow int64
    denominator = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
    return 100.0 * (tp * tn - fp * fn) / math.sqrt(denominator) if denominator else 0.0


def _correlation(fn, preds, targets):
    preds = np.asarray(preds, dtype=np.float64).reshape(-1)
    targets = np.asarray(targets, dtype=np.float64).reshape(-1)
    if preds.size < 2 or np.ptp(preds) == 0 or np.ptp(targets) == 0:
        return 0.0
    return 100.0 * float(fn(preds, targets)[0])


def pearson(preds, targets):
    """Pearson correlation x 100 (``scipy.stats.pearsonr``); 0 when undefined."""
    from scipy import stats  # here, not at the top: importing scipy.stats costs every fairseq process 0.5 s

    return _correlation(stats.pearsonr, preds, targets)


def spearman(preds, targets):
    """Spearman rank correlation x 100 (``scipy.stats.spearmanr``); 0 when undefined."""
    from scipy import stats

    return _correlation(stats.spearmanr, preds, targets)


def pearson_and_spearman(preds, targets):
    """Mean of Pearson and Spearman, both x 100 (STS-B)."""
    return (pearson(preds, targets) + spearman(preds, targets)) / 2


BINARY_METRICS = {"f1": f1, "acc_and_f1": acc_and_f1, "mcc": mcc}
REGRESSION_METRICS = {
    "pearson": pearson,
    "spearman": spearman,
    "pearson_and_spearman": pearson_and_spearman,
}


class PredictionMeter(Meter):
    """Concatenates ``(n, 2)`` blocks of ``[prediction, target]`` rows and reports
    ``metric(predictions, targets)`` over all of them, rounded to ``round`` digits.

    Its class is not one of ``fairseq.logging.meters``, so a ``MetersDict`` holding it
    cannot be reloaded from a checkpoint: log it only into temporary aggregators (the
    criterion does).
    """

    def __init__(self, metric=pearson, round=2):
        self.metric = metric
        self.round = round
        self.reset()

    def reset(self):
        self.blocks = []

    def update(self, pairs):
        self.blocks.append(np.asarray(pairs, dtype=np.float32).reshape(-1, 2))

    @property
    def pairs(self):
        """All ``[prediction, target]`` rows so far, float32, shape ``(n, 2)``."""
        return np.concatenate(self.blocks) if self.blocks else np.zeros((0, 2), np.float32)

    @property
    def smoothed_value(self) -> float:
        pairs = self.pairs
        value = self.metric(pairs[:, 0], pairs[:, 1])
        return round(value, self.round) if self.round is not None else value
