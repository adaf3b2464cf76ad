"""Several runs of the main job trained together on one frozen backbone: ``python -m fairseq_idpg.run.group``.

    python -m fairseq_idpg.run.group --member "SST-2 --method lora --lr 5e-4 --seed 1" \\
                                     --member "SST-2 --method lora --lr 5e-4 --seed 2"

Each ``--member`` is a ``scripts/run.sh`` command line. Members that differ only in ``--lr`` and ``--seed`` (the
same method, task, data, model, budget, batch and flags) train in this process (``fused.train.run_members``, what
``python -m fairseq_idpg.fused.train`` runs, with the flags the members' plans made: one forward and backward
through the backbone per update for all of them; a sweep's group is one process start); each
keeps everything a lone run has: its run folder (the same name and hash as alone), its config.json, its
train.log (fairseq-train's lines, as alone), its checkpoints, its fairseq-validate scores and its results.json,
which also names the runs it trained with (``fused_with``). A finished member is reported as cached; an
interrupted group resumes every member from its own checkpoint_last.pt; a member that diverges or fails stops
alone (its record or its error says so) while the others finish. The group's own output (its progress) is
in the first member's folder as ``fused.log``. Ctrl-C or SIGTERM stops the group where it is (the members'
threads end with the process; their checkpoints are written atomically), one line, exit 130.
"""

import argparse
import contextlib
import shlex
import signal
import sys
import time
from pathlib import Path

from fairseq_idpg.errors import ConfigError, Interrupted, RunError
from fairseq_idpg.files import write_json
from fairseq_idpg.member_flags import shared_folders, split_own
from fairseq_idpg.run.execution import (
    checkpoint_updates,
    diverged_line,
    divergence,
    run_folder_lock,
    score,
    show_cached,
    trained_before,
)
from fairseq_idpg.run.processes import ONE_LINE_ERROR, Refused
from fairseq_idpg.run.record import read_run_folder, write_record


def fairseq_train_args(p):
    """The fairseq-train arguments of a plan's launcher command (one device: what the launcher would run)."""
    from fairseq_idpg.launch import resolve

    opts, cmd = resolve(p.train[p.train.index("fairseq_idpg.launch") + 1 :])
    if opts.nproc != 1:
        raise ConfigError(f"{p.folder.name}: fused runs train on one device; give --nproc 1")
    return cmd[1:]


def trains_alone(p):
    """Why a run cannot train in a group (None when it can): fine-tuning, EFL, or ``--compile-layers`` (a
    group runs its members under vmap, where compiled layers do not apply: ``fused/train.py``)."""
    if not p.method.frozen_backbone:
        return "its backbone trains"
    if "efl" in p.method.arch:
        return "EFL rewrites each batch into sentence pairs"
    if p.request.compile_layers:
        return "--compile-layers compiles a lone run's layers"
    return None


def fusion_key(p):
    """What members of one group share: the fairseq-train command without lr, seed and folder, or None for a
    run that trains alone (``trains_alone``)."""
    if trains_alone(p) is not None:
        return None
    return tuple(split_own(fairseq_train_args(p))[0])


def member_flags(plans):
    """(the fairseq-train flags the plans share, each plan's ``[--lr X --seed Y --save-dir Z]``): what
    ``fused.train.run_members`` trains; runs that differ in more than lr and seed, or two plans of one run folder:
    one line."""
    shared, members = None, []
    for p in plans:
        rest, own = split_own(fairseq_train_args(p))
        if shared is None:
            shared = rest
        elif rest != shared:
            differ = sorted(set(rest) ^ set(shared))[:4]
            raise ConfigError(
                f"{p.folder.name} and {plans[0].folder.name} differ in more than --lr and --seed "
                f"({' '.join(differ)}): they cannot train together"
            )
        members.append(own)
    twice = shared_folders(members)
    if twice:  # the same run given twice (a flag, a preset or a default spelling one configuration)
        names = " and ".join(dict.fromkeys(Path(f).name for f in twice))
        raise ConfigError(
            f"two members are one run ({names}): its folder would be trained twice at once; give each run once"
        )
    return shared, members


def execute_group(plans):
    """Train the planned runs together and score each (module docstring); the list of members' errors."""
    errors, todo = [], []
    with contextlib.ExitStack() as stack:
        for p in plans:
            done = read_run_folder(p.folder)
            if done is None:
                lock = stack.enter_context(run_folder_lock(p.folder))
                done = read_run_folder(p.folder)  # another process may have finished it meanwhile
            if done is not None:
                print(f"{p.folder.name}: ", end="")
                show_cached(p.folder, done)
                continue
            print(f"{p.folder.name}: ", end="", flush=True)
            trained = trained_before(p)
            if not trained:
                print("training", flush=True)
            write_json(p.config, p.folder / "config.json")
            todo.append((p, lock, trained))
        training = [(p, lock) for p, lock, trained in todo if not trained]
        if training:
            try:
                _train(training)
            except Interrupted:  # the members' threads end with the process, not here: their folders stay locked
                _HELD_UNTIL_EXIT.append(stack.pop_all())  # until then (the kernel releases a flock)
                raise
        for p, _, _ in todo:
            try:
                _finish(p, [q.folder.name for q, _ in training if q is not p])
            except RunError as e:
                if isinstance(e, Interrupted):  # the group was stopped: no member's scoring starts after it
                    raise
                print(f"run.sh: error: {p.folder.name}: {e}", file=sys.stderr, flush=True)
                errors.append(f"{p.folder.name}: {e}")
    return errors


