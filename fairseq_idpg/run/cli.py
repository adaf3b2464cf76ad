"""``scripts/run.sh``: the request from its arguments, then check, plan, and execution (or the dry run's
plan); a refusal is one line, ``run.sh: error: ...`` (exit 2; 75: the run folder is in use; 130:
interrupted)."""

import os
import shlex
import sys
from pathlib import Path

from fairseq_idpg.errors import Interrupted, RunError
from fairseq_idpg.run.execution import IN_USE_EXIT, InUse, execute
from fairseq_idpg.run.planning import check, hash_note, planned, warn_missing
from fairseq_idpg.run_config import RunConfig, method_list

DESCRIPTION = "The main job: prepare a task, train a method on it with fairseq-train, score it with fairseq-validate."
EPILOG = "Other flags go to fairseq-train as given (e.g. --pooler-dropout 0.2); see docs/training.md."


def parse_args(argv):
    """run.sh's arguments as a RunConfig (``--help`` lists the methods)."""
    return RunConfig.from_argv(argv, description=DESCRIPTION, epilog=method_list() + "\n\n" + EPILOG)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return job(parse_args(argv), argv)
    except RunError as e:
        print(f"run.sh: error: {e}", file=sys.stderr)
        if isinstance(e, InUse):
            return IN_USE_EXIT
        return 130 if isinstance(e, Interrupted) else 2


def job(request, argv):
    read_only = None if request.dry_run else work_dir_refusal(Path(request.work_dir))
    checked = check(request, argv)
    missing = checked.missing
    if read_only and not checked.finished:
        raise RunError(read_only)  # only a finished run's result can be shown from a read-only folder
    p = planned(request, checked, argv)
    if request.dry_run:
        note = hash_note([p])
        if note:
            print("  " + note)
        if request.restart and p.folder.exists():
            print(f"--restart would remove {p.folder}")
        print("+ " + shlex.join(p.train))
        warn_missing(missing, "run.sh")
        return 0
    return execute(p)


def work_dir_refusal(work_dir):
    """``--work-dir`` that is not a folder: one line (RunError) before anything is written. One that this
    user cannot write (nor the nearest existing folder above it, where it is still to be made): the line
    that refuses any run but a finished one, whose result is only read (returned)."""
    if work_dir.exists() and not work_dir.is_dir():
        raise RunError(f"--work-dir {work_dir} is a file, not a folder; give a folder (it is made when missing)")
    existing = next(d for d in (work_dir, *work_dir.absolute().parents) if d.exists())
    if not existing.is_dir():
        raise RunError(f"--work-dir {work_dir}: {existing} is a file, not a folder; give a folder")
    if not writable(existing):
        return f"--work-dir {work_dir} is read-only ({existing} cannot be written); give a folder you can write"
    return None


def writable(folder):
    return os.access(folder, os.W_OK | os.X_OK)
