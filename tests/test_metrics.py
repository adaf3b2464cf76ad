"""The GLUE metrics (``fairseq_idpg/metrics.py``) and ``--criterion
sentence_prediction_metrics``: exact corpus-level values through fairseq's own validation
paths (``Trainer._aggregate_logging_outputs`` / ``_reduce_and_log_stats``) with one and two
simulated workers, and checkpoint reloading of the metrics state. Fast: no training."""

import copy
import json
import pickle
import warnings
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fairseq import utils
from fairseq.distributed import utils as distributed_utils
from fairseq.logging import metrics
from fairseq.logging.progress_bar import format_stat
from fairseq.tasks import FairseqTask
from fairseq.trainer import Trainer
from omegaconf import OmegaConf
from scipy import stats

import fairseq_idpg  # noqa: F401  (registers the criterion)
from fairseq_idpg import metrics as glue
from fairseq_idpg.criterions.sentence_prediction_metrics import (
    SentencePredictionMetricsConfig,
    SentencePredictionMetricsCriterion,
)

HEAD = "sentence_classification_head"
BINARY_KEYS = ("accuracy", "f1", "acc_and_f1", "mcc")
REGRESSION_KEYS = ("pearson", "spearman", "pearson_and_spearman")


# ------------------------------------------------------------------ metric functions
def numpy_f1(preds, targets):
    """F1 as the harmonic mean of precision and recall."""
    precision = np.mean(targets[preds == 1] == 1)
    recall = np.mean(preds[targets == 1] == 1)
    return 100 * 2 * precision * recall / (precision + recall)


def numpy_mcc(preds, targets):
    """MCC is the Pearson correlation of the two 0/1 vectors."""
    return 100 * np.corrcoef(preds, targets)[0, 1]


@pytest.mark.parametrize("seed", range(5))
def test_binary_metrics_match_direct_formulas(seed):
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, 2, 200)
    preds = np.where(rng.random(200) < 0.7, targets, 1 - targets)
    counts = glue.confusion_counts(preds, targets)
    assert counts == tuple(int(np.sum((preds == p) & (targets == t))) for p, t in ((1, 1), (1, 0), (0, 1), (0, 0)))
    accuracy = 100 * np.mean(preds == targets)
    assert glue.accuracy(*counts) == pytest.approx(accuracy)
    assert glue.f1(*counts) == pytest.approx(numpy_f1(preds, targets))
    assert glue.mcc(*counts) == pytest.approx(numpy_mcc(preds, targets))
    assert glue.acc_and_f1(*counts) == pytest.approx((accuracy + numpy_f1(preds, targets)) / 2)


def test_binary_metrics_hand_worked():
    counts = glue.confusion_counts([1, 1, 0, 0, 1], [1, 0, 0, 1, 1])
    assert counts == (2, 1, 1, 1)  # tp, fp, fn, tn
    assert glue.accuracy(*counts) == pytest.approx(60.0)
    assert glue.f1(*counts) == pytest.approx(100 * 4 / 6)  # 2 tp / (2 tp + fp + fn)
    assert glue.mcc(*counts) == pytest.approx(100 / 6)  # (2 - 1) / sqrt(3 * 3 * 2 * 2)
    assert glue.acc_and_f1(*counts) == pytest.approx((60 + 400 / 6) / 2)
    # perfect and inverted predictions
    assert glue.mcc(3, 0, 0, 5) == pytest.approx(100.0)
    assert glue.mcc(0, 5, 3, 0) == pytest.approx(-100.0)
    assert glue.f1(3, 0, 0, 5) == pytest.approx(100.0)
    # counts whose MCC denominator overflows int64
    assert glue.mcc(10**5, 10**5, 10**5, 10**5) == 0.0


