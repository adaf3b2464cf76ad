"""Request -> plan: a ``RunConfig`` resolved into the run's configuration (config.json), folder and
commands, printing nothing it is not asked to (``log``) and starting nothing but the data's preparation
(``check`` first refuses, in one line, a request that cannot run). Seams: ``backbone`` and ``data``
given (``check_gpu``'s synthetic runs) replace finding and preparing them."""

import dataclasses
import re
import sys
import time
from pathlib import Path
from typing import Any, Optional

from fairseq_idpg.errors import ConfigError, RunError
from fairseq_idpg.run.backbone import find_backbone, sha256, weights_sha256
from fairseq_idpg.run.budget import budget_line, decide_budget, lr_and_batch
from fairseq_idpg.run.command import check_train_command, train_command
from fairseq_idpg.run.identity import canonical_extra_args, config_hash, model_settings, run_name
from fairseq_idpg.run.prepared import data_for
from fairseq_idpg.run_config import RunConfig, canonical_task


def warn_missing(missing, prog):
    """A dry run's last word when a run could not start: every missing file and folder, one line (exit status 0:
    the plan and its budget stand)."""
    if missing:
        print(f"{prog}: warning: not ready to run: {'; '.join(dict.fromkeys(missing))}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Plan:
    """One run, decided but not started: its configuration, folder and commands."""

    request: RunConfig
    argv: list  # run.sh's command line, for the logs and the record
    task: str
    method: Any
    config: dict
    folder: Path  # the run folder (its name holds "<hash>" until the model file and the prepared data exist)
    complete: bool  # the hash is known
    train: list  # the launcher + fairseq-train command
    data: Path
    model_dir: Path
    evals: list  # the dev/test splits fairseq-validate scores
    batch_size: int
    timings: dict
    start: float
    missing: list  # what a dry run found absent (model files, raw folders), one line each
    note: Optional[str] = None  # the run found under its earlier name (``earlier_folder``), said in one line
    memory: Optional[dict] = None  # the trainer's peak memory, once it has trained here (``execution.train``)
    ready: bool = False  # a dry plan that a run would make again as it is: nothing to build, fetch or prepare
    said: list = dataclasses.field(default_factory=list)  # what planning logged: (args, kwargs) of each line

    @property
    def finished(self):
        return self.complete and (self.folder / "results.json").is_file()

    def say_again(self, log=print):
        """Say what planning said (a plan made quietly by ``check``, used as it is)."""
        for args, kwargs in self.said:
            log(*args, **kwargs)


def plan(request, argv=None, log=print, *, backbone=None, data=None, folder=None):
    """Check the request, prepare the data if needed, and decide the run (``log`` says what it will be).
    Seams: a given ``backbone`` (``backbone_at``) and ``data`` (``prepared``) are used as they are, and then
    nothing is built, prepared or started; ``folder``: where the run writes (default: its run folder)."""
    request.validate()  # before anything is imported or run
    from fairseq_idpg.methods import METHODS

    said, say = [], log

    def log(*args, **kwargs):  # (kept: ``Plan.say_again``)
        said.append((args, kwargs))
        say(*args, **kwargs)

    method, task = METHODS[request.method], canonical_task(request.task)
    recipe, start, timings = method.recipe.for_task(task), time.time(), {}
    lr, batch, batch_size, update_freq = lr_and_batch(request, method, recipe)
    backbone = find_backbone(request) if backbone is None else backbone
    log(f"{task} | method {request.method} ({method.source}) | model {request.model} ({backbone.dir})", flush=True)
    data = data_for(request, task, backbone, log) if data is None else data
    if data.seconds is not None:
        timings["prepare"] = round(data.seconds, 1)
    budget = decide_budget(request, task, recipe, data, lr, batch, batch_size, update_freq)
    budget = dataclasses.replace(budget, head_lr=request.head_lr if request.head_lr is not None else recipe.head_lr)
    config = configuration(request, task, method, recipe, backbone, data, budget)
    # the hash covers the prepared rows (their count, what prepare_data.py recorded): known once they exist
    complete = backbone.present and data.info is not None and data.provenance is not None
    name = run_name(lr, request.seed, config_hash(config) if complete else "<hash>")
    save = Path(request.work_dir) / "checkpoints" / backbone.name / task / request.method / name
    note = None
    if folder is not None:
        save = Path(folder)
    elif complete:  # its own run folder, perhaps found under the name it had before
        config, save, note = earlier_folder(request, config, save, lr)
    if note:
        log(note)
    train = train_command(request, method, recipe, backbone, data.folder, budget, save)
    log(f"budget: {budget_line(budget, recipe, request.extra_args)}")
    log(f"run folder: {save}", flush=True)
    scored = budget.evals + [s for s in budget.splits if re.fullmatch(r"test\d*", s)]
    argv = request.argv() if argv is None else argv
    missing = [*backbone.missing, *data.missing]
    ready = complete and backbone.present and data.ready and not missing
    return Plan(request, argv, task, method, config, save, complete, train, data.folder, backbone.dir, scored,
                batch_size, timings, start, missing, note, ready=ready, said=said)  # fmt: skip


def earlier_folder(request, config, save, lr):
    """(config, folder, note) of the run planned as ``config`` in ``save``: where its folder was named before
    config.json's ``extra_args`` left out the flags that change nothing (``canonical_extra_args``), the folder
    of the same configuration with its extra flags as given, when ``save`` does not exist and that one holds the
    run (finished, or checkpoints to resume): it goes on there, so that no finished run is trained again, and
    the note says so. Otherwise (config, save, None)."""
    given = list(request.extra_args)
    if config["extra_args"] == given or save.exists():
        return config, save, None
    before = {**config, "extra_args": given}
    earlier = save.with_name(run_name(lr, request.seed, config_hash(before)))
    if not ((earlier / "results.json").is_file() or any(earlier.glob("checkpoint*.pt"))):
        return config, save, None
    note = f"note: found under its earlier name {earlier} (named before flags that change nothing were left out)"
    return before, earlier, note


def check(request, argv=None):
    """Refuse, in one line (RunError) and before anything is prepared or written, a request that cannot run:
    its values, what is missing (every model file and raw folder at once), and the fairseq-train command it
    makes (``check_train_command``), with the budget a dry run shows. Returns the request's dry plan, made
    quietly (``Plan.say_again`` says it), whose ``missing`` is what a dry run lacks (every missing file and
    folder, one line each; [] when the request can run); a run uses it as it is when it is ``ready``
    (``planned``)."""
    if request.model == "standin" and not request.dry_run:
        find_backbone(request)  # built when missing (a fresh clone): its vocab.txt prepares the data
    p = plan(dataclasses.replace(request, dry_run=True), argv, log=quiet)
    if p.missing and not request.dry_run:
        raise RunError("; ".join(p.missing))
    have_model = all((p.model_dir / name).is_file() for name in ("model.pt", "dict.txt"))
    try:
        check_train_command(p.train, p.model_dir / "dict.txt" if have_model else None)
    except ConfigError as e:
        missing_file = isinstance(e, FileNotFoundError) or isinstance(e.__context__, FileNotFoundError)
        if not (request.dry_run and missing_file):
            raise RunError(str(e)) from None
        p.missing.append(str(e))  # a file the method needs (GloVe vectors): listed like the model's
    return p


def planned(request, checked, argv=None):
    """The plan of ``request``, for which ``check`` returned ``checked``, saying what planning says: ``checked``
    (holding ``request``) for a dry run, or when a run would make it again as it is (``ready``); else the run's
    own plan, which builds, fetches or prepares what ``checked`` found missing. One plan per request where nothing
    is missing."""
    if request.dry_run or checked.ready:
        checked.say_again()
        return dataclasses.replace(checked, request=request)  # checked's request is the dry copy ``check`` planned
    return plan(request, argv)


def hash_note(plans):
    """A dry run's line under run folders named ``<hash>`` (a name is printed only when it is the one the run
    gets: its hash covers the prepared rows, which a dry run does not prepare), or None when every name is known."""
    if all(p.complete for p in plans):
        return None
    return "(<hash> is known once the model file and the prepared data exist)"


def quiet(*args, **kwargs):
    """A ``log`` that says nothing (a sweep plans hundreds of runs)."""


def configuration(request, task, method, recipe, backbone, data, budget):
    """config.json: everything that defines the run (``config_hash`` names its folder by it)."""
    model_file = backbone.dir / "model.pt"
    return {
        "task": task,
        "method": {"name": method.name, "arch": method.arch, "task": method.task, "options": dict(method.options),
                   "frozen_backbone": method.frozen_backbone, "settings": model_settings(method)},
        "model": {"name": request.model, "path": str(model_file.resolve()),
                  "sha256": sha256(model_file) if backbone.present else None,
                  "dict_sha256": sha256(backbone.dir / "dict.txt") if backbone.present else None,
                  "weights_sha256": weights_sha256(model_file) if backbone.present else None},
        "data": {"folder": str(data.folder), "provenance": data.provenance,
                 "extra": dict(data.info.extra) if data.info is not None else {},  # e.g. a doubled train set
                 "train_examples": budget.train_examples},
        "seed": request.seed, "lr": budget.lr, "batch": budget.batch, "epochs": budget.epochs,
        "updates": budget.updates, "scheduler": recipe.scheduler,
        "warmup": recipe.warmup if recipe.scheduler == "polynomial_decay" else 0.0,
        "warmup_updates": budget.warmup_updates, "clip_norm": recipe.clip_norm, "dropout": recipe.dropout,
        "weight_decay": recipe.weight_decay, "select_on": budget.select, "valid_subset": budget.valid_subset,
        "metric": budget.metric, "max_tokens": request.max_tokens, "fp16": request.fp16,
        "extra_args": canonical_extra_args(method, request.extra_args),  # less the flags that change nothing
        "layout": {"nproc": request.nproc, "batch_size": budget.batch_size, "update_freq": budget.update_freq},
        **({"head_lr": budget.head_lr} if budget.head_lr is not None else {}),  # added since: hashed only when set
        **request.config_options(),  # options added since: hashed only when not at their default
    }  # fmt: skip
