"""A run folder held by another process, as a sweep's or run.sh's run.py holds it while it trains
(fairseq_idpg/run/execution.py: ``run_folder_lock``), for the tests of what a second process does. No tests here.

with held_by_another_process(folder):   # folder/.lock held by a child process until the block ends
    ...
"""

import contextlib
import subprocess
import sys

from fairseq_idpg.run.execution import RUN_LOCK


@contextlib.contextmanager
def held_by_another_process(folder):
    """A child process holds ``folder/.lock`` (filelock's fcntl lock, as run.py takes it) for the block."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from filelock import FileLock; lock = FileLock(sys.argv[1]); "
         "lock.acquire(); print('held', flush=True); time.sleep(600)", str(folder / RUN_LOCK)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