def test_degenerate_cases_give_zero_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        only_negative = glue.confusion_counts([0, 0, 0, 0], [0, 1, 0, 1])
        assert glue.f1(*only_negative) == 0.0 and glue.mcc(*only_negative) == 0.0
        only_positive = glue.confusion_counts([1, 1, 1], [0, 1, 1])
        assert glue.mcc(*only_positive) == 0.0
        assert glue.f1(*only_positive) == pytest.approx(80.0)
        assert glue.f1(0, 0, 0, 7) == 0.0 and glue.accuracy(0, 0, 0, 0) == 0.0
        for fn in (glue.pearson, glue.spearman, glue.pearson_and_spearman):
            assert fn([], []) == 0.0
            assert fn([0.5], [1.0]) == 0.0
            assert fn([1.0, 1.0, 1.0], [0.0, 1.0, 2.0]) == 0.0
            assert fn([0.0, 1.0, 2.0], [3.0, 3.0, 3.0]) == 0.0


@pytest.mark.parametrize("seed", range(3))
def test_correlations_match_scipy(seed):
    rng = np.random.default_rng(seed)
    targets = rng.uniform(0, 5, 300)
    preds = targets + rng.normal(0, 1.5, 300)
    pearson = 100 * stats.pearsonr(preds, targets)[0]
    spearman = 100 * stats.spearmanr(preds, targets)[0]
    assert glue.pearson(preds, targets) == pytest.approx(pearson)
    assert glue.pearson(preds, targets) == pytest.approx(100 * np.corrcoef(preds, targets)[0, 1])
    assert glue.spearman(preds, targets) == pytest.approx(spearman)
    assert glue.pearson_and_spearman(preds, targets) == pytest.approx((pearson + spearman) / 2)


def test_prediction_meter_concatenates():
    meter = glue.PredictionMeter(glue.spearman, round=None)
    meter.update(torch.tensor([[0.1, 1.0], [0.3, 2.0]]))
    meter.update(np.array([[0.2, 3.0]], dtype=np.float32))
    assert meter.pairs.dtype == np.float32 and meter.pairs.shape == (3, 2)
    assert meter.smoothed_value == pytest.approx(50.0)  # ranks (1, 3, 2) vs (1, 2, 3)
    meter.reset()
    assert meter.smoothed_value == 0.0


# ------------------------------------------------------------------ the criterion
class StandIn(torch.nn.Module):
    """A model with a classification head; the inputs are the logits (identity head)."""

    def __init__(self):
        super().__init__()
        self.classification_heads = torch.nn.ModuleDict({HEAD: torch.nn.Identity()})
        self.args = SimpleNamespace()

    def forward(self, src_tokens, src_lengths, features_only, classification_head_name):
        assert features_only
        return self.classification_heads[classification_head_name](src_tokens), {}

    def get_targets(self, sample, net_output):
        return sample["target"]


def make_sample(logits, target):
    logits = torch.as_tensor(logits, dtype=torch.float32)
    return {
        "net_input": {"src_tokens": logits, "src_lengths": torch.ones(len(logits))},
        "target": torch.as_tensor(target),
        "ntokens": 10 * len(logits),
        "nsentences": len(logits),
    }


def classification_batches(seed, sizes):
    rng = np.random.default_rng(seed)
    batches = []
    for size in sizes:
        target = rng.integers(0, 2, size)
        logits = rng.normal(0, 1, (size, 2))
        logits[np.arange(size), target] += rng.normal(0.6, 1, size)  # better than chance
        batches.append(make_sample(logits, target))
    return batches


def regression_batches(seed, sizes):
    rng = np.random.default_rng(seed)
    batches = []
    for size in sizes:
        target = rng.uniform(0, 5, size)
        batches.append(make_sample((target + rng.normal(0, 1.5, size))[:, None], target))
    return batches


def criterion_for(regression, all_gather_list_size=16384):
    cfg = SentencePredictionMetricsConfig(regression_target=regression, all_gather_list_size=all_gather_list_size)
    return SentencePredictionMetricsCriterion(cfg, task=None).eval()


