"""A sweep's Slurm executor (``scripts/sweep.sh SPEC --executor slurm``): the cluster checked before anything is
submitted, the pending runs submitted as one submitit job array, and the jobs followed through Slurm's own
states until each ends.

- **Checked first** (``preflight``, ``check_time``): ``sbatch`` on PATH, the partition, the GPUs, CPUs and
  memory its nodes have, its time limit, and ``--time`` against the longest run's estimated time (the
  dry run's estimate). Each refusal is one line naming the flag and what is valid (exit 2), before any job.
- **Runs trained together** (``--fuse K``): a group (``sweep.fused_units``) is one array task running the group's
  command (``python -m fairseq_idpg.run.group``), its output in its first run's log; every run of it keeps its own
  folder and record, and is followed by the group's job.
- **Time limits and preemption**: Slurm signals each job a while before its limit (submitit's USR2); the
  array task then stops its run (SIGTERM: the run keeps its checkpoints) and requeues itself, and the
  requeued job resumes the run from its ``checkpoint_last.pt`` (a group: each run from its own). A job requeued
  by the cluster (``scontrol requeue``, preemption) resumes the same way.
- **Followed by Slurm's states** (``squeue``, which also lists finished jobs for a while; ``sacct`` when the
  cluster has accounting), not by submitit's result files, which a requeued job rewrites: a run counts as running
  while its job runs (a task held back by ``--array-parallelism`` is left), with the local executor's eta and
  per-run lines (``sweep.SweepProgress``); a job cancelled with ``scancel`` is reported as cancelled (at the
  update its checkpoint holds, where the next sweep resumes it), a failed one (a killed task, a node failure) as
  failed with its state, and a controller that stops answering ends the sweep in one line; the jobs stay queued.
  The same command again follows the jobs still queued or running (``sweeps/<name>/slurm/submitted.json``)
  instead of submitting them twice, and submits the rest; with every run finished it needs no controller.
"""

import json
import math
import os
import shutil
import subprocess
import time
from pathlib import Path

from fairseq_idpg.errors import SweepError
from fairseq_idpg.run import IN_USE_EXIT, REPO, format_duration
from fairseq_idpg.slurm_task import RunTask, carried_by_value

# states of a job that will still run (or run again): the sweep waits for them
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
          "RESIZING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT", "STOPPED"}  # fmt: skip
# of those, a job's run runs (or holds its slot); it waits in the queue (held back by --array-parallelism, requeued);
# or it has ended and the job is cleaning up (reported once Slurm says how it ended)
RUNNING = {"CONFIGURING", "RUNNING", "SIGNALING", "SUSPENDED", "STOPPED", "RESIZING"}
QUEUED = ACTIVE - RUNNING - {"COMPLETING", "STAGE_OUT"}
UNREACHABLE_POLLS = 3  # polls in a row without an answer before the sweep stops following


class ControllerDown(SweepError):
    """The controller does not answer: not the user's input (exit 1)."""

    exit_status = 1


