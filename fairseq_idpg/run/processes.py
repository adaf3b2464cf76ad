"""The commands a run starts (prepare_data.py, fairseq-train, fairseq-validate): their output to the
terminal and a log, line by line, with the time left; a command's one-line refusal said once."""

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from fairseq_idpg.child_processes import child_process_options
from fairseq_idpg.errors import Interrupted, RunError

ONE_LINE_ERROR = re.compile(r"[\w./-]+: error: ")  # a command's refusal: PROG: error: MESSAGE (exit status 2)


class Refused(RunError):
    """A command run.sh ran refused its input in one line (exit status 2): run.sh says it again, once."""


def format_duration(seconds):
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class TrainingEta:
    """Appends ``eta 3m10s`` to fairseq's log lines that report ``num_updates``: the updates left times the
    seconds per update seen since the first such line (before that: fairseq's wall clock over its
    updates), plus the validation rounds left times the seconds a round took. Rounds are timed from
    fairseq's ``begin validation`` line to its scores; until one is, the eta says ``+ validation``."""

    UPDATES = re.compile(r"\bnum_updates\"?[=: ]+\"?(\d+)")  # simple and json formats
    VALID_UPDATES = re.compile(r"num_updates\"?[=: ]+\"?(\d+)")  # json: "valid_num_updates"
    WALL = re.compile(r"\bwall\"?[=: ]+\"?([\d.]+)")
    BEGIN_VALIDATION = "begin validation on"

    def __init__(self, total_updates, clock=time.monotonic):
        self.total, self.clock, self.first = total_updates, clock, None
        self.validating_since = None
        self.rounds = {}  # update -> seconds its validation took (all subsets)
        self.paused = 0.0  # seconds spent validating since the first training line

    def annotate(self, line):
        if self.BEGIN_VALIDATION in line:
            self.validating_since = self.clock()
            return line
        if "valid on" in line or '"valid' in line:  # a subset's scores: its round ends
            found = self.VALID_UPDATES.search(line)
            if found:
                self._validated(int(found.group(1)))
            return line
        found = self.UPDATES.search(line)
        if not found:
            return line
        done = int(found.group(1))
        per_update = self._per_update(line, done)
        if per_update is None:
            return line
        left = per_update * max(0, self.total - done) + self._validation_left(done)
        return f"{line} | eta {format_duration(left)}" + ("" if self.rounds else " + validation")

    def _per_update(self, line, done):
        now = self.clock()
        if self.first is None:
            self.first = (now, done)
            self.paused = 0.0
        start, start_done = self.first
        if done > start_done:
            return (now - start - self.paused) / (done - start_done)
        wall = self.WALL.search(line)
        return float(wall.group(1)) / done if wall and done else None

    def _validated(self, done):
        if self.validating_since is None:
            return
        seconds = self.clock() - self.validating_since
        self.validating_since = None
        self.rounds[done] = self.rounds.get(done, 0.0) + seconds
        if self.first is not None:
            self.paused += seconds

    def _validation_left(self, done):
        """The rounds still to come (every ``gap`` updates, and one at the end) times a round's seconds."""
        if not self.rounds or done >= self.total:
            return 0.0
        at = sorted(self.rounds)
        gap = at[-1] - at[-2] if len(at) > 1 else at[0]
        count = 1 if gap <= 0 else self.total // gap - done // gap + (self.total % gap != 0)
        return max(1, count) * sum(self.rounds.values()) / len(self.rounds)


class ConsoleFilter:
    """``tee``'s ``show`` for fairseq-train: the terminal gets its progress, not its setup. Shown: the
    training and validation lines, checkpoints loaded and saved, the end, and anything that is not an INFO
    line (warnings of fairseq's logger, errors, tracebacks). Hidden (train.log keeps them): the other INFO
    lines (the configuration, the model's repr with its lines, the data loaded) and Python warnings with
    their source line; the first hidden line is replaced by a note saying where they are."""

    LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| (\w+) \| ([\w.]+) \| (.*)$")
    PROGRESS = re.compile(
        r'^\{"epoch"|trainable params|Loaded checkpoint|Saved checkpoint|begin validation|'
        r"Stopping training|done training"
    )
    WARNING = re.compile(r"^\S+\.py:\d+: \w*Warning: ")

    def __init__(self, log):
        self.log, self.noted, self.in_model, self.after_warning = log, False, False, False

    def __call__(self, line):
        hide = self._hidden(line.rstrip("\n"))
        if hide and not self.noted:
            self.noted = True
            print(f"(fairseq's setup, the model and warnings: in {self.log})", flush=True)
        return not hide

    def _hidden(self, text):
        if self.in_model:  # the model's repr: to its closing parenthesis
            self.in_model = text != ")"
            return True
        if self.after_warning and text.startswith((" ", "\t")):
            return True
        self.after_warning = bool(self.WARNING.match(text))
        found = self.LOG_LINE.match(text)
        if self.after_warning or not found:
            return self.after_warning
        level, _, message = found.groups()
        self.in_model = level == "INFO" and message.endswith("(")
        return level == "INFO" and not self.PROGRESS.search(message)


