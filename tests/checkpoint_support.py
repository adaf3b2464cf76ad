"""Checks of compact checkpoints, shared by the tests of the frozen-backbone models (test_prefix.py,
test_adapters.py, test_inducer.py, test_frozen_roberta.py, test_hub.py). No tests here.

- ``resume_matches_uninterrupted``: a model trained k steps, saved (model state + fairseq's Adam
  and lr-scheduler state, through a file), loaded into a freshly built model and trained on, ends
  with the same tensors as the model trained without the interruption (in-process, tiny backbone).
- ``assert_compact_and_resumable``: what fairseq-train wrote holds only the trained tensors and the
  backbone fingerprint, and checkpoint_last.pt's optimizer state loads into the optimizer fairseq's
  trainer builds on resume.
- ``hub`` (``RobertaModel.from_pretrained`` of a run), ``hub_dev_accuracy`` (its accuracy on the raw
  dev sentences), ``assert_hub_agrees_with_validation`` (on a few dev examples, the hub reproduces
  the prepared tokens and the predictions of the model fairseq-validate loads).
- ``fairseq_train``: fairseq-train's own ``main`` in this process (test_hub.py, test_sizes.py).
"""

import types
from pathlib import Path

import torch
import torch.nn.functional as F
from conftest import REPO, STANDIN  # noqa: F401 (re-exported to the test files)

from fairseq_idpg.models.frozen_roberta import FINGERPRINT_KEY

TOKENS = torch.tensor([[0, 5, 6, 7, 8, 2], [0, 9, 10, 2, 1, 1]])  # one padded row
TARGET = torch.tensor([0, 1])
HEAD = "sentence_classification_head"  # the head fairseq-train registers (--classification-head-name)


# ---------------------------------------------------------------------------------------- in-process resume
def fairseq_adam(model, lr=1e-2, total=10, head_lr=None, weight_decay=0.1):
    """fairseq's Adam (the run.sh settings) over the model's trained tensors, in the order fairseq's
    trainer hands them over, and its polynomial-decay scheduler; ``head_lr``: ``--optimizer adam_head_lr``
    with the head (marked as the task marks it) at that lr."""
    from fairseq.optim.adam import FairseqAdam
    from fairseq.optim.lr_scheduler.polynomial_decay_schedule import PolynomialDecayLRSchedule

    from fairseq_idpg.optim import AdamHeadLr, mark_head

    params = [p for p in mark_head(model).parameters() if p.requires_grad]
    cfg = types.SimpleNamespace(
        lr=[lr], weight_decay=weight_decay, adam_betas="(0.9, 0.98)", adam_eps=1e-6, tpu=False, fp16_adam_stats=False,
        head_lr=head_lr,
    )  # fmt: skip
    optimizer = FairseqAdam(cfg, params) if head_lr is None else AdamHeadLr(cfg, params)
    schedule = types.SimpleNamespace(
        lr=[lr], warmup_updates=2, total_num_update=total, end_learning_rate=0.0, power=1.0, force_anneal=None
    )
    return optimizer, PolynomialDecayLRSchedule(schedule, optimizer)


def train_steps(model, optimizer, scheduler, updates):
    """Steps ``updates`` (update numbers) in train mode; each reseeds as fairseq's trainer does
    (``utils.torch_seed(seed, num_updates)``), so dropout masks depend on the update only."""
    model.train()
    for update in updates:
        torch.manual_seed(1000 + update)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(TOKENS, classification_head_name="head")[0], TARGET)
        optimizer.backward(loss)
        optimizer.step()
        scheduler.step_update(update + 1)


def resume_matches_uninterrupted(build, path, steps=3, more=3, **adam):
    """``build(seed)`` -> a model with head "head"; returns the saved checkpoint's model state. ``adam``:
    ``fairseq_adam``'s options (``head_lr``: the resumed run's lrs are checked too)."""
    model = build(0)
    optimizer, scheduler = fairseq_adam(model, **adam)
    train_steps(model, optimizer, scheduler, range(steps))
    # what fairseq's trainer saves: model state, optimizer state, lr-scheduler state, update count
    torch.save(
        {
            "model": model.state_dict(),
            "last_optimizer_state": optimizer.state_dict(),
            "lr_scheduler_state": scheduler.state_dict(),
            "num_updates": steps,
        },
        path,
    )
    train_steps(model, optimizer, scheduler, range(steps, steps + more))

    state = torch.load(path, map_location="cpu", weights_only=False)
    resumed = build(1)  # other random weights: everything trained must come from the file
    resumed.load_state_dict(state["model"])
    # as Trainer.load_checkpoint: the optimizer is rebuilt after the model is loaded, then restored
    resumed_optimizer, scheduler = fairseq_adam(resumed, **adam)
    scheduler.load_state_dict(state["lr_scheduler_state"])
    resumed_optimizer.load_state_dict(state["last_optimizer_state"])
    scheduler.step_update(state["num_updates"])
    train_steps(resumed, resumed_optimizer, scheduler, range(steps, steps + more))
    assert [g["lr"] for g in resumed_optimizer.param_groups] == [g["lr"] for g in optimizer.param_groups]

    expected, got = dict(model.named_parameters()), dict(resumed.named_parameters())
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), f"{name} differs after resuming"
    return state["model"]


