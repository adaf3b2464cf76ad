"""Child processes that end with their launcher (Linux's ``PR_SET_PDEATHSIG``): what run.sh, a sweep's slots
and a Slurm array task start. Standard library only: a Slurm array task (``slurm_task.py``) runs it without
importing torch or fairseq."""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _prctl():
    """libc's prctl (Linux), looked up in the parent (the process's own symbols: no library search, no module
    state, so a Slurm task can carry this module by value): the child between fork and exec only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes, prctl.restype = [ctypes.c_int, ctypes.c_ulong], ctypes.c_int
    return prctl


def child_process_options():
    """Popen's keyword arguments that end the child with its launcher: on Linux the child asks for SIGTERM
    when its parent dies (a ``kill -9`` of run.sh or of a sweep leaves no fairseq-train training unseen);
    the flag outlives exec, so fairseq-train, torchrun's agent and prepare_data.py get it. It fires when the
    thread that started the child ends: call Popen from a thread that waits for the child (tee, call and a
    sweep's slot do). The child stays in its parent's process group: Ctrl-C reaches both, as before."""
    prctl = _prctl()
    if prctl is None:
        return {}
    parent = os.getpid()

    def die_with_parent():  # in the child, before exec: no imports, no locks
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the request: nobody would send it
            os.kill(os.getpid(), signal.SIGTERM)

    return {"preexec_fn": die_with_parent}