def _slurm(*argv, timeout=60):
    """A Slurm command's output; ControllerDown when it cannot reach the controller."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ControllerDown(f"{argv[0]}: {e}") from None
    if done.returncode:
        said = (done.stderr or done.stdout).strip().splitlines() or [f"exit status {done.returncode}"]
        raise ControllerDown(f"{argv[0]}: {said[-1][:300]}")
    return done.stdout


# ---------------------------------------------------------------------------------------- checks
def preflight(opts, defer=True):
    """Refuse, in one line naming the flag, what the cluster cannot run; nothing is submitted yet. A controller
    that does not answer is said only when a run is to be submitted or followed (``defer``: ``run_slurm`` asks
    again), so a sweep whose runs all finished reports them without it."""
    if not (shutil.which("sbatch") and shutil.which("srun")):
        raise SweepError("--executor slurm: sbatch and srun not found on PATH (run it on a Slurm login node)")
    try:
        lines = _slurm("sinfo", "-h", "-o", "%P|%G|%c|%m|%l").split("\n")
    except ControllerDown as e:
        if defer:
            return
        raise SweepError(f"--executor slurm: the Slurm controller does not answer ({e})") from None
    parts = {}
    for line in filter(None, lines):
        name, gres, cpus, mem, limit = line.split("|")
        part = parts.setdefault(name.rstrip("*"), {"default": name.endswith("*"), "gpus": 0, "cpus": 0, "mem": 0})
        part["gpus"] = max(part["gpus"], _gpus(gres))
        part["cpus"] = max(part["cpus"], int(cpus.rstrip("+")))
        part["mem"] = max(part["mem"], int(mem.rstrip("+")) // 1024)
        part["limit"] = _minutes(limit)
    valid = ", ".join(sorted(parts))
    name = opts.partition or next((n for n, p in parts.items() if p["default"]), None)
    if name not in parts:
        asked = (
            f"--partition {opts.partition}: no such partition" if opts.partition else "no --partition and no default"
        )
        raise SweepError(f"{asked} on this cluster; valid: {valid}")
    part, where = parts[name], f"partition {name}'s nodes have"
    if opts.gpus_per_run > part["gpus"]:
        have = f"at most {part['gpus']} GPU(s)" if part["gpus"] else "no GPUs (gres gpu)"
        raise SweepError(f"--gpus-per-run {opts.gpus_per_run}: {where} {have}; valid: 0 to {part['gpus']}")
    if opts.cpus_per_run > part["cpus"]:
        raise SweepError(f"--cpus-per-run {opts.cpus_per_run}: {where} {part['cpus']} CPUs; valid: 1 to {part['cpus']}")
    if opts.mem is not None and opts.mem > part["mem"]:
        raise SweepError(f"--mem {opts.mem}: {where} {part['mem']} GB; valid: 1 to {part['mem']}")
    if part["limit"] is not None and opts.time > part["limit"]:
        raise SweepError(
            f"--time {opts.time}: partition {name}'s limit is {part['limit']} minutes; valid: 1 to {part['limit']}"
        )


def _gpus(gres):
    """GPUs per node in sinfo's %G: ``gpu:4``, ``gpu:a100:4(S:0-1)``, ``(null)``."""
    total = 0
    for item in gres.split(","):
        fields = item.split("(")[0].split(":")
        if fields[0] == "gpu" and fields[-1].isdigit():
            total += int(fields[-1])
    return total


def _minutes(limit):
    """sinfo's %l (``infinite``, ``30:00``, ``4:00:00``, ``1-00:00:00``) in minutes; None: no limit."""
    if limit in ("infinite", "n/a", "UNLIMITED"):
        return None
    days, _, clock = limit.rpartition("-")
    parts = [int(x) for x in clock.split(":")]
    seconds = {1: lambda: parts[0] * 60, 2: lambda: parts[0] * 60 + parts[1]}.get(len(parts), lambda: 0)()
    if len(parts) == 3:
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return (int(days or 0) * 86400 + seconds) // 60


def check_time(units, opts, model, measured, device):
    """``--time`` under the longest pending job's estimated time (the dry run's estimate; a group of runs trained
    together: its runs' time alone over the measured speed-up): refused in one line."""
    from fairseq_idpg import sweep_estimate as estimate

    longest = {}
    for unit in units:
        timed = estimate.unit_seconds(unit, model, measured, device)
        if timed and timed[0] > longest.get("seconds", 0):
            name = unit[0][0].name
            what = f"run ({name})" if len(unit) == 1 else f"group ({name} and {len(unit) - 1} fused, {timed[2]})"
            longest = {"seconds": timed[0], "what": what, "source": timed[1][0][2][1].split(":")[0]}
    if longest and opts.time * 60 < longest["seconds"]:
        need = math.ceil(longest["seconds"] / 60)
        raise SweepError(
            f"--time {opts.time}: the longest {longest['what']} needs about {format_duration(longest['seconds'])}"
            f" by the estimate ({longest['source']}; sweep.sh --dry-run shows it); valid: --time {need} or more"
        )


