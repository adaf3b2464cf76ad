"""A run's optimisation: lr, effective batch and its device layout, updates (explicit flags, then the
method's recipe: epochs over the prepared train set; the stand-in's smoke budget), warmup, selection."""

import dataclasses
import re
from typing import Optional

from fairseq_idpg.errors import RunError, flag_value

STANDIN_UPDATES = 300  # the stand-in's smoke budget (a CPU can run it)


STANDIN_FINETUNE_LR = 5e-5  # full fine-tuning of the 22M stand-in; roberta.* use fairseq's table


SPLIT_NAMES = {"valid": "dev", "valid1": "second dev set (MNLI: dev-mismatched)"}


@dataclasses.dataclass(frozen=True)
class Budget:
    """The optimisation of one run: the recipe's, explicit flags first."""

    lr: float
    batch: int  # effective, per update
    batch_size: int  # per device
    update_freq: int
    train_examples: int
    epochs: Optional[float]  # None: the updates were given (or the stand-in's smoke budget)
    updates: int
    warmup_updates: int
    splits: list  # the prepared data's
    select: str  # the dev split that picks checkpoint_best
    metric: str
    regression: bool
    num_outputs: int
    head_lr: Optional[float] = None  # the classification head's own lr (None: --lr trains everything)

    @property
    def evals(self):
        return [s for s in self.splits if re.fullmatch(r"valid\d*", s)]

    @property
    def valid_subset(self):
        return [self.select] + [s for s in self.evals if s != self.select]


def lr_and_batch(request, method, recipe):
    """(lr, effective batch, per-device batch, update freq): explicit flags, else the recipe's (the
    stand-in fine-tunes at its own lr)."""
    from fairseq_idpg.launch import layout

    if request.lr is not None:
        lr = request.lr
    elif request.model == "standin" and not method.frozen_backbone:
        lr = STANDIN_FINETUNE_LR
    else:
        lr = recipe.lr
    if lr is None:
        raise RunError(f"the {request.method} recipe has no lr for {request.task}; give --lr")
    batch = request.total_batch if request.total_batch is not None else recipe.batch
    if batch is None:
        raise RunError(f"the {request.method} recipe has no batch for {request.task}; give --total-batch")
    try:
        return (lr, batch, *layout(batch, request.nproc, request.batch_size, request.update_freq))
    except ValueError as e:
        raise RunError(str(e)) from None


def decide_budget(request, task, recipe, data, lr, batch, batch_size, update_freq):
    """The updates (explicit flags first, then the recipe's epochs over the train set; the stand-in's
    smoke budget), the warmup, and the dev split that selects checkpoint_best."""
    from fairseq_idpg.preprocessing import get_task

    info, spec = data.info, get_task(task)
    if info is not None:
        train_examples, splits = info.splits["train"], list(info.splits)
    else:
        sampled = request.few_shot is not None or request.dev_from_train is not None
        train_examples = (
            request.few_shot if request.few_shot is not None else spec.sizes[0] - (request.dev_from_train or 0)
        )
        evals = ["valid"] if sampled else ["valid" + (str(i) if i else "") for i in range(len(spec.files) - 1)]
        # split-dev: each dev file's other half is scored, as test{i} (prepare's make_splits)
        tests = [s.replace("valid", "test", 1) for s in evals] if request.split_dev else []
        splits = ["train", *evals, *tests]
    epochs = None
    if request.max_update is not None:
        updates = request.max_update
    elif request.epochs is not None:
        epochs = request.epochs
        updates = dataclasses.replace(recipe, batch=batch, epochs=epochs, updates=None).num_updates(train_examples)
    elif request.model == "standin":
        updates = STANDIN_UPDATES
    else:
        updates = dataclasses.replace(recipe, batch=batch).num_updates(train_examples)
        epochs = None if recipe.updates is not None else recipe.epochs
    warmup = int(recipe.warmup * updates) if recipe.scheduler == "polynomial_decay" else 0
    evals = [s for s in splits if re.fullmatch(r"valid\d*", s)]
    source = info if info is not None else spec
    return Budget(
        lr, batch, batch_size, update_freq, train_examples, epochs, updates, warmup, splits,
        select=recipe.select_on if recipe.select_on in evals else "valid", metric=source.metric,
        regression=source.regression, num_outputs=info.num_outputs if info is not None else spec.num_classes,
    )  # fmt: skip


def budget_line(budget, recipe, extra=()):
    """The budget line: batch and its layout, epochs and updates, lr and schedule, selection; a setting that a
    fairseq flag in ``extra`` overrides shows the flag's value, marked "(given)"."""
    b, decay = budget, recipe.scheduler == "polynomial_decay"
    overridden = [f for f in ("--lr-scheduler", "--warmup-updates") if flag_value(extra, f) is not None]

    def setting(name, flag, value):
        said = flag_value(extra, flag)
        return f"{name} {value}" if said is None else f"{name} {said} (given)"

    return (
        f"batch {b.batch} ({b.batch_size} per device x {b.batch // b.batch_size // b.update_freq} device(s) x "
        f"update-freq {b.update_freq}), "
        + (f"{b.epochs:g} epochs of {b.train_examples:,} examples = " if b.epochs is not None else "")
        + f"{b.updates:,} updates, lr {b.lr:g}"
        + (f", head lr {b.head_lr:g}" if b.head_lr is not None else "")
        + f" ({recipe.scheduler}"
        + (f", warmup {recipe.warmup:.0%} = {b.warmup_updates:,} updates" if decay else "")
        + f"), {setting('clip', '--clip-norm', recipe.clip_norm)}, "
        + f"{setting('weight decay', '--weight-decay', f'{recipe.weight_decay:g}')}, "
        + f"{setting('dropout', '--dropout', f'{recipe.dropout:g}')}, "
        + f"selection on {b.select} ({SPLIT_NAMES.get(b.select, b.select)}) by {b.metric}"
        + (f" (flags given override {', '.join(overridden)})" if overridden else "")
    )