def tee(cmd, log, progress=None, show=None, keep=False, hold=None):
    """Run ``cmd``; each line of its output goes to ``log`` (appended, flushed line by line) and to
    the terminal as it comes (``show(line)`` filters, ``progress`` annotates). Returns (seconds, the
    output if ``keep`` else its last lines). Ctrl-C reaches the command too (same process group);
    SIGTERM is passed on; either way the log keeps everything printed. ``hold``: a lock's file descriptor
    (or a list of them) the command inherits, so that it holds the lock as long as it runs."""
    cmd = [str(c) for c in cmd]
    print("+ " + shlex.join(cmd), flush=True)
    start = time.time()
    lines = [] if keep else deque(maxlen=30)
    refused = None  # the command's one-line error: said once, by run.sh (shown only if it was no refusal)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # fairseq logs to stdout: unbuffered, line by line
    with open(log, "a", encoding="utf-8") as f:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
            errors="replace",
            bufsize=1,
            pass_fds=() if hold is None else tuple(hold) if isinstance(hold, (list, tuple)) else (hold,),
            **child_process_options(),
        )
        interrupted = threading.Event()

        def on_interrupt(signum, frame):
            # Ctrl-C: a terminal sends it to the command too, so let the command finish its log and exit, and
            # read what it prints meanwhile; if only this process was interrupted, pass it on after 5 s. A
            # handler (not a KeyboardInterrupt caught around readline) holds wherever in the loop it lands.
            if interrupted.is_set():
                proc.send_signal(signal.SIGINT)  # a second Ctrl-C: at once
                return
            interrupted.set()
            passing_on = threading.Timer(5, lambda: proc.poll() is None and proc.send_signal(signal.SIGINT))
            passing_on.daemon = True
            passing_on.start()

        previous = signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signal.SIGTERM))
        previous_interrupt = signal.signal(signal.SIGINT, on_interrupt)
        try:
            for line in iter(proc.stdout.readline, ""):
                f.write(line)
                f.flush()
                lines.append(line)
                if refused is not None and (show is None or show(refused)):
                    sys.stdout.write(refused)  # more came after it: not the command's last word
                refused = line if ONE_LINE_ERROR.match(line) else None
                if refused is None and (show is None or show(line)):
                    text = line.rstrip("\n")
                    sys.stdout.write((progress.annotate(text) if progress else text) + "\n")
                    sys.stdout.flush()
            code = proc.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_interrupt)
    if interrupted.is_set() or code in (-signal.SIGINT, -signal.SIGTERM, 130):
        raise Interrupted(f"interrupted; {log} keeps the output; the same command resumes")
    if code == 2 and refused is not None:
        raise Refused(refused.split(": error: ", 1)[1].strip())
    if refused is not None and (show is None or show(refused)):
        sys.stdout.write(refused)
    if code:
        tail = "".join(list(lines)[-20:]).rstrip()
        raise RunError(f"command failed with exit code {code}: {cmd[0]} ... {tail and chr(10) + tail}")
    return time.time() - start, "".join(lines)


FAIRSEQ_LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq_cli's logging.basicConfig


class _Lines:
    """A text stream that appends what is written to a log file (flushed line by line) and keeps it."""

    def __init__(self, f):
        self.f, self.kept = f, []

    def write(self, text):
        self.f.write(text)
        self.f.flush()
        self.kept.append(text)
        return len(text)

    def flush(self):
        self.f.flush()


