"""Commands that only plan or print their usage (``--dry-run``, ``--help``), each in a fork of one interpreter that
imported the package once: a fresh interpreter spends about 4 s of CPU importing torch and fairseq before such a
command does anything, most of a docs test's time.

    out = preloaded.run(["scripts/sweep.sh", "examples/idpg/smoke.yaml", "--dry-run"], cwd=REPO, env=os.environ)
    out.returncode, out.stdout, out.stderr

A command runs as ``python -m MODULE ARGS`` (``scripts/NAME.sh`` when the script is the thin wrapper
``exec "${PYTHON:-python3}" -m MODULE "$@"``, which ``module_of`` checks) or ``python PATH ARGS``, with its own
working folder, environment, argv, stdin (/dev/null), stdout and stderr, and its exit status; the fork starts from
an interpreter that has only imported (one thread, nothing run). ``command_of`` returns None for anything else,
which the caller runs as a real process."""

import atexit
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

WRAPPER = re.compile(r'^exec "\$\{PYTHON:-python3\}" -m ([\w.]+) "\$@"$', re.M)

DRIVER = r"""
import json, os, runpy, sys, threading, traceback
import fairseq_idpg  # torch, fairseq and the package, once

threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()
print(json.dumps({"threads": threads}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv = list(request["argv"])
            if request["module"]:
                runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            else:
                sys.path.insert(0, os.path.dirname(os.path.abspath(request["argv"][0])))
                runpy.run_path(request["argv"][0], run_name="__main__")
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
"""


def module_of(script: Path):
    """The module of a thin wrapper script (its one command ``exec "${PYTHON:-python3}" -m MODULE "$@"``), else None."""
    lines = [s for s in script.read_text().splitlines() if s.strip() and not s.lstrip().startswith("#")]
    found = WRAPPER.match(lines[0]) if len(lines) == 1 else None
    return found.group(1) if found else None


def command_of(argv, cwd):
    """(module or None, argv as the fork's sys.argv) of a planning or usage command, else None."""
    if not {"--dry-run", "--help"} & set(argv):
        return None
    words = argv[1:] if argv[0] == "bash" else argv
    if words[0].endswith(".sh"):
        module = module_of(Path(cwd) / words[0])
        return (module, [words[0], *words[1:]]) if module else None
    if Path(words[0]).name in ("python", "python3") or words[0] == sys.executable:
        if len(words) > 2 and words[1] == "-m" and words[2].startswith("fairseq_idpg"):
            return words[2], [words[2], *words[3:]]
        if len(words) > 1 and words[1].endswith(".py"):
            return None, words[1:]
    return None


class Preloaded:
    """One driver process per test process, started at the first command, stopped at exit."""

    def __init__(self):
        self.driver, self.forkable = None, True
        self.folder = tempfile.mkdtemp(prefix="preloaded-")
        atexit.register(shutil.rmtree, self.folder, ignore_errors=True)

    def _start(self):
        # numpy's BLAS starts a pool of threads at import unless it has one: the driver's only (each command gets
        # its own environment back, but its BLAS runs on one thread: a dry run or a usage does no maths)
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        hello = json.loads(self.driver.stdout.readline())
        atexit.register(self.driver.kill)
        # forking is safe only from a process with one thread: where importing started another, every command
        # runs as a process of its own
        self.forkable = hello["threads"] == 1

    def run(self, argv, cwd, env, timeout=300):
        """``subprocess.run``'s result (returncode, stdout, stderr) of ``argv``, or None where ``command_of`` is or
        where the driver cannot fork safely (``forkable``: tested on the CI machine);
        ``subprocess.TimeoutExpired`` after ``timeout`` seconds (the driver is stopped, the next command starts
        another)."""
        command = command_of(list(argv), cwd)
        if command is None:
            return None
        if self.forkable and (self.driver is None or self.driver.poll() is not None):
            self._start()
        if not self.forkable:
            return None
        module, fork_argv = command
        out, err = (os.path.join(self.folder, name) for name in ("stdout", "stderr"))
        request = {"module": module, "argv": fork_argv, "cwd": str(cwd), "env": dict(env), "stdout": out, "stderr": err}
        self.driver.stdin.write(json.dumps(request) + "\n")
        self.driver.stdin.flush()
        if not select.select([self.driver.stdout], [], [], timeout)[0]:
            self.driver.kill()
            raise subprocess.TimeoutExpired(argv, timeout)
        reply = json.loads(self.driver.stdout.readline())
        return SimpleNamespace(
            returncode=reply["returncode"], stdout=Path(out).read_text(errors="replace"),
            stderr=Path(err).read_text(errors="replace"),
        )  # fmt: skip


preloaded = Preloaded()
