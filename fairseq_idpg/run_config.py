"""One run's request, typed: ``RunConfig``, what ``scripts/run.sh`` is given and what a sweep's row is.

    request = RunConfig.from_argv(["RTE", "--method", "lora", "--seed", "2"])   # run.sh's arguments
    request = RunConfig("RTE", "lora", seed=2).with_flags(["--lr", "1e-3", "--dropout", "0.2"])  # a sweep's row
    request.validate().argv()   # checked; the run.sh command line again ("--dropout 0.2" is in extra_args)

Each field is a flag: its ``option(...)`` (the one of ``fairseq_idpg/options.py``, as the blocks' and the
models' options) carries the help, the group in ``--help``, the check its value must pass and the options
it excludes, and the parser is generated from the fields (the type from the annotation: ``bool`` is a
switch, ``Optional[int]`` an int that may be absent). Unlike the models' flags, run.sh's have real
defaults (no preset fills them), so this parser is its own. ``extra_args`` holds the
flags that are not run.sh's: they go to fairseq-train as given. ``validate()`` turns an impossible
request into one line naming the flag. The main job (``fairseq_idpg/run/``) resolves the request into the
run's configuration (the recipe's lr, the updates, the data's provenance: ``config.json``, whose hash
names the run folder); ``RunConfig.from_config`` reads that back as the request that makes the same run.

A new run option is one field here plus the code that reads it. Its kind keeps every finished run its folder:
- a fairseq-train flag (a run could pass it through before it was typed) is ``fairseq=True``: it stays in
  ``extra_args`` where it is given, so a run named by it there keeps that name (``config=True`` would hash it
  apart, under its own key, and rename those runs: ``tests/test_run_config.py`` fails for such a field);
- one fairseq-train has not that changes what is trained is ``config=True``: it is written to config.json,
  and so hashed, when it is not at its default, so that finished runs keep their folder;
- one that changes only how the run computes (``--nproc``, ``--compile-layers``) is neither: run.sh reads it
  (it never reaches ``extra_args``, which are hashed) and writes its fairseq-train flag (``run/command.py``), so
  the run keeps its folder with or without it.
"""

import argparse
import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional, Tuple

from fairseq_idpg.errors import RunError
from fairseq_idpg.layout import LMBFF_TASKS, REPO
from fairseq_idpg.options import NON_NEGATIVE, POSITIVE, argument, check_value, flag, option, option_fields
from fairseq_idpg.preprocessing.formats import TASKS

GLUE_TASKS = [name for name in TASKS if name not in LMBFF_TASKS]
GROUPS = {  # the groups of --help, in order (None: the parser's own)
    None: None,
    "budget": "budget (default: the method's recipe)",
    "devices": "devices (the effective batch stays --total-batch)",
    "run": "run",
}


def _raise(message):
    raise RunError(message)


def canonical_task(name):
    """The task's own spelling (``rte`` -> ``RTE``)."""
    for task in GLUE_TASKS + list(LMBFF_TASKS):
        if task.lower() == name.lower():
            return task
    raise RunError(f"unknown task {name!r}; valid: {', '.join(GLUE_TASKS + list(LMBFF_TASKS))}")


@functools.lru_cache(maxsize=256)
def _flags_set(cls, argv):
    """({field: value} of the fields that run.sh flags ``argv`` set, the other flags), parsed once per argv: a
    sweep applies a variant's flags to each of its runs (1,800 parsers took half of table1's dry run)."""
    unset = object()  # a default argparse leaves as it is: the fields no flag sets keep it
    defaults = {f.name: unset for f, _ in cls.options() if f.default is not dataclasses.MISSING}
    args, extra = cls.parser(defaults=defaults, fairseq=False).parse_known_args(["-", *argv])
    return {k: v for k, v in vars(args).items() if k != "task" and v is not unset}, tuple(extra)


