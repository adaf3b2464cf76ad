"""fairseq-train for several runs at once on one frozen backbone: ``python -m fairseq_idpg.fused.train``.

    python -m fairseq_idpg.fused.train DATA --user-dir fairseq_idpg [fairseq-train flags of every run] \\
        --member "--lr 1e-3 --seed 1 --save-dir runs/a" --member "--lr 1e-3 --seed 2 --save-dir runs/b"

Each ``--member`` is one run: the shared flags followed by its own ``--lr``, ``--seed`` and ``--save-dir`` (the
only flags a member may set: members of a group differ in nothing else). Every member trains as
fairseq-train would train it alone (``group.py``: its own data order, optimizer, lr schedule, validation,
checkpoints and early stop), with one forward and backward through the frozen backbone per update for all of
them (``stacked.py``). Member k's log is ``SAVE_DIR/train.log`` (appended; fairseq-train's own lines, as a lone
run's), and this command prints the group's progress and one line per member at the end. Exit status 0 when
every member finished, 1 when any failed (its line says why; the others still finished).

Methods whose backbone trains (fine-tuning) and EFL (its task rewrites each batch into sentence pairs) train
alone.
"""

import argparse
import logging
import os
import shlex
import sys
import threading
import time
from pathlib import Path

from fairseq_idpg.errors import ConfigError, argparse_error, refuse
from fairseq_idpg.member_flags import MEMBER_FLAGS, shared_folders, split_own
from fairseq_idpg.tasks.peft_sentence_prediction import FUSED_MEMBER
from fairseq_idpg_compat import new_run

from .group import FusedGroup, glibc

PROG = "python -m fairseq_idpg.fused.train"
LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq-train's


def split_members(argv):
    """(shared flags, [each member's own flags]) of a command line (module docstring)."""
    shared, members, it = [], [], iter(argv)
    for arg in it:
        if arg == "--member":
            value = next(it, None)
            if value is None:
                raise ConfigError("--member: expected a value such as '--lr 1e-3 --seed 1 --save-dir DIR'")
            members.append(value)
        elif arg.startswith("--member="):
            members.append(arg.split("=", 1)[1])
        else:
            shared.append(arg)
    if not members:
        raise ConfigError("--member: give one per run ('--lr LR --seed SEED --save-dir DIR'), at least one")
    parsed = []
    for value in members:
        try:
            rest, own = split_own(shlex.split(value))
        except ConfigError as e:
            raise ConfigError(f"--member {value!r}: {e}") from None
        if rest:
            raise ConfigError(
                f"--member {value!r}: {rest[0]} is not a member's own flag; members differ only in "
                f"{', '.join(MEMBER_FLAGS)} (give the rest once, for all)"
            )
        parsed.append(own)
    twice = shared_folders(parsed)
    if twice:
        raise ConfigError(f"--member: two members write --save-dir {' and '.join(twice)}; each run needs its own")
    for flag in MEMBER_FLAGS:
        if flag in shared:
            raise ConfigError(f"{flag} is a member's own flag: give it inside each --member, not once for all")
    return shared, parsed


def member_configs(shared, members):
    """Each member's fairseq-train configuration, as fairseq-train parses its command line. fairseq's conversion
    to its config (``convert_namespace_to_omegaconf``, about a second each) runs for the first member only: the
    others' are its copy with the fields their own flags set (``_member_config``)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    def one_line(parser):
        parser.error = argparse_error  # a ConfigError, said in one line, for fairseq's parser too

    cfgs = []
    quiet = logging.getLogger("fairseq.utils")  # "--user-dir ... has already been imported": for the logs only
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        for own in members:
            parser = options.get_training_parser()
            one_line(parser)
            args = options.parse_args_and_arch(parser, [*shared, *own], modify_parser=one_line)
            if not cfgs:
                first = args
                cfgs.append(convert_namespace_to_omegaconf(args))
            else:
                cfgs.append(_member_config(cfgs[0], first, args))
    finally:
        quiet.setLevel(level)
    _check_fusable(cfgs[0])
    return cfgs


def _member_config(template, template_args, args):
    """``template`` (the config fairseq made of ``template_args``) for ``args``, which differ in a member's own
    flags: every field named as an argument that differs takes ``args``' value (fairseq fills each config field
    from the argument of its name), in the dataclass sections and in those that are a copy of the argument
    namespace (a model registered with arguments). Equal to fairseq's conversion (tests/test_fused_train.py)."""
    import copy

    from omegaconf import DictConfig, open_dict

    own = {k: v for k, v in vars(args).items() if getattr(template_args, k, None) != v}
    cfg = copy.deepcopy(template)
    with open_dict(cfg):
        for name in list(cfg.keys()):
            section = cfg[name]
            if isinstance(section, argparse.Namespace):
                for key, value in own.items():
                    setattr(section, key, value)
            elif isinstance(section, DictConfig):
                for key, value in own.items():
                    if key in section:
                        section[key] = list(value) if isinstance(value, tuple) else value
    return cfg