def tee_here(cmd, cli_main, log):
    """``tee(cmd, log, show=<nothing>, keep=True)`` for a console script run in this process: ``cli_main`` (the
    script's entry point; it reads ``sys.argv``, set to ``cmd`` meanwhile) instead of a new interpreter, which
    would spend about 5 s of CPU importing torch and fairseq again. The same ``+`` line, log, returned output and
    errors: its logging (fairseq's format, at INFO or $LOGLEVEL), prints and warnings go to ``log`` and nowhere
    else; its one-line refusal is a ``Refused``; another exit status or exception a ``RunError`` with the log's
    last lines (the traceback in the log); Ctrl-C or SIGTERM an ``Interrupted``. This process's own logging,
    argv and signal handlers are restored afterwards. For commands that leave no state behind (fairseq-validate
    scores a checkpoint); call it from the main thread (signal handlers)."""
    import contextlib
    import logging
    import traceback

    from fairseq_idpg.logs import setup_logs_shown

    cmd = [str(c) for c in cmd]
    print("+ " + shlex.join(cmd), flush=True)
    start = time.time()
    root = logging.getLogger()
    saved = root.handlers[:], root.level, sys.argv
    code = 0
    with open(log, "a", encoding="utf-8") as f:
        out = _Lines(f)
        handler = logging.StreamHandler(out)
        handler.setFormatter(logging.Formatter(FAIRSEQ_LOG_FORMAT, "%Y-%m-%d %H:%M:%S"))
        root.handlers, sys.argv = [handler], cmd
        root.setLevel(os.environ.get("LOGLEVEL", "INFO").upper())
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        previous_interrupt = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), setup_logs_shown():
                try:
                    cli_main()
                except SystemExit as e:  # as the interpreter ends: sys.exit("message") prints it, status 1
                    if isinstance(e.code, str):
                        out.write(e.code + "\n")
                    code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                except KeyboardInterrupt:
                    raise Interrupted(f"interrupted; {log} keeps the output; the same command resumes") from None
                except Exception:
                    traceback.print_exc(file=out)
                    code = 1
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_interrupt)
            root.handlers, level, sys.argv = saved
            root.setLevel(level)
    lines = "".join(out.kept).splitlines(keepends=True)
    refused = lines[-1] if lines and ONE_LINE_ERROR.match(lines[-1]) else None
    if code == 2 and refused is not None:
        raise Refused(refused.split(": error: ", 1)[1].strip())
    if code:
        tail = "".join(lines[-20:]).rstrip()
        raise RunError(f"command failed with exit code {code}: {cmd[0]} ... {tail and chr(10) + tail}")
    return time.time() - start, "".join(lines)


def call_here(cmd, main, log=print):
    """``call(cmd)`` for a Python script run in this process: ``main(argv)`` (the script's own, returning its exit
    status; ``argv`` = ``cmd`` after the interpreter and the script) instead of a new interpreter, which would spend
    about 5 s of CPU importing torch and fairseq again. The same ``+`` line and errors: its stderr is held and said
    after it (its one-line refusal as a ``Refused``, said once by run.sh); a crash is a ``RunError`` with the
    traceback on stderr; Ctrl-C or SIGTERM, which the script ends in its own words, an ``Interrupted``."""
    import contextlib
    import io
    import traceback

    cmd = [str(c) for c in cmd]
    log("+ " + shlex.join(cmd), flush=True)
    start = time.time()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(cmd[2:])
        except KeyboardInterrupt:
            code = 130
        except SystemExit as e:  # SIGTERM in a script's handlers (128 + 15), or sys.exit
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        except Exception:
            traceback.print_exc()
            code = 1
    said = err.getvalue().splitlines(keepends=True)
    refused = said.pop() if code == 2 and said and ONE_LINE_ERROR.match(said[-1]) else None
    sys.stderr.write("".join(said))
    if refused:
        raise Refused(refused.split(": error: ", 1)[1].strip())
    if code in (130, 128 + signal.SIGTERM):
        raise Interrupted(f"interrupted: {Path(cmd[1]).name}; the same command resumes")
    if code:
        raise RunError(f"command failed with exit code {code}: {shlex.join(cmd)}")
    return time.time() - start


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def call(cmd, log=print):
    """Run ``cmd`` (its output to the terminal); its one-line error is passed on as a ``Refused``, said once.
    Ctrl-C reaches the command too (same process group): it is given time to end in its own words (a data
    preparation keeps its finished parts), then run.sh says it was interrupted."""
    cmd = [str(c) for c in cmd]
    log("+ " + shlex.join(cmd), flush=True)
    start = time.time()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace", **child_process_options())
    try:
        _, err = proc.communicate()
    except KeyboardInterrupt:
        try:
            _, err = proc.communicate(timeout=30)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            _, err = proc.communicate()
        sys.stderr.write(err)
        raise RunError(
            f"interrupted: {Path(cmd[1]).name if len(cmd) > 1 else cmd[0]}; the same command resumes"
        ) from None
    said = err.splitlines(keepends=True)
    refused = said.pop() if proc.returncode == 2 and said and ONE_LINE_ERROR.match(said[-1]) else None
    sys.stderr.write("".join(said))
    if refused:
        raise Refused(refused.split(": error: ", 1)[1].strip())
    if proc.returncode in (-signal.SIGINT, 130):
        raise Interrupted(f"interrupted: {Path(cmd[1]).name if len(cmd) > 1 else cmd[0]}; the same command resumes")
    if proc.returncode:
        raise RunError(f"command failed with exit code {proc.returncode}: {shlex.join(cmd)}")
    return time.time() - start