@functools.lru_cache(maxsize=256)
def _fairseq_flags_given(cls, extra_args):
    """{field: value} of the ``fairseq=True`` fields that ``extra_args`` set (the last value given wins)."""
    fields = [(f, kind) for f, kind in cls.options() if f.metadata["fairseq"]]
    p = argparse.ArgumentParser(prog="scripts/run.sh", add_help=False, allow_abbrev=False)
    p.error = _raise
    for f, kind in fields:
        p.add_argument(flag(f.name), type=kind, default=None)
    args, _ = p.parse_known_args(list(extra_args))
    return {k: v for k, v in vars(args).items() if v is not None}


# fmt: off
@dataclass(frozen=True)
class RunConfig:
    """What one run is asked to be; every field but ``extra_args`` is a run.sh flag of the same name."""

    task: str = option(dataclasses.MISSING, ", ".join(GLUE_TASKS + list(LMBFF_TASKS)))
    method: str = option("finetune", "a method of fairseq_idpg/methods.py (default finetune; the list below)",
                         shown=True)
    model: str = option("standin", "standin (default), roberta.base, roberta.large, or a folder with model.pt",
                        shown=True)
    seed: int = option(1, "fairseq-train's seed (default 1)", "budget", check=NON_NEGATIVE, shown=True)
    raw: Optional[str] = option(
        None, "the task's raw folder (default: $GLUE_DIR / $LMBFF_DIR, else the checkout's data/, where "
        "scripts/download.sh puts it, downloaded there when missing)")
    bpe_dir: Optional[str] = option(
        None, "RoBERTa GPT-2 BPE files (default models/gpt2_bpe, where scripts/download.sh bpe puts them)")
    few_shot: Optional[int] = option(None, "train on K sampled examples (prepare_data.py --few-shot)", metavar="K",
                                     check=POSITIVE,
                                     excludes=("dev_from_train", "few-shot samples its own dev set"))
    dev_from_train: Optional[int] = option(None, "hold out N train examples as the dev set", metavar="N",
                                           check=POSITIVE,
                                           excludes=("split_dev", "--dev-from-train samples its dev set from train"))
    split_dev: bool = option(False, "split each dev set in two: half of it (1,000 rows of one over 5,000) selects the "
                             "checkpoint, the rest is scored (test; ReFT's GLUE protocol)",
                             excludes=("few_shot", "--few-shot samples its dev set from train"))
    data_seed: int = option(1, "seed of --few-shot / --dev-from-train / --split-dev (default 1)",
                            check=NON_NEGATIVE)
    lr: Optional[float] = option(None, "learning rate", "budget", check=POSITIVE)
    head_lr: Optional[float] = option(None, "the classification head's own learning rate (default: the recipe's, "
                                      "else --lr for all); the lr schedule scales both alike", "budget",
                                      check=POSITIVE)
    max_update: Optional[int] = option(None, "updates (the stand-in: 300)", "budget", check=POSITIVE,
                                       excludes=("epochs", "both set the budget"))
    epochs: Optional[float] = option(None, "or the budget in epochs of the prepared train set", "budget",
                                     check=POSITIVE)
    total_batch: Optional[int] = option(None, "effective batch per update", "budget", check=POSITIVE)
    nproc: int = option(1, "devices / CPU workers (torchrun; default 1)", "devices", check=POSITIVE)
    batch_size: Optional[int] = option(None, "per-device batch (default: total / (nproc x update-freq))",
                                       "devices", check=POSITIVE)
    update_freq: Optional[int] = option(None, "batches accumulated per update (default: as --batch-size needs)",
                                        "devices", check=POSITIVE)
    max_tokens: Optional[int] = option(None, "also cap a per-device batch at N tokens (passed to fairseq)",
                                       "devices", check=POSITIVE)
    fp16: bool = option(False, "fp16 mixed precision (CUDA; the CPU too, slowly)", "devices")
    bf16: bool = option(False, "bf16 mixed precision (CUDA: Ampere or newer; the CPU too, slowly)", "devices",
                        excludes=("fp16", "one mixed precision at a time"), config=True)
    compile_layers: bool = option(False, "torch.compile the frozen encoder's layers (fairseq-train --compile-layers): "
                                  "fewer kernel launches on a GPU, a compile at the start; the same run (folder)",
                                  "devices")
    compile_backend: Optional[str] = option(None, "torch.compile backend of --compile-layers (default inductor)",
                                            "devices", metavar="NAME")
    work_dir: str = option(str(REPO), "where data-bin/ and checkpoints/ go (default: the checkout)", "run")
    restart: bool = option(False, "remove this configuration's folder and train again", "run")
    dry_run: bool = option(False, "print the budget and the fairseq-train command; run nothing", "run")
    # fairseq-train's flags that run.sh also reads (fairseq=True: they stay in extra_args, where they were given)
    validate_interval_updates: Optional[int] = option(None, "validate every N updates (fairseq-train's flag; the "
                                                      "stand-in's default: 3 times a run)", "budget", metavar="N",
                                                      check=POSITIVE, fairseq=True)
    save_interval_updates: Optional[int] = option(None, "save a resumable checkpoint every N updates (fairseq-train's "
                                                  "flag; the stand-in's default: at each validation)", "budget",
                                                  metavar="N", check=POSITIVE, fairseq=True)
    extra_args: Tuple[str, ...] = ()  # the other flags: fairseq-train's, as given
    # fmt: on

    def __post_init__(self):
        """The ``fairseq=True`` fields are what ``extra_args`` gives them; one given as a field only (a sweep's
        row, ``RunConfig(..., validate_interval_updates=50)``) is appended there, as the last flag."""
        given, extra = _fairseq_flags_given(type(self), tuple(self.extra_args)), tuple(self.extra_args)
        for f, _ in self.options():
            if not f.metadata["fairseq"]:
                continue
            value = getattr(self, f.name)
            if value is not None and value != given.get(f.name):
                extra += (flag(f.name), str(value))
            object.__setattr__(self, f.name, value if value is not None else given.get(f.name))
        object.__setattr__(self, "extra_args", extra)

    # ------------------------------------------------------------------------------------ the flags
    @classmethod
    def options(cls):
        """The fields that are flags, with their type (``Optional[X]`` -> X)."""
        return option_fields(cls)

    @classmethod
    def parser(cls, description=None, epilog=None, defaults=None, fairseq=True):
        """run.sh's argparse parser, one argument per field (``defaults`` replace the fields' own; ``fairseq``
        False: without the fields that stay in ``extra_args``); a bad value is a RunError."""
        p = argparse.ArgumentParser(
            prog="scripts/run.sh", description=description, epilog=epilog, allow_abbrev=False,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        p.error = _raise  # a RunError: one line, said as run.sh says its others (argparse prints the usage first)
        groups = {name: p if title is None else p.add_argument_group(title) for name, title in GROUPS.items()}
        for f, kind in cls.options():
            meta, default = f.metadata, (defaults or {}).get(f.name, f.default)
            if meta["fairseq"] and not fairseq:
                continue
            if f.default is dataclasses.MISSING:
                groups[meta["group"]].add_argument(f.name, help=meta["help"])
            else:
                groups[meta["group"]].add_argument(flag(f.name), **argument(f, kind, default))
        return p

    @classmethod
    def from_argv(cls, argv, **parser_text):
        """run.sh's command line; flags that are not run.sh's are kept, in order, as ``extra_args``."""
        if "-h" in argv or "--help" in argv:
            cls.parser(**parser_text).parse_known_args(argv)  # prints every flag and exits
        args, extra = cls.parser(**parser_text, fairseq=False).parse_known_args(argv)
        return cls(**vars(args), extra_args=tuple(extra))

    def with_flags(self, argv):
        """This request with run.sh flags applied (a sweep's ``args``): the last value given wins, as on
        a command line; the others are appended to ``extra_args``."""
        changes, extra = _flags_set(type(self), tuple(argv))
        again = {f.name: None for f, _ in self.options() if f.metadata["fairseq"]}  # read from extra_args again
        return dataclasses.replace(self, **changes, **again, extra_args=(*self.extra_args, *extra))

    def argv(self):
        """The run.sh command line of this request (its fields not at their default, and the ``shown`` ones)."""
        argv = [self.task]
        for f, kind in self.options():
            value = getattr(self, f.name)
            if f.default is dataclasses.MISSING or f.metadata["fairseq"]:  # the latter: in extra_args
                continue
            if value == f.default and not f.metadata["shown"]:
                continue
            argv += [flag(f.name)] if kind is bool else [flag(f.name), str(value)]
        return argv + list(self.extra_args)

    # ------------------------------------------------------------------------------------ checks
    def validate(self):
        """RunError (one line naming the flag) for a value that cannot be right. Explicit values are
        used as given, so impossible ones are errors (never 'use the default')."""
        for f, _ in self.options():
            if getattr(self, f.name) is not None:  # None: not given
                check_value(f.name, getattr(self, f.name), f.metadata["check"], error=RunError)
        for f, _ in self.options():
            if f.metadata["excludes"] and getattr(self, f.name) and getattr(self, f.metadata["excludes"][0]):
                other, why = f.metadata["excludes"]
                raise RunError(f"{flag(f.name)} and {flag(other)} exclude each other ({why})")
        if self.compile_backend is not None and not self.compile_layers:
            raise RunError("--compile-backend chooses the backend of --compile-layers: give both")
        from fairseq_idpg.methods import METHODS
        from fairseq_idpg.preprocessing.prepare import FEW_SHOT_DEV

        if self.method not in METHODS:
            raise RunError(f"unknown --method {self.method!r}; valid: {', '.join(sorted(METHODS))}")
        if self.compile_layers and not METHODS[self.method].frozen_backbone:
            raise RunError(f"--compile-layers compiles a frozen backbone's layers; --method {self.method} trains it")
        train = TASKS[canonical_task(self.task)].sizes[0]
        if self.few_shot is not None and self.few_shot > train - FEW_SHOT_DEV:
            raise RunError(
                f"--few-shot {self.few_shot}: {canonical_task(self.task)}'s train file has {train:,} rows and the "
                f"{FEW_SHOT_DEV:,}-example dev set is sampled from it too, so K can be at most "
                f"{max(0, train - FEW_SHOT_DEV):,}"
            )
        return self

    # ------------------------------------------------------------------------------------ the configuration
    def config_options(self):
        """The ``config=True`` fields not at their default: part of config.json (and of its hash)."""
        return {f.name: getattr(self, f.name) for f, _ in self.options()
                if f.metadata["config"] and getattr(self, f.name) != f.default}  # fmt: skip

    @classmethod
    def from_config(cls, config, **run):
        """The request that makes the run of a ``config.json`` again (explicit lr, batch, budget and
        device layout, so a later recipe default does not change it); ``run``: work_dir, raw, ..."""
        provenance = config["data"]["provenance"] or {}
        from fairseq_idpg.preprocessing.prepare import seeded

        split_dev = bool(provenance.get("split_dev"))
        sampled = seeded(provenance.get("few_shot"), provenance.get("dev_from_train"), split_dev)
        budget = {"epochs": config["epochs"]} if config["epochs"] is not None else {"max_update": config["updates"]}
        added = {f.name: config[f.name] for f, _ in cls.options() if f.metadata["config"] and f.name in config}
        return cls(
            task=config["task"], method=config["method"]["name"], model=config["model"]["name"], seed=config["seed"],
            few_shot=provenance.get("few_shot"), dev_from_train=provenance.get("dev_from_train"), split_dev=split_dev,
            data_seed=provenance["seed"] if sampled else 1, lr=config["lr"], head_lr=config.get("head_lr"),
            total_batch=config["batch"], **budget,
            nproc=config["layout"]["nproc"], batch_size=config["layout"]["batch_size"],
            update_freq=config["layout"]["update_freq"], max_tokens=config["max_tokens"], fp16=config["fp16"],
            extra_args=tuple(config["extra_args"]), **added, **run,
        )  # fmt: skip


def method_list():
    """``--help``'s list of methods: name and one-line description."""
    from fairseq_idpg.methods import METHODS

    width = max(map(len, METHODS))
    return "methods (--method):\n" + "\n".join(f"  {n:{width}}  {m.description}" for n, m in sorted(METHODS.items()))