def direct(batches, regression):
    """The metrics computed at once on every example of *batches*."""
    logits = torch.cat([b["net_input"]["src_tokens"] for b in batches]).numpy()
    target = torch.cat([b["target"] for b in batches]).numpy()
    if regression:
        return {k: fn(logits[:, 0], target) for k, fn in glue.REGRESSION_METRICS.items()}
    counts = glue.confusion_counts(logits.argmax(-1), target)
    values = {k: fn(*counts) for k, fn in glue.BINARY_METRICS.items()}
    return dict(values, accuracy=glue.accuracy(*counts))


class _Task(FairseqTask):
    def __init__(self):  # only reduce_metrics and logging_outputs_can_be_summed are used
        pass


def minimal_trainer(criterion):
    """A ``Trainer`` with just what its logging-output paths read."""
    trainer = Trainer.__new__(Trainer)
    trainer.task, trainer._criterion = _Task(), criterion
    trainer.cfg = OmegaConf.create({"common": {"all_gather_list_size": 16384}})
    trainer.tpu, trainer.device, trainer._warn_once = False, torch.device("cpu"), set()
    return trainer


@pytest.fixture
def simulated_collectives(monkeypatch):
    """Replace fairseq's collectives by ones that combine what every simulated worker
    sent so far: call the trainer's sync once per worker, in rank order, and the last
    call returns what all workers receive."""
    sent = []

    def all_gather_list(data, group=None, max_size=16384):
        encoded = pickle.dumps(utils.move_to_cpu(data))
        assert 4 + len(encoded) <= max_size, "all_gather_list would fail"
        sent.append(encoded)
        return [pickle.loads(e) for e in sent]

    def all_reduce_dict(data, device, group):
        sent.append(data)
        return OrderedDict((k, sum(torch.as_tensor(d[k], dtype=torch.double) for d in sent)) for k in data)

    monkeypatch.setattr(distributed_utils, "all_gather_list", all_gather_list)
    monkeypatch.setattr(distributed_utils, "all_reduce_dict", all_reduce_dict)
    return sent


def validate(criterion, model, steps, sent=None):
    """fairseq-train's validation: *steps* is a list of per-worker lists of
    ``(sample, is_dummy)``; returns the smoothed values fairseq-train logs."""
    trainer = minimal_trainer(criterion)
    with metrics.aggregate(new_root=True) as agg:
        for step in steps:
            with metrics.aggregate("valid"):  # Trainer.valid_step's decorator
                with torch.no_grad():
                    outputs = [(criterion(model, s)[1:], dummy) for s, dummy in step]
                if len(step) == 1:  # one worker: no sync
                    (sample_size, log), _ = outputs[0]
                    logs = [log]
                else:
                    sent.clear()
                    for (sample_size, log), dummy in outputs:
                        logs, (sample_size,) = trainer._aggregate_logging_outputs(
                            [log], sample_size * (not dummy), ignore=dummy
                        )
                trainer._reduce_and_log_stats(logs, sample_size)
    return agg.get_smoothed_values()


def one_worker(batches):
    return [[(b, False)] for b in batches]


def two_workers(batches):
    """Batches dealt to 2 workers; the worker left without one runs a dummy batch."""
    steps = []
    for i in range(0, len(batches), 2):
        pair = batches[i : i + 2]
        steps.append([(b, False) for b in pair] + [(pair[0], True)] * (2 - len(pair)))
    return steps


def per_batch_mean(batches, regression):
    values = [direct([b], regression) for b in batches]
    return {k: np.mean([v[k] for v in values]) for k in values[0]}


@pytest.mark.parametrize("regression", [False, True])
def test_corpus_metrics_one_and_two_workers(regression, simulated_collectives):
    metrics.reset()
    batches = (regression_batches if regression else classification_batches)(0, [32, 7, 64, 5, 40])
    keys = REGRESSION_KEYS if regression else BINARY_KEYS
    expected = direct(batches, regression)
    averaged = per_batch_mean(batches, regression)
    assert any(abs(averaged[k] - expected[k]) > 1 for k in keys)  # the test can tell
    criterion, model = criterion_for(regression), StandIn().eval()
    assert criterion.logging_outputs_can_be_summed() is not regression
    for steps in (one_worker(batches), two_workers(batches)):
        values = validate(criterion, model, steps, simulated_collectives)
        for key in keys:
            digits = 1 if key == "accuracy" else 2
            assert values[key] == pytest.approx(expected[key], abs=0.51 * 10**-digits), key
        assert not any(k.startswith("_") or k in ("tp", "pred_target") for k in values)
    assert ("f1" in values) is not regression


