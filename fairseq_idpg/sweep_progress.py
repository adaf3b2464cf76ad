"""Following a sweep's runs, whichever executor runs them: each finished run's record, the failures file, the
progress line (a line per change, a line a minute per running run, the eta), and the units a slot runs (one run, or
a group of runs trained together with ``--fuse``) with their commands."""

import json
import os
import re
import shlex
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from fairseq_idpg.run import (
    IN_USE_EXIT,
    DamagedRecord,
    format_duration,
    portable_hash,
    read_run_file,
    read_run_folder,
)


# ---------------------------------------------------------------------------------------- records
def record_dir(run, records):
    budget = re.sub(r"[^\w=.-]+", "_", run.budget).strip("_")  # "K=1000 (CR: 775)" -> "K=1000_CR_775"
    return Path(records) / budget / run.task / run.label


def record(run, p, records):
    """Copy the run's results.json to ``records/<budget>/<task>/<label>/<run folder>.json`` with its label."""
    result = read_run_file(p.folder / "results.json")  # DamagedRecord when half-written
    result.update(label=run.label, budget=run.budget)
    dest = record_dir(run, records) / f"{p.folder.name}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, dest)  # a record is complete or absent
    return result


def recorded(run, p, records):
    """The record of this run's configuration in ``records``, or None. Its file is named by the run folder
    of the checkout it ran in, whose hash includes that checkout's model path: the configurations are
    compared without paths (``portable_hash``), so a committed study resumes in a fresh clone. Before the data
    is prepared (a dry run), the configuration is that of the data it would prepare: a record equal to it is this
    run's (the same raw files give the same rows), though the folder's name is not known yet. A record made before
    config.json's extra_args left out the flags that change nothing has them as given: it is this run's too."""
    if p.config["model"]["sha256"] is None or p.config["data"]["provenance"] is None:
        return None
    prefix = p.folder.name.rsplit(".", 1)[0]  # lr<lr>.seed<seed>
    wanted = set()
    for config in (p.config, {**p.config, "extra_args": list(p.request.extra_args)}):
        by_file = json.loads(json.dumps(config, default=str))
        by_file["model"].pop("weights_sha256", None)  # a record made before the weights' digest: the same file
        wanted |= {portable_hash(config), portable_hash(by_file)}
    for path in sorted(record_dir(run, records).glob(f"{prefix}.*.json")):
        try:
            config = json.loads(path.read_text())["config"]
        except (ValueError, KeyError):
            continue  # not a record: never a match
        if portable_hash(config) in wanted:
            return path
    return None


def record_finished(run, p, records, progress, what, seconds=None):
    """Record a run that has just finished and say so; a damaged results.json: skipped, said in one line."""
    try:
        diverged = record(run, p, records).get("diverged")
    except DamagedRecord as e:
        progress.update(damaged=1, note=damaged_note(run.name, e))
        return
    note = f"diverged at update {diverged['update']}" if diverged else "done"
    progress.update(finished=1, seconds=seconds, diverged=int(bool(diverged)), note=f"{note} {what}")


def damaged_note(name, e):
    return f"skipped {name}: {e.path} is damaged ({e.why}); move it away and run the sweep again"


def damaged_runs(plans):
    """{run name: DamagedRecord} of the runs whose folder holds a damaged results.json or config.json
    (a half-written file): skipped by the sweep, neither run nor recorded."""
    damaged = {}
    for run, p in plans:
        try:
            if p.complete:
                read_run_folder(p.folder)
        except DamagedRecord as e:
            damaged[run.name] = e
    return damaged


class Failures:
    """WORK/sweeps/<name>/failures.json: run name -> exit code, log, command, last lines."""

    def __init__(self, path):
        self.path = Path(path)
        self.lock = threading.Lock()
        self.items = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def set(self, name, entry):
        with self.lock:
            if entry is None:
                self.items.pop(name, None)
            else:
                self.items[name] = entry
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.items, indent=1) + "\n")
            os.replace(tmp, self.path)