def _check_fusable(cfg):
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq_idpg.models.frozen_roberta import FrozenBackboneRobertaModel

    arch, task = cfg.model._name, cfg.task._name
    if task == "efl_sentence_prediction":
        raise ConfigError(f"--task {task}: EFL rewrites each batch into sentence pairs; its runs train alone")
    if cfg.distributed_training.distributed_world_size > 1:
        raise ConfigError("fused runs train on one device: give no --distributed-world-size")
    if not issubclass(ARCH_MODEL_REGISTRY[arch], FrozenBackboneRobertaModel):
        raise ConfigError(
            f"--arch {arch}: its backbone trains (fine-tuning), so its runs cannot share one; they train alone"
        )
    if getattr(cfg.model, "compile_layers", False):
        # the members run under torch.func.vmap (stacked.py), which calls the layers' own code: compiled
        # layers would be built, compiled again for each member's validation, and never used in training
        raise ConfigError("--compile-layers compiles a lone run's layers; runs trained together do not use it: "
                          "drop --compile-layers, or train the runs alone")  # fmt: skip


class _MemberLogs(logging.Handler):
    """Each member thread's log records to its own train.log, in fairseq-train's format."""

    def __init__(self, paths):
        super().__init__(logging.INFO)
        self.files = [open(p, "a", encoding="utf-8") for p in paths]  # noqa: SIM115 (closed in close())
        self.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))

    def emit(self, record):
        member = FUSED_MEMBER.get()
        if member is None:  # (the group's step thread: nothing of a member's)
            return
        f = self.files[member.index]
        f.write(self.format(record) + "\n")
        f.flush()

    def write(self, index, line):
        self.files[index].write(line + "\n")
        self.files[index].flush()

    def close(self):
        for f in self.files:
            f.close()
        super().close()


def limit_malloc_arenas(arenas=2):
    """At most ``arenas`` glibc malloc arenas in this process (``M_ARENA_MAX``), unless ``MALLOC_ARENA_MAX`` is
    set: each member's thread (and its data loader's) would otherwise keep what it freed in an arena of its own
    (module ``group``'s docstring). Call before the members' threads start; the members run one at a time, so
    they do not contend for the arenas."""
    libc = glibc()
    if libc is not None and "MALLOC_ARENA_MAX" not in os.environ:
        libc.mallopt(-8, arenas)  # M_ARENA_MAX


def _run_member(group, index, cfg, logs, outcome):
    """Member ``index``'s thread: fairseq-train's ``main``, a run of its own (compat fix 18) that knows its group."""
    from fairseq_cli import train

    new_run()
    FUSED_MEMBER.set(group.members[index])
    try:
        with group.turn(index):
            train.main(cfg)
        outcome[index] = None
    except BaseException as e:  # noqa: BLE001 (a member's failure is its own; the others go on)
        line = e.line() if hasattr(e, "line") else f"{type(e).__name__}: {' '.join(str(e).split())}"
        if isinstance(e, ConfigError):  # what fairseq-train would say of it alone (a full disk: the file, the room)
            line = f"fairseq-train: error: {' '.join(str(e).split())}"
        logs.write(index, line)
        outcome[index] = line
    finally:
        group.leave(index)