# ---------------------------------------------------------------------------------------- submitting
def executor(opts, sweep_dir):
    """submitit's Slurm executor with the run's resources."""
    import submitit

    ex = submitit.AutoExecutor(folder=Path(sweep_dir) / "slurm" / "%j", cluster="slurm")
    params = {
        "name": f"sweep-{Path(sweep_dir).name}",
        "timeout_min": opts.time,
        "gpus_per_node": opts.gpus_per_run,
        "cpus_per_task": opts.cpus_per_run,
        "tasks_per_node": 1,
        "nodes": 1,
        "slurm_array_parallelism": opts.array_parallelism,
        # the signal before the time limit: 90 s (submitit's), a quarter of a shorter limit
        "slurm_signal_delay_s": min(90, opts.time * 15),
    }
    if opts.mem is not None:
        params["mem_gb"] = opts.mem
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(opts, key):
            params[f"slurm_{key}"] = getattr(opts, key)
    ex.update_parameters(**params)
    return ex


def run_environment(opts):
    """What a run's process gets on its node, as the local executor gives it: torch's CPU threads from
    --cpus-per-run (Slurm bounds the CPUs a job may use, not the threads torch starts: a 1-CPU job ran 2, and
    thread count changes a run's sums, so its tensors), and no GPU for a CPU run."""
    threads = str(opts.cpus_per_run)
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    if not opts.gpus_per_run:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def submitted_file(sweep_dir):
    return Path(sweep_dir) / "slurm" / "submitted.json"


def submit(pending, opts, sweep_dir, units=None):
    """Submit ``pending`` [(run, plan)] as one job array, a task per unit of work (``units``, by default
    ``sweep.fused_units`` at ``--fuse``: a run alone, or a group trained together); returns [(run, plan, job id)].
    ``submitted.json`` names each run's job, a group's runs in its order (its first run's log is the group's)."""
    from fairseq_idpg.sweep_progress import fused_units, unit_command

    if not pending:
        return []
    units = fused_units(pending, opts.fuse) if units is None else units
    ex = executor(opts, sweep_dir)
    carried_by_value()  # the array task unpickles without importing this package (slurm_task.py)
    logs = Path(sweep_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with ex.batch():
        env = run_environment(opts)
        task = RunTask(tolerated=[IN_USE_EXIT])  # a run another process trains: skipped, as the local executor does
        jobs = [ex.submit(task, unit_command(unit, opts), str(logs / f"{unit[0][0].name}.log"), str(REPO), env)
                for unit in units]  # fmt: skip
    path = submitted_file(sweep_dir)
    known = json.loads(path.read_text()) if path.is_file() else {}
    ran = [(run, p, job.job_id) for unit, job in zip(units, jobs, strict=True) for run, p in unit]
    for run, _, _ in ran:
        known.pop(run.name, None)  # (named again in its new job's order)
    known.update({run.name: job for run, _, job in ran})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(known, indent=1) + "\n")
    os.replace(tmp, path)
    return ran


def job_logs(sweep_dir):
    """{job id: its log}: the log of the first run ``submitted.json`` names for it (a group's: its first run's)."""
    path = submitted_file(sweep_dir)
    logs = {}
    for name, job in (json.loads(path.read_text()) if path.is_file() else {}).items():
        logs.setdefault(job, Path(sweep_dir) / "logs" / f"{name}.log")
    return logs


def pick_up(pending, sweep_dir):
    """([(run, plan, job id)] of the runs whose earlier job is still queued or running, [(run, plan)] the rest)."""
    path = submitted_file(sweep_dir)
    known = json.loads(path.read_text()) if path.is_file() else {}
    ids = [known[r.name] for r, _ in pending if r.name in known]
    states = job_states(ids) if ids else {}
    alive, rest = [], []
    for run, p in pending:
        job = known.get(run.name)
        if job and states.get(job, ("", ""))[0] in ACTIVE:
            alive.append((run, p, job))
        else:
            rest.append((run, p))
    return alive, rest


