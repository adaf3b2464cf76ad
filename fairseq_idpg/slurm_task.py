"""A Slurm array task of a sweep (``sweep_slurm.py``): what submitit pickles and the job calls, the main job with its
output in a log.

The task only starts ``python -m fairseq_idpg.run`` (or a fused group's ``run.group``) and waits for it, so it
imports the standard library and nothing of this package: submitit carries this module and ``child_processes``
by value (``carried_by_value``), and the job's interpreter unpickles the task without importing fairseq_idpg,
whose package imports torch and fairseq (about 4 s of CPU in every job, the run's own process then pays again).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fairseq_idpg import child_processes
from fairseq_idpg.child_processes import child_process_options

TAIL_LINES = 20


def carried_by_value():
    """Have cloudpickle (submitit's pickler) carry this module and ``child_processes`` in the pickle, not by name:
    the job then imports neither, nor the package above them."""
    import cloudpickle

    for module in (sys.modules[__name__], child_processes):
        cloudpickle.register_pickle_by_value(module)


class RunTask:
    """One array task: ``argv`` run in ``cwd`` with ``env`` added, its output appended to ``log``. Raises with the
    log's tail when the run fails (an exit status other than 0 and ``tolerated``'s). On Slurm's signal before the
    time limit (or a preemption), ``checkpoint`` stops the run, which keeps its checkpoints, and submitit requeues
    the job: the requeued job resumes the run from its checkpoint_last.pt."""

    def __init__(self, tolerated=()):
        self.tolerated = tuple(tolerated)  # exit statuses that are no failure (a run folder in use)
        self.proc = None

    def __call__(self, argv, log, cwd, env=None):
        with open(log, "a", encoding="utf-8") as f:
            # Slurm counts the job's requeues (a preemption, scontrol requeue, the time limit's own)
            restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
            again = f": requeued (restart {restarts}), resumes from checkpoint_last.pt" if restarts else ""
            f.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} slurm job {_job_id()}{again}\n")
            f.flush()
            environment = {**os.environ, **(env or {})}
            self.proc = subprocess.Popen(
                argv, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, env=environment,
                **child_process_options(),
            )  # fmt: skip
            code = self.proc.wait()
        if code and code not in self.tolerated:
            raise RuntimeError(f"the run (python -m {argv[2]}) exited with {code}; {log}:\n{_tail(log)}")
        return code

    def checkpoint(self, argv, log, cwd, env=None):
        """Stop the run (the main job passes SIGTERM on to fairseq-train; its checkpoints stay) and return
        the same call for the requeued job."""
        from submitit.helpers import DelayedSubmission

        # in a signal handler, while __call__ waits on the run: Popen.wait here would wait for that wait's lock
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            for _ in range(600):  # up to 60 s; WNOWAIT: the run stays for __call__'s wait to reap
                if os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                    break
                time.sleep(0.1)
        with open(log, "a", encoding="utf-8") as f:
            f.write(
                f"# slurm job {_job_id()}: time limit near or preempted: requeued, resumes from checkpoint_last.pt\n"
            )
        return DelayedSubmission(RunTask(self.tolerated), argv, log, cwd, env)


def _job_id():
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    return f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID')}" if array else os.environ.get("SLURM_JOB_ID", "?")


def _tail(path):
    try:
        return "".join(Path(path).read_text(errors="replace").splitlines(keepends=True)[-TAIL_LINES:])
    except OSError:
        return ""