# ---------------------------------------------------------------------------------------- what fairseq-train wrote
def load_trained(checkpoint, **overrides):
    """(model in eval mode, cfg, task) of a fairseq checkpoint, as fairseq-validate loads it."""
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides=overrides)
    return models[0].eval(), cfg, task


def assert_compact_and_resumable(save, updates):
    """checkpoint_best.pt and checkpoint_last.pt in ``save`` hold exactly the trained tensors, the
    method's persistent buffers (one with ``persistent=False`` is rebuilt from the options: docs/architecture.md,
    the frozen-buffer rule) and the fingerprint; checkpoint_last.pt is at ``updates`` and its optimizer
    state loads into the optimizer fairseq's trainer builds over the trained tensors on resume."""
    from fairseq import optim

    model, cfg, _ = load_trained(save / "checkpoint_last.pt")
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    parameters = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    buffers = set(model.state_dict(full=True)) - parameters - model.backbone_names  # the persistent ones
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        state = torch.load(save / name, map_location="cpu", weights_only=False)
        assert set(state["model"]) == set(trained) | buffers | {FINGERPRINT_KEY}, f"{name}: not only trained tensors"
        assert all(state["model"][n].shape == p.shape for n, p in trained.items())
    last = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert last["optimizer_history"][-1]["num_updates"] == updates
    optimizer = optim.build_optimizer(cfg.optimizer, list(trained.values()))
    optimizer.load_state_dict(last["last_optimizer_state"])  # raises when the tensors differ
    moments = [optimizer.optimizer.state[p]["exp_avg"] for p in trained.values()]
    assert [m.shape for m in moments] == [p.shape for p in trained.values()]
    assert any(m.abs().sum() > 0 for m in moments)


def forget_best_score():
    """Drop the best validation score fairseq keeps on ``checkpoint_utils.save_checkpoint.best``
    across trainings in one process: an in-process fairseq-train must start as a new process does,
    or it writes no checkpoint_best.pt unless it beats an earlier training's score."""
    from fairseq import checkpoint_utils

    if hasattr(checkpoint_utils.save_checkpoint, "best"):
        del checkpoint_utils.save_checkpoint.best


def fairseq_train(argv):
    """fairseq-train's ``cli_main`` without the interpreter start: parse, then ``main``, from the
    state a new process has."""
    from fairseq import distributed_utils, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train

    forget_best_score()
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    distributed_utils.call_main(convert_namespace_to_omegaconf(args), train.main)


def hub(save, checkpoint="checkpoint_best.pt", data=None, **overrides):
    """``RobertaModel.from_pretrained`` of a run (docs/using.md) with the stand-in's WordPiece; ``data``:
    the prepared folder (default: the one recorded in the checkpoint)."""
    from fairseq.models.roberta import RobertaModel

    if data is None:
        data = torch.load(save / checkpoint, map_location="cpu", weights_only=False)["cfg"]["task"]["data"]
    return RobertaModel.from_pretrained(
        str(save),
        checkpoint,
        data_name_or_path=str(data),
        user_dir=str(REPO / "fairseq_idpg"),
        bpe="wordpiece",
        wordpiece_vocab=str(STANDIN / "vocab.txt"),
        **overrides,
    ).eval()


def hub_dev_predictions(roberta, task_name, raw, count=None):
    """(predicted label names, examples) of the hub ``roberta`` on the first ``count`` examples (all
    by default) of the raw dev file in ``raw`` (GLUE layout), from the sentences."""
    from fairseq.data.data_utils import collate_tokens

    from fairseq_idpg.preprocessing.formats import get_task

    spec = get_task(task_name)
    examples = spec.read(Path(raw) / spec.files[1])[:count]
    labels = roberta.task.label_dictionary
    predicted = []
    with torch.no_grad():
        for start in range(0, len(examples), 32):
            tokens = [roberta.encode(*ex.texts) for ex in examples[start : start + 32]]
            logits = roberta.predict(HEAD, collate_tokens(tokens, pad_idx=roberta.task.dictionary.pad()))
            predicted += [labels.string([int(i) + labels.nspecial]) for i in logits.argmax(-1)]
    return predicted, examples


def hub_dev_accuracy(save, task_name, raw, checkpoint="checkpoint_best.pt", **overrides):
    """Accuracy (%) of the hub of ``save`` on the whole raw dev file (as fairseq-validate scores it)."""
    predicted, examples = hub_dev_predictions(hub(save, checkpoint, **overrides), task_name, raw)
    return 100.0 * sum(p == ex.label for p, ex in zip(predicted, examples, strict=False)) / len(examples)


def assert_hub_agrees_with_validation(save, task_name, raw, count=32):
    """On the first ``count`` dev examples, the hub (raw sentences, its tokenizer) predicts what the
    model fairseq-validate loads predicts on the prepared dev rows, whose tokens the hub reproduces."""
    roberta = hub(save)
    predicted, examples = hub_dev_predictions(roberta, task_name, raw, count)
    model, cfg, task = load_trained(save / "checkpoint_best.pt")
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    batch = dataset.collater([dataset[i] for i in range(count)])
    for row, example in zip(batch["net_input"]["src_tokens"], examples, strict=False):
        assert torch.equal(row[row.ne(task.dictionary.pad())], roberta.encode(*example.texts))
    with torch.no_grad():
        logits = model(**batch["net_input"], features_only=True, classification_head_name=HEAD)[0]
    labels = task.label_dictionary
    assert predicted == [labels.string([int(i) + labels.nspecial]) for i in logits.argmax(-1)]