# ---------------------------------------------------------------------------------------- following
def job_states(ids):
    """{job id: (state, reason)} of ``ids`` (``123_4`` for an array task): squeue's view (live jobs and, for a
    while, finished ones), then sacct's for the others where the cluster keeps accounting."""
    wanted = set(ids)
    states, arrays = {}, set()
    for line in _slurm("squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%r").splitlines():
        job, state, reason = (line.split("|") + ["", ""])[:3]
        arrays.add(job.split("_")[0])
        if job in wanted:
            states[job] = (state, reason)
    # a pending array task that scancel removed is gone from its array at once (only accounting keeps it)
    for job in wanted - set(states):
        if "_" in job and job.split("_")[0] in arrays:
            states[job] = ("CANCELLED", "cancelled while pending")
    missing = sorted(wanted - set(states))
    if missing and shutil.which("sacct"):
        try:
            out = _slurm("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(missing))
        except ControllerDown:
            out = ""  # no accounting on this cluster
        for line in out.splitlines():
            job, state = (line.split("|") + [""])[:2]
            if job in wanted:
                states[job] = (state.split()[0] if state else "", "")
    return states


def follow(jobs, progress, failures, records, sweep_dir, poll=30):
    """Wait for ``jobs`` [(run, plan, job id)], reporting each as it starts, is requeued and ends. A queued job
    (pending, held back by --array-parallelism, requeued) is counted as left, not running; between polls, the
    progress line's heartbeat (a line per running run after a minute without one). Ctrl-C stops waiting, not
    the jobs."""
    waiting = {}  # job -> [(run, plan)]: a group's runs share their job
    for run, p, job in jobs:
        waiting.setdefault(job, []).append((run, p))
    logs = job_logs(sweep_dir)
    began, phase = {}, {}  # job -> when first seen running (its runs' time); job -> running, queued or ending
    unanswered = 0
    while waiting:
        try:
            states = job_states(list(waiting))
            unanswered = 0
        except ControllerDown as e:
            unanswered += 1
            if unanswered >= UNREACHABLE_POLLS:
                raise ControllerDown(
                    f"the Slurm controller does not answer ({e}); {len(waiting)} job(s) stay as they were: "
                    "run the same command again to follow them"
                ) from None
            time.sleep(poll)
            continue
        # the jobs that stopped running first: no line counts a task that ended and the one it made room for
        for job, runs in sorted(waiting.items(), key=lambda item: states.get(item[0], ("",))[0] in RUNNING):
            state, reason = states.get(job, ("", ""))
            if state in ACTIVE:
                _moved(job, runs, state, phase, began, progress, sweep_dir)
                continue
            del waiting[job]
            _moved(job, runs, state, phase, began, progress, sweep_dir)
            progress.count_running(len(runs))  # the runs it reports ended were running (between two polls, if unseen)
            seconds = (progress.clock() - began[job]) / len(runs) if job in began else None
            log = logs.get(job, Path(sweep_dir) / "logs" / f"{runs[0][0].name}.log")
            _ended(job, runs, (state, reason), seconds, log, progress, failures, records, sweep_dir)
        if waiting:
            _wait(progress, poll)


def _moved(job, runs, state, phase, began, progress, sweep_dir):
    """A job seen starting (its runs counted running, watched for the heartbeat), ending (no longer counted), or
    back in the queue after it ran (requeued: a preemption, the time limit; it goes through COMPLETING first)."""
    from fairseq_idpg.sweep_progress import watch

    now = "running" if state in RUNNING else "queued" if state in QUEUED else "ending"
    was, phase[job] = phase.get(job), now
    if now == was:
        return
    names = runs[0][0].name + (f" + {len(runs) - 1} fused" if len(runs) > 1 else "")
    if was == "running":
        for run, _ in runs:
            progress.unwatch(run.name)
        if now == "ending":
            progress.count_running(-len(runs))
    if now == "running":
        began.setdefault(job, progress.clock())
        watch(progress, runs, sweep_dir)
        progress.update(started=len(runs), note=f"start {names} (job {job})")
    elif now == "queued" and was is not None:
        progress.update(started=-len(runs) if was == "running" else 0,
                        note=f"requeued: {names} (job {job}); resumes from its checkpoint")  # fmt: skip


def _ended(job, runs, state, seconds, log, progress, failures, records, sweep_dir):
    """Each run of a job that ended (Slurm's (state, reason); ``seconds``: each run's share of the job's time):
    recorded, cancelled, in use elsewhere, or failed."""
    from fairseq_idpg.sweep_progress import failure_cause, record_finished, tail

    state, reason = state
    for run, p in runs:
        if p.finished:
            failures.set(run.name, None)
            record_finished(run, p, records, progress, f"{run.name} (job {job})", seconds)
        elif state == "CANCELLED":
            failures.set(run.name, None)
            progress.update(cancelled=1, note=cancelled_note(run, p, job))
        elif state == "COMPLETED" and _returned(job, sweep_dir) == IN_USE_EXIT:
            failures.set(run.name, None)
            progress.update(in_use=1, note=f"in use: {run.name} (another process trains it); skipped")
        else:
            why = state or "no longer known to Slurm"
            why += f", {reason}" if reason and reason != "None" else ""
            entry = {"job": job, "state": why, "log": str(log), "tail": tail(log)}
            cause = failure_cause(log, p.folder.name if len(runs) > 1 else None)  # as the local executor says it
            failures.set(run.name, {**entry, **({"cause": cause} if cause else {})})
            said = f"FAILED {run.name} (job {job}: {why}; {log})" + (f": {cause}" if cause else "")
            progress.update(failed=1, note=said)


def cancelled_note(run, p, job):
    """A cancelled run's line: the update its checkpoint_last.pt holds, where the next sweep resumes it (the
    tensors are not read), or, with no checkpoint, not run."""
    from fairseq_idpg_compat import resume_checkpoint

    last = p.folder / "checkpoint_last.pt"
    found, updates, _ = resume_checkpoint(last) if last.is_file() else (None, None, None)
    if found is None:
        return f"cancelled: {run.name} (job {job}, scancel); not run"
    return f"cancelled: {run.name} (job {job}, scancel) at update {updates}; run the sweep again to resume it"


def _wait(progress, poll):
    """``poll`` seconds, the progress line's heartbeat on the way (it says nothing before a minute of silence)."""
    end = time.monotonic() + poll
    while (left := end - time.monotonic()) > 0:
        progress.heartbeat()
        time.sleep(min(left, 5))


def _returned(job, sweep_dir):
    """What the array task returned (submitit's result file), or None."""
    try:
        from submitit.core.utils import pickle_load

        folder = Path(sweep_dir) / "slurm" / job
        outcome, value = pickle_load(next(folder.glob(f"{job}_*_result.pkl")))[:2]
        return value if outcome == "success" else None
    except (StopIteration, OSError, ValueError):
        return None


def run_slurm(pending, opts, sweep_dir, progress, failures, records, measured, device):
    """The runs to run, on the cluster: the jobs of an earlier call still queued or running followed, the
    others submitted (``--time`` checked first), all followed to their end."""
    from fairseq_idpg.sweep_progress import fused_units

    preflight(opts, defer=False)  # the controller, now that runs are to be submitted or followed
    alive, rest = pick_up(pending, sweep_dir)
    units = fused_units(rest, opts.fuse)
    check_time(units, opts, opts.model, measured, device)
    jobs = alive + submit(rest, opts, sweep_dir, units)
    # the eta's parallel slots: the array's tasks at once (the queue may run fewer)
    progress.slots = max(1, min(opts.array_parallelism, len({job for _, _, job in jobs})))
    fused = sum(len(unit) for unit in units if len(unit) > 1)
    note = f"submitted {len(units)} job(s)" + (f" ({fused} runs fused in {sum(len(u) > 1 for u in units)} group(s))"
                                               if fused else "")  # fmt: skip
    following = len({job for _, _, job in alive})
    note += f", following {following} submitted before" if alive else ""
    ids = sorted({job.split("_")[0] for _, _, job in jobs})
    progress.update(note=f"{note} (slurm job {', '.join(ids)})")  # each counted running once seen running
    follow(jobs, progress, failures, records, sweep_dir, poll=opts.poll)