def tail(path, lines=20):
    try:
        return "".join(Path(path).read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return ""


def failure_cause(log, member=None):
    """The one line a failed run's main job ended with in its log, as run.sh says it alone (``run.sh: error:
    CAUSE``: CAUSE), or None. ``member``: the run folder's name of a run trained in a fused group, whose log is
    the group's: its own line there (``run.sh: error: <folder>: CAUSE``). Only the last attempt's lines are read
    (those after its ``# <time> <command>`` line: the log is appended to at each start)."""
    said = "run.sh: error: " + (f"{member}: " if member else "")
    for line in reversed(_last_lines(log, 65536)):
        if line.startswith(said):
            return line[len(said) :]
        if line.startswith("# "):
            return None
    return None


# ---------------------------------------------------------------------------------------- progress
class SweepProgress:
    """``[sweep NAME] 12/40 done (5 cached), 2 running, 1 failed, 25 left, eta 1h10m`` on each change, and
    while runs train, every ``every`` seconds of silence a line per running run with its update and eta
    (read from the run's log: run.sh's own ``| eta`` lines; a fused group's members from their own
    ``train.log``). Times are slot-seconds per run: a group of K runs that took T seconds in one slot counts
    K finished runs of T / K each."""

    def __init__(self, name, total, cached, slots, clock=time.monotonic, every=60):
        self.name, self.total, self.cached, self.slots, self.clock = name, total, cached, slots, clock
        self.done, self.running, self.failed, self.durations = cached, 0, 0, []
        self.diverged = 0  # of the done: results without a score (a NaN or inf loss), not failures
        self.in_use = 0  # skipped: another process (another sweep, run.sh) holds the run folder and records it
        self.damaged = 0  # skipped: a damaged results.json or config.json (said when found)
        self.cancelled = 0  # Slurm jobs cancelled (scancel): neither done nor failed; the next sweep runs them
        self.lock = threading.Lock()
        self.every, self.said = every, clock()
        self.watched = {}  # run name -> Watched

    def line(self):
        left = self.total - self.done - self.running - self.failed - self.in_use - self.damaged - self.cancelled
        per_run = self._seconds_per_run()
        eta = "?" if per_run is None else format_duration(per_run * (left + self.running / 2) / max(1, self.slots))
        return (
            f"[sweep {self.name}] {self.done}/{self.total} done ({self.cached} cached"
            + (f", {self.diverged} diverged" if self.diverged else "")
            + f"), {self.running} running, {self.failed} failed, "
            + (f"{self.in_use} in use elsewhere, " if self.in_use else "")
            + (f"{self.damaged} damaged, " if self.damaged else "")
            + (f"{self.cancelled} cancelled, " if self.cancelled else "")
            + f"{left} left, eta {eta}"
        )

    def _seconds_per_run(self):
        """The mean of the finished runs' times; before any: a running run's time so far plus its eta (for a
        member of a fused group of K: that over K, its share of the slot)."""
        if self.durations:
            return sum(self.durations) / len(self.durations)
        now = self.clock()
        guesses = [(now - w.since + eta) / w.fused for w, _, eta in self._running_states() if eta is not None]
        return sum(guesses) / len(guesses) if guesses else None

    def update(self, started=0, finished=0, failed=0, seconds=None, note="", diverged=0, in_use=0, damaged=0,
               cancelled=0):  # fmt: skip
        with self.lock:
            self.running += started - finished - failed - in_use - damaged - cancelled
            self.cancelled += cancelled
            self.in_use += in_use
            self.damaged += damaged
            self.done += finished
            self.diverged += diverged
            self.failed += failed
            if seconds is not None:
                self.durations.append(seconds)
            self._say(self.line() + (f"  {note}" if note else ""))

    def count_running(self, n):
        """``n`` more runs counted running (fewer when negative), without a line: an executor that learns of a start
        or an end later than it happened (Slurm's states) says it when it says how the run ended."""
        with self.lock:
            self.running += n

    def _say(self, text):
        self.said = self.clock()
        print(text, flush=True)

    def watch(self, name, log, fused=1, updates=None):
        """Follow a running run in its log: the sweep's log of it (run.sh's ``| eta`` lines), or for a member of
        a group of ``fused`` runs trained together, its own train.log and its ``updates`` (the eta is then the
        sweep's own, from the updates it sees done)."""
        with self.lock:
            self.watched[name] = Watched(name, Path(log), self.clock(), fused, updates)

    def unwatch(self, name):
        with self.lock:
            self.watched.pop(name, None)

    def _running_states(self):
        """(Watched, its last update or None, its eta in seconds or None) of each watched run."""
        for w in list(self.watched.values()):
            if w.updates is None:
                yield (w, *run_log_progress(w.log))
            else:
                yield (w, *w.member_progress(self.clock()))

    def heartbeat(self):
        """After ``every`` seconds without a line: one line per running run (its update and eta), then the total."""
        with self.lock:
            if not self.watched or self.clock() - self.said < self.every:
                return
            now = self.clock()
            for w, update, eta in self._running_states():
                where = f"update {update}" if update else "starting"
                where += f" of {w.updates:,}" if update and w.updates else ""
                left = f", eta {format_duration(eta)}" if eta is not None else ""
                fused = f", fused with {w.fused - 1}" if w.fused > 1 else ""
                print(f"  running {w.name}: {where}{left} ({format_duration(now - w.since)} so far{fused})", flush=True)
            self._say(self.line())


@dataclass
class Watched:
    """A running run the progress line follows: its log, when it started, the size of its fused group (1: alone)
    and, for a fused member, its updates in all and the first update the sweep saw done (when, which)."""

    name: str
    log: Path
    since: float
    fused: int = 1
    updates: Optional[int] = None
    first: Optional[tuple] = None

    def member_progress(self, now):
        """(the update, the seconds left) of a fused member from its train.log's last ``num_updates``: the
        updates left at the pace seen since the first look, or before a second one, fairseq's ``wall`` clock
        over its updates."""
        update, wall = train_log_progress(self.log)
        if update is None:
            return None, None
        if self.first is None or update < self.first[1]:  # (a member restarted from an earlier checkpoint)
            self.first = (now, update)
        at, seen = self.first
        per_update = (now - at) / (update - seen) if update > seen else wall / update if wall and update else None
        return update, None if per_update is None else per_update * max(0, self.updates - update)


RUN_LOG_PROGRESS = re.compile(r'num_updates"?[=: ]+"?(\d+).*\| eta (?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?')


def run_log_progress(log, tail=16384):
    """(the update, the seconds left) of a run's last ``| eta`` line in its log, or (None, None)."""
    for line in reversed(_last_lines(log, tail)):
        found = RUN_LOG_PROGRESS.search(line)
        if found:
            h, m, s = (int(x or 0) for x in found.group(2, 3, 4))
            return int(found.group(1)), h * 3600 + m * 60 + s
    return None, None


TRAIN_LOG_PROGRESS = re.compile(r'\bnum_updates"?[=: ]+"?(\d+)(?:.*\bwall"?[=: ]+"?([\d.]+))?')


def train_log_progress(log, tail=16384):
    """(the update, fairseq's wall seconds or None) of the last training line of a run's train.log (fairseq's
    own lines, as a fused member writes them), or (None, None)."""
    for line in reversed(_last_lines(log, tail)):
        found = TRAIN_LOG_PROGRESS.search(line)
        if found:
            return int(found.group(1)), float(found.group(2)) if found.group(2) else None
    return None, None


def _last_lines(path, tail):
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
            return f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []


# ---------------------------------------------------------------------------------------- units
def unit_ended(unit, argv, outcome, stopping, progress, failures, records):
    """Each run of a unit that ended (its process's exit code, seconds and log): recorded, in use elsewhere,
    failed, or (the sweep stopping) no longer running."""
    code, seconds, log = outcome
    for run, p in unit:
        if p.finished:
            failures.set(run.name, None)
            # a group of K in one slot: each member a finished run of a K-th of the slot's time
            share = seconds / len(unit)
            record_finished(run, p, records, progress, f"{run.name} ({format_duration(seconds)})", share)
        elif code == IN_USE_EXIT and not stopping:
            failures.set(run.name, None)
            progress.update(in_use=1, note=f"in use: {run.name} (another process trains it); skipped")
        elif not stopping:
            cause = failure_cause(log, p.folder.name if len(unit) > 1 else None)
            entry = {"exit": code, "log": str(log), "command": shlex.join(argv), "tail": tail(log)}
            failures.set(run.name, {**entry, **({"cause": cause} if cause else {})})
            progress.update(failed=1, note=f"FAILED {run.name} (exit {code}; {log})" + (f": {cause}" if cause else ""))
        else:
            progress.update(started=-1)


def watch(progress, unit, sweep_dir):
    """The progress line follows a unit's runs: a lone run in its sweep log, a fused group's members each in its
    own train.log (the group's output says nothing of their updates)."""
    if len(unit) == 1:
        progress.watch(unit[0][0].name, Path(sweep_dir) / "logs" / f"{unit[0][0].name}.log")
        return
    for run, p in unit:
        progress.watch(run.name, p.folder / "train.log", fused=len(unit), updates=p.config["updates"])


def fused_units(pending, k):
    """``pending`` [(run, plan)] as units of work: groups of up to ``k`` runs that may train together
    (``run.group.fusion_key``: the same fairseq-train command but for lr, seed and folder), in the order of
    their first run; a run whose method trains alone is a unit of one."""
    from fairseq_idpg.run.group import fusion_key

    groups = {}
    for item in pending:
        key = fusion_key(item[1]) if k > 1 else None
        groups.setdefault(key if key is not None else id(item), []).append(item)
    units = [items[i : i + k] for items in groups.values() for i in range(0, len(items), k)]
    first = {id(item): n for n, item in enumerate(pending)}
    return sorted(units, key=lambda unit: first[id(unit[0])])


def unit_command(unit, opts):
    """The main job's command for a unit of work: ``fairseq_idpg.run`` for one run, ``fairseq_idpg.run.group``
    for runs trained together (each its own folder and record)."""
    if len(unit) == 1:
        return [sys.executable, "-m", "fairseq_idpg.run", *unit[0][0].argv(opts.model, opts.work_dir)]
    members = [x for r, _ in unit for x in ("--member", shlex.join(r.argv(opts.model, opts.work_dir)))]
    return [sys.executable, "-m", "fairseq_idpg.run.group", *members]


def fused_line(units):
    together = [u for u in units if len(u) > 1]
    alone = sum(len(u) == 1 for u in units)
    return (
        f"fused: {sum(map(len, together))} run(s) in {len(together)} group(s) of up to "
        f"{max(map(len, together), default=0)} on one backbone each, {alone} alone"
    )