def test_fairseq_validate_path_and_json_log():
    """fairseq-validate reduces all batches' logging outputs at once and logs each raw one."""
    for regression in (False, True):
        batches = (regression_batches if regression else classification_batches)(1, [9, 30])
        criterion, model = criterion_for(regression), StandIn().eval()
        logs = [criterion(model, b)[2] for b in batches]
        json.dumps({k: format_stat(v) for k, v in logs[0].items()})  # --log-format json
        with metrics.aggregate() as agg:
            _Task().reduce_metrics(logs, criterion)
        values = agg.get_smoothed_values()
        for key, value in direct(batches, regression).items():
            assert values[key] == pytest.approx(value, abs=0.051), key


def test_training_logs_stay_cheap():
    for regression in (False, True):
        criterion, model = criterion_for(regression).train(), StandIn().train()
        batch = (regression_batches if regression else classification_batches)(2, [8])[0]
        log = criterion(model, batch)[2]
        assert set(log) <= {"loss", "ntokens", "nsentences", "sample_size", "ncorrect"}
        assert criterion.logging_outputs_can_be_summed()
        with metrics.aggregate() as agg:
            _Task().reduce_metrics([log], criterion)
        assert not set(agg.get_smoothed_values()) & set(BINARY_KEYS[1:] + REGRESSION_KEYS)


def test_multi_class_logs_accuracy_only():
    batch = make_sample(np.eye(3)[[0, 1, 2, 2]], [0, 1, 2, 0])
    criterion, model = criterion_for(False), StandIn().eval()
    log = criterion(model, batch)[2]
    assert "tp" not in log
    with metrics.aggregate() as agg:
        _Task().reduce_metrics([log], criterion)
    assert agg.get_smoothed_values()["accuracy"] == 75.0


def test_checkpoint_metrics_state_reloads():
    """Training reduces, then validations (both kinds of task); metrics.state_dict(), as
    the trainer saves it, must reload, and validating after reloading still works."""
    metrics.reset()
    runs = []
    for regression in (False, True):
        criterion, model = criterion_for(regression), StandIn()
        batches = (regression_batches if regression else classification_batches)(3, [16, 16])
        with metrics.aggregate("train"), metrics.aggregate("train_inner"):
            log = criterion.train()(model.train(), batches[0])[2]
            minimal_trainer(criterion)._reduce_and_log_stats([log], 16)
        criterion.eval(), model.eval()
        keys = REGRESSION_KEYS if regression else BINARY_KEYS
        runs.append((criterion, model, batches, keys))
        runs[-1] += (validate(criterion, model, one_worker(batches)),)
    state = pickle.loads(pickle.dumps(metrics.state_dict()))  # as in the checkpoint
    assert set(state) >= {"default", "train", "train_inner", "valid"}
    metrics.reset()
    metrics.load_state_dict(copy.deepcopy(state))
    for criterion, model, batches, keys, before in runs:
        after = validate(criterion, model, one_worker(batches))
        assert {k: after[k] for k in keys} == {k: before[k] for k in keys}


def test_gather_size_limit(monkeypatch):
    criterion, model = criterion_for(True), StandIn().eval()
    for size in (32, 64):  # a batch fits the default --all-gather-list-size
        log = criterion(model, regression_batches(4, [size])[0])[2]
        assert 4 + len(pickle.dumps([[log], size])) < 16384 // 2
    monkeypatch.setattr(distributed_utils, "get_data_parallel_world_size", lambda: 2)
    criterion(model, regression_batches(4, [64])[0])
    with pytest.raises(ValueError, match="--all-gather-list-size 16384"):
        criterion(model, regression_batches(4, [3000])[0])
    criterion_for(True, all_gather_list_size=40000)(model, regression_batches(4, [3000])[0])