def train_group(shared, members, count=None, round_starts=None):
    """Train the members (``split_members``' output) together; {member index: None or its failure's line}.
    ``count``: (round, ``launches.ThreadsCount``): count that round's launches (``FusedGroup.count_round``);
    ``round_starts``: a list to which each fused step's start time is appended (benchmarks)."""
    return train_configs(member_configs(shared, members), count, round_starts)


def train_configs(cfgs, count=None, round_starts=None):
    """Train the members (their fairseq-train configurations) together (``train_group``). A member whose
    --save-dir cannot be made or written fails alone, with that line, before the others start without it."""
    unwritable = {i: line for i, cfg in enumerate(cfgs) if (line := _unwritable(cfg.checkpoint.save_dir))}
    if not unwritable:
        return _train_together(cfgs, count, round_starts)
    healthy = [i for i in range(len(cfgs)) if i not in unwritable]
    trained = _train_together([cfgs[i] for i in healthy], count, round_starts) if healthy else {}
    return {**unwritable, **{healthy[j]: line for j, line in trained.items()}}


def _unwritable(save_dir):
    """None, or the line saying why a run's folder cannot be made or its train.log written."""
    try:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(save_dir) / "train.log", "a", encoding="utf-8"):
            pass
    except OSError as e:
        return f"--save-dir {save_dir} cannot be written: {e.strerror or e} ({e.filename or save_dir})"
    return None


def _train_together(cfgs, count, round_starts):
    group = FusedGroup([cfg.common.seed for cfg in cfgs], round_starts)
    if count is not None:
        group.count_round(*count)
    logs = _MemberLogs([Path(cfg.checkpoint.save_dir) / "train.log" for cfg in cfgs])
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    # the members log what fairseq-train logs in a process of its own, where a launcher quieted these (run.group)
    quieted = {name: logging.getLogger(name).level for name in ("fairseq", "fairseq_idpg")}
    outcome = {}
    try:
        for name in quieted:
            logging.getLogger(name).setLevel(logging.NOTSET)
        root.handlers = [logs]
        root.setLevel(logging.INFO)  # (setLevel, not .level =: it clears the loggers' cached levels)
        threads = [
            # daemon: a stopped group (Ctrl-C, SIGTERM: KeyboardInterrupt in the main thread) exits without
            # waiting for its members' turns; their checkpoints are written atomically, so each resumes
            threading.Thread(target=_run_member, args=(group, i, cfg, logs, outcome), name=f"member-{i}", daemon=True)
            for i, cfg in enumerate(cfgs)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        # stopped (Ctrl-C, or the SIGTERM run.group makes one): the members are daemon threads that end with the
        # process, still logging meanwhile, so nothing of theirs is closed under them
        raise
    except BaseException:
        _close(group, logs, handlers, level, quieted)
        raise
    _close(group, logs, handlers, level, quieted)
    return outcome


def _close(group, logs, handlers, level, quieted):
    group.close()
    root = logging.getLogger()
    root.handlers = handlers
    root.setLevel(level)
    for name, was in quieted.items():
        logging.getLogger(name).setLevel(was)
    logs.close()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: {PROG} DATA [fairseq-train flags] --member '--lr LR --seed SEED --save-dir DIR' [--member ...]")
        print("\n" + __doc__)
        return 0
    try:
        shared, members = split_members(argv)
        outcome = run_members(shared, members)
    except ConfigError as e:
        return refuse(PROG, e)
    return 0 if all(line is None for line in outcome.values()) else 1


def run_members(shared, members, say=None):
    """Train the members (``split_members``' output: each ``[--lr X --seed Y --save-dir Z]``) together, saying the
    group's progress and one line per member at the end (``say``: print); {member index: None or its failure's line}.
    Raises ConfigError, before anything trains, for flags fairseq refuses."""
    say = say or (lambda line: print(line, flush=True))
    start = time.time()
    cfgs = member_configs(shared, members)
    say(f"fused: {len(members)} runs on one backbone")
    limit_malloc_arenas()
    outcome = train_configs(cfgs)
    for i, own in enumerate(members):
        say(f"  {own[-1]}: {'finished' if outcome.get(i) is None else outcome[i]}")
    say(f"fused: {len(members)} runs in {time.time() - start:.1f} s")
    return {i: outcome.get(i) for i in range(len(members))}


if __name__ == "__main__":
    sys.exit(main())