_HELD_UNTIL_EXIT = []  # the run-folder locks of a stopped group (``execute_group``): released when the process ends


def _train(training):
    plans = [p for p, _ in training]
    names = ", ".join(p.folder.name for p in plans)
    for p in plans:
        with open(p.folder / "train.log", "a", encoding="utf-8") as f:
            f.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} scripts/run.sh {shlex.join(p.argv)}\n")
            f.write(f"# trained together with: {names}\n")
    # trained in this process (its threads: fused/train.py), not a second one: torch and fairseq load here only
    from fairseq_idpg.fused.train import PROG, run_members

    shared, members = member_flags(plans)
    start = time.time()
    with open(plans[0].folder / "fused.log", "a", encoding="utf-8") as log:

        def say(line):
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()

        say("+ " + shlex.join([PROG, *shared, *(x for own in members for x in ("--member", shlex.join(own)))]))
        previous = signal.signal(signal.SIGTERM, _stop)  # as Ctrl-C: the group stops at once, resumable
        try:
            outcome = run_members(shared, members, say)
        except KeyboardInterrupt:
            raise Interrupted(f"interrupted; {log.name} and each run's train.log keep the output; the same command "
                           "resumes every run") from None  # fmt: skip
        except ConfigError as e:  # fairseq refused the flags: each member is judged by its own log below
            say(f"{PROG}: error: {' '.join(str(e).split())}")
            return
        finally:
            signal.signal(signal.SIGTERM, previous)
    _release_device_memory()  # for the members' fairseq-validate, on the same device
    if all(line is None for line in outcome.values()):
        for p in plans:
            p.timings["train"] = round(time.time() - start, 1)  # the group's: every member's training at once


def _stop(signum, frame):
    raise KeyboardInterrupt


def _release_device_memory():
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _finish(p, fused_with):
    """Score a member and write its record: as ``execution.execute_locked`` does for a lone run."""
    save = p.folder
    found = divergence(save / "train.log")
    if found is not None:
        (save / "crash.pt").unlink(missing_ok=True)
        write_record(p, {}, diverged=found, extra={"fused_with": fused_with})
        print(diverged_line(found, p.config["lr"]), file=sys.stderr)
        return
    last = save / "checkpoint_last.pt"
    done = checkpoint_updates(last)[0] if last.is_file() else 0
    if done < p.config["updates"]:
        lines = (save / "train.log").read_text(encoding="utf-8", errors="replace").strip().splitlines()
        if lines and ONE_LINE_ERROR.match(lines[-1]):  # the trainer's one line (a full disk), as a lone run says it
            raise Refused(lines[-1].split(": error: ", 1)[1].strip())
        raise RunError(f"training stopped at update {done} of {p.config['updates']}: {lines[-1] if lines else ''}")
    results = score(p)
    write_record(p, results, extra={"fused_with": fused_with} if fused_with else None)


def parse_members(argv):
    parser = argparse.ArgumentParser(prog="python -m fairseq_idpg.run.group", description=__doc__.split("\n\n")[0])
    parser.add_argument("--member", action="append", required=True, help="one run's scripts/run.sh command line")
    from fairseq_idpg.errors import one_line_errors

    one_line_errors(parser)
    return [shlex.split(m) for m in parser.parse_args(argv).member]


def main(argv=None):
    from fairseq_idpg.run.cli import parse_args
    from fairseq_idpg.run.planning import check, planned

    members = parse_members(sys.argv[1:] if argv is None else argv)
    try:
        requests = [parse_args(m) for m in members]
        checked = [check(request, m) for request, m in zip(requests, members, strict=True)]
        plans = [planned(r, p, m) for r, p, m in zip(requests, checked, members, strict=True)]
        alone = next((why for why in map(trains_alone, plans) if why is not None), None)
        if alone is not None:
            raise ConfigError(f"--method {requests[0].method}: its runs train alone ({alone})")
        member_flags(plans)  # members that differ in more than lr and seed: refused before anything runs
    except (ConfigError, RunError) as e:
        print(f"run.sh: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    try:
        errors = execute_group(plans)
    except RunError as e:
        if not isinstance(e, Interrupted):
            raise
        print(f"run.sh: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 130
    return 1 if errors else 0


if __name__ == "__main__":
    from fairseq_idpg.logs import quiet_setup_logs

    quiet_setup_logs()
    sys.exit(main())
