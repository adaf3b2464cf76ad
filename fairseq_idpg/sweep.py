"""A paper's table as one command: every run of a sweep specification, in parallel, on the local
devices or a Slurm cluster; finished runs skipped, interrupted ones resumed, failures listed.

    python -m fairseq_idpg.sweep examples/idpg/table1.yaml --model roberta.large --dry-run   # the plan, its hours
    python -m fairseq_idpg.sweep examples/idpg/table1.yaml --model roberta.large             # one run per GPU
    python -m fairseq_idpg.sweep examples/idpg/smoke.yaml --jobs 2                           # 2 CPU runs at a time
    python -m fairseq_idpg.sweep SPEC --executor slurm --partition P --gpus-per-run 1 --time 240 --mem 32
    python -m fairseq_idpg.results WORK/sweeps/<name>/records --published idpg-table1     # the table

A specification is a YAML file (``examples/*/``)::

    name: idpg-table1                 # logs and records go to WORK/sweeps/<name>/
    description: IDPG Table 1         # one line
    model: roberta.large              # standin | roberta.base | roberta.large | a folder (--model wins)
    published: idpg-table1            # the paper's table the results command puts beside (optional)
    tasks: [RTE, MRPC]
    methods:                          # method records, or variants of them
      - m-idpg-phm
      - {label: m-idpg-phm-pos1, method: m-idpg-phm, args: [--prompt-position, 1]}
    lrs: paper                        # paper (default): the recipe's grid; recipe: its one lr; or a list
    head_lrs: [5.0e-3, 1.0e-3]        # optional: the classification head's own lrs (--head-lr), a grid beside lrs
    seeds: [1, 2, 3, 4, 5]
    budget: full                      # or {few_shot: [100, 500, 1000], data_seed: seed} or {dev_from_train: N};
                                      # few_shot may name K per task: {default: 1000, CR: 775};
                                      # or {split_dev: true}: each dev set halved, one half selects, one scored
    max_update: 300                   # optional: every run's updates (smoke versions)
    args: []                          # optional: fairseq-train flags for every run

A variant (a mapping in ``methods``) may also set its own ``lrs``, ``head_lrs``, ``seeds``, ``tasks``,
``max_update``. A run is one ``scripts/run.sh TASK --method M --lr X --seed S ...`` (fairseq_idpg/run/),
whose folder is named by its configuration's hash: the sweep decides every run first (preparing
the data each needs, one folder at a time), skips those with a ``results.json`` or with a record of
the same configuration in the records folder (a study committed from another checkout: the run
folder's hash includes the model file's path, so the record is matched by its configuration without
paths), and starts the others; an interrupted run resumes from its ``checkpoint_last.pt`` the next
time. Each finished run's ``results.json`` is copied, with its label, to the records folder
(``--records``), which the results command reads.

Executors: ``local`` (default) runs one run per visible GPU (``CUDA_VISIBLE_DEVICES`` pinned per run;
``--runs-per-gpu K`` packs K runs on a device), or ``--jobs K`` CPU runs with the cores split between
them (``OMP_NUM_THREADS``); ``slurm`` submits a submitit job array (one task per run, or per group of runs
trained together with ``--fuse K``, at most ``--array-parallelism`` at a time) and follows it
(fairseq_idpg/sweep_slurm.py). A failed run's log tail is kept in
``WORK/sweeps/<name>/failures.json`` and listed at the end; the others go on.

The specification is read and expanded by ``fairseq_idpg/sweep_spec.py``; records, failures, the progress line and
the units a slot runs by ``fairseq_idpg/sweep_progress.py``, which both executors use; this module plans the runs,
runs the local executor and the command.

``--dry-run`` ends with the device-hours of the runs to run, per method and in all, and the wall time at the
executor's parallel slots, from measured seconds per update (``--timings FILE``: scripts/check_gpu.sh's file;
see fairseq_idpg/sweep_estimate.py and docs/sweeps.md).
"""

import argparse
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fairseq_idpg.errors import SweepError
from fairseq_idpg.run import (
    REPO,
    check,
    child_process_options,
    hash_note,
    plan,
    quiet,
    warn_missing,
    work_dir_refusal,
)
from fairseq_idpg.run_config import RunError
from fairseq_idpg.sweep_progress import (
    Failures,
    SweepProgress,
    damaged_note,
    damaged_runs,
    fused_line,
    fused_units,
    record,
    recorded,
    unit_command,
    unit_ended,
    watch,
)
from fairseq_idpg.sweep_spec import known_task, load_spec


# ---------------------------------------------------------------------------------------- planning
def plan_run(run, model, work_dir, dry, decide=lambda request: plan(request, log=quiet)):
    """The main job's plan of one run (its folder, configuration and commands), saying nothing; or what
    ``decide`` says of its request (``check``: what a dry run lacks); a refusal names the run."""
    try:
        return decide(run.request(model, work_dir, dry))
    except RunError as e:
        raise SweepError(f"{run.name}: {e}") from None


def check_runs(runs, model, work_dir, dry):
    """the main job's check of each distinct method and flags (the first run of each), before any data is prepared:
    a sweep is refused in one line before it writes anything (~0.2 s each). Returns what a dry run lacks."""
    distinct = {}
    for run in runs:
        request = run.request(model, work_dir, dry)
        distinct.setdefault((request.method, request.extra_args), run)
    return [m for run in distinct.values() for m in plan_run(run, model, work_dir, dry, decide=missing)]


def missing(request):
    """What a dry run of ``request`` lacks (``check``'s plan's), after ``check`` refused what cannot run."""
    return check(request).missing


def plan_line(run, p):
    c = p.config
    epochs = f"{c['epochs']:g} epochs = " if c["epochs"] is not None else ""
    return (
        f"{run.task:6} {run.label:22} {run.budget:7} lr {c['lr']:<8g} "
        + (f"head lr {c['head_lr']:<8g} " if "head_lr" in c else "")
        + f"seed {run.seed}  "
        f"batch {c['batch']}, {epochs}{c['updates']:,} updates  -> {p.folder}"
    )


def summary(spec, runs):
    """'10 tasks x 12 methods ... = N runs' with the count per method."""
    lines, by_label = [], {}
    for r in runs:
        by_label.setdefault(r.label, []).append(r)
    for label, rs in by_label.items():
        n_tasks, n_budgets = len({r.task for r in rs}), len({r.budget for r in rs})
        n_lrs, n_seeds = len({(r.lr, r.head_lr) for r in rs}), len({r.seed for r in rs})
        product = n_tasks * n_budgets * n_lrs * n_seeds
        shape = f"{n_tasks} task(s) x {n_lrs} lr(s) x {n_seeds} seed(s)" + (
            f" x {n_budgets} budgets" if n_budgets > 1 else ""
        )
        note = "" if product == len(rs) else " (lr grids differ per task)"
        lines.append(f"  {label:24} {shape} = {len(rs)} runs{note}")
    return f"{spec.name}: {len(runs)} runs ({len(by_label)} methods)\n" + "\n".join(lines)


# ---------------------------------------------------------------------------------------- local executor
def local_slots(jobs=None, runs_per_gpu=1, threads=None, gpus=None):
    """The environments of the parallel slots: one per visible GPU (x runs_per_gpu), else ``jobs`` CPU
    slots, the cores split between them."""
    if gpus is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            gpus = [g for g in visible.split(",") if g.strip() and g.strip() != "-1"]
        else:
            import torch

            gpus = [str(i) for i in range(torch.cuda.device_count())]
    cores = os.cpu_count() or 1
    if gpus:
        slots = [{"CUDA_VISIBLE_DEVICES": g} for g in gpus for _ in range(runs_per_gpu)]
        slots = slots[:jobs] if jobs else slots
    else:
        slots = [{"CUDA_VISIBLE_DEVICES": ""} for _ in range(jobs or 1)]
    per_run = threads or max(1, cores // len(slots))
    for s in slots:
        s.update(OMP_NUM_THREADS=str(per_run), MKL_NUM_THREADS=str(per_run))
    return slots


class LocalExecutor:
    """Runs the main job's processes (``python -m fairseq_idpg.run``) in ``slots`` in parallel; Ctrl-C or
    SIGTERM stops them (their logs and checkpoints stay; the same command resumes)."""

    def __init__(self, slots, logs):
        self.slots, self.logs = slots, Path(logs)
        self.procs, self.lock, self.stopping = set(), threading.Lock(), False

    def run_one(self, run, argv, free):
        env_extra = free.get()
        try:
            if self.stopping:
                return None
            self.logs.mkdir(parents=True, exist_ok=True)
            log = self.logs / f"{run.name}.log"
            with open(log, "a", encoding="utf-8") as f:
                f.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(argv)}  {env_extra}\n")
                f.flush()
                env = {**os.environ, **env_extra, "PYTHONUNBUFFERED": "1"}
                start = time.time()
                proc = subprocess.Popen(
                    argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO, **child_process_options()
                )
                with self.lock:
                    self.procs.add(proc)
                code = proc.wait()
                with self.lock:
                    self.procs.discard(proc)
            return code, time.time() - start, log
        finally:
            free.put(env_extra)

    def stop(self):
        self.stopping = True
        with self.lock:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)  # the main job passes it on; the checkpoints stay


def run_local(pending, opts, sweep_dir, progress, failures, records):
    slots = local_slots(opts.jobs, opts.runs_per_gpu, opts.threads)
    progress.slots = len(slots)
    where = ", ".join(sorted({s["CUDA_VISIBLE_DEVICES"] or "cpu" for s in slots}))
    print(f"local: {len(slots)} parallel run(s) on {where}, {slots[0]['OMP_NUM_THREADS']} CPU thread(s) each")
    free = queue.Queue()
    for s in slots:
        free.put(s)
    executor = LocalExecutor(slots, Path(sweep_dir) / "logs")

    def work(unit):
        run, argv = unit[0][0], unit_command(unit, opts)
        progress.update(
            started=len(unit), note=f"start {run.name}" + (f" + {len(unit) - 1} fused" if len(unit) > 1 else "")
        )
        watch(progress, unit, sweep_dir)
        try:
            outcome = executor.run_one(run, argv, free)
        finally:
            for member, _ in unit:
                progress.unwatch(member.name)
        if outcome is None:
            progress.update(started=-len(unit))
            return
        unit_ended(unit, argv, outcome, executor.stopping, progress, failures, records)

    previous = signal.signal(signal.SIGTERM, _interrupt)  # as Ctrl-C: stop the runs, keep their state
    pool = ThreadPoolExecutor(len(slots))
    futures = [pool.submit(work, unit) for unit in fused_units(pending, opts.fuse)]
    try:
        for f in futures:
            while True:
                try:
                    f.result(timeout=0.5)  # a short wait: Ctrl-C is seen at once
                    break
                except TimeoutError:
                    progress.heartbeat()
    except KeyboardInterrupt:
        executor.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    pool.shutdown(wait=True)


# ---------------------------------------------------------------------------------------- main
def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _refuse(message):
    raise SweepError(message)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/sweep.sh", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.error = _refuse  # one line, said as the sweep says its others (argparse prints the usage first)
    p.add_argument("spec", help="a sweep specification (YAML), e.g. examples/idpg/table1.yaml")
    p.add_argument("--model", help="override the specification's model")
    p.add_argument("--work-dir", default=str(REPO), help="data-bin/, checkpoints/ and sweeps/ (default: the checkout)")
    p.add_argument("--records", help="where finished runs' records go (default WORK/sweeps/<name>/records)")
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan (every run, its budget, the count); run nothing"
    )
    p.add_argument(
        "--timings",
        metavar="FILE",
        help="seconds per update for the plan's estimate: scripts/check_gpu.sh's "
        "file (default: checkpoints/gpu_check.json when present, then docs/data/seconds_per_update_cpu.csv)",
    )
    g = p.add_argument_group("narrow or override the specification")
    g.add_argument("--tasks", help="comma-separated tasks of the specification to run")
    g.add_argument("--methods", help="comma-separated labels (or method names) to run")
    g.add_argument("--seeds", help="comma-separated seeds to run")
    g.add_argument("--max-update", type=int, help="every run's updates")
    g = p.add_argument_group("local executor (default)")
    g.add_argument("--executor", choices=("local", "slurm"), default="local")
    g.add_argument("--jobs", type=int, help="parallel runs (default: one per visible GPU, else 1)")
    g.add_argument("--runs-per-gpu", type=int, default=1, help="runs packed on one GPU (default 1)")
    g.add_argument("--threads", type=int, help="CPU threads per run (default: the cores / parallel runs)")
    g.add_argument(
        "--fuse",
        type=int,
        default=1,
        metavar="K",
        help="train up to K runs that differ only in lr and seed together, on one frozen backbone: one "
        "forward and backward for all of them per update, each with its own folder, record and scores "
        "(frozen-backbone methods; default 1: each run alone)",
    )
    g = p.add_argument_group("slurm executor (submitit job array)")
    g.add_argument("--partition")
    g.add_argument("--account")
    g.add_argument("--qos")
    g.add_argument("--constraint")
    g.add_argument("--gpus-per-run", type=int, default=1)
    g.add_argument("--cpus-per-run", type=int, default=8)
    g.add_argument("--time", type=int, default=240, help="minutes per run (default 240)")
    g.add_argument("--mem", type=int, help="GB per run")
    g.add_argument("--array-parallelism", type=int, default=256, help="array tasks running at once (default 256)")
    g.add_argument("--poll", type=int, default=30, help="seconds between looks at the jobs' states (default 30)")
    opts = p.parse_args(argv)
    for flag in ("jobs", "runs_per_gpu", "threads", "fuse", "max_update", "time", "mem", "array_parallelism", "poll"):
        value = getattr(opts, flag)
        if value is not None and value < 1:
            raise SweepError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    if opts.gpus_per_run < 0 or opts.cpus_per_run < 1:
        raise SweepError("--gpus-per-run must be >= 0 and --cpus-per-run >= 1")
    try:  # a file, or a folder this user cannot write (a dry run writes nothing: it may read one)
        read_only = work_dir_refusal(Path(opts.work_dir))
    except RunError as e:
        raise SweepError(str(e)) from None
    if read_only and not opts.dry_run:
        raise SweepError(read_only)
    return opts


def split(text, kind=str):
    return [kind(x) for x in text.split(",") if x.strip()] if text else None


def main(argv=None):
    try:
        opts = parse_args(sys.argv[1:] if argv is None else argv)
        return sweep(opts)
    except SweepError as e:
        print(f"sweep: error: {e}", file=sys.stderr)
        return getattr(e, "exit_status", 2)  # 1: the cluster, not the input (sweep_slurm.ControllerDown)
    except KeyboardInterrupt:
        print("sweep: interrupted; finished runs are recorded, the same command resumes the rest", file=sys.stderr)
        return 130


def _narrowed_spec(opts):
    """The specification with --tasks, --methods, --seeds, --max-update and --model applied."""
    try:
        seeds = split(opts.seeds, int)
    except ValueError:
        raise SweepError(f"--seeds {opts.seeds!r}: comma-separated integers") from None
    tasks = split(opts.tasks)
    if tasks:
        tasks = [known_task(t, "--tasks") for t in tasks]
    return load_spec(opts.spec, opts.model, tasks, split(opts.methods), seeds, opts.max_update)


def _plan_runs(runs, model, opts):
    """[(run, plan)] for every run, in order; a line every 50 runs when preparing data takes a while."""
    plans = []
    for i, run in enumerate(runs):
        if not opts.dry_run and (i % 50 == 0):
            print(f"planning {i + 1}-{min(i + 50, len(runs))} of {len(runs)} ...", flush=True)
        plans.append((run, plan_run(run, model, opts.work_dir, opts.dry_run)))
        if plans[-1][1].note:  # a run found under the name it had before (``earlier_folder``)
            print(f"{run.name}: {plans[-1][1].note}", flush=True)
    return plans


def _print_plan(plans, elsewhere, pending, damaged):
    """The dry run's listing: every run with its state, then the counts."""
    for run, p in plans:
        state = "[damaged] " if run.name in damaged else "[finished] " if p.finished else ""
        print((state or ("[recorded] " if run.name in elsewhere else "")) + plan_line(run, p))
    finished = sum(1 for r, p in plans if p.finished and r.name not in damaged)
    updates = sum(p.config["updates"] for _, p in plans)
    print(
        f"{len(plans)} runs, {finished} finished, "
        + (f"{len(elsewhere)} recorded elsewhere, " if elsewhere else "")
        + (f"{len(damaged)} damaged (skipped), " if damaged else "")
        + f"{len(pending)} to run; {updates:,} updates in all"
    )
    note = hash_note([p for _, p in plans])
    if note:
        print(note)


def _record_earlier(finished, elsewhere, records, damaged):
    """Records of runs finished before (by this or another sweep, or run.sh); those of other checkouts named;
    the runs skipped for a damaged results.json or config.json, one line each."""
    for run, e in damaged.items():
        print(damaged_note(run, e), flush=True)
    for run, p in finished:
        record(run, p, records)
    for name, path in elsewhere.items():
        print(f"recorded: {name} finished in another checkout, not run again ({path})")


def _outcome(plans, spec, progress, failures, records, sweep_dir):
    """The closing lines (progress, where the records are, runs skipped or failed); the exit status."""
    for r, p in plans:  # an earlier failure of a run that has finished since (a rerun, a requeued job) is over
        if r.name in failures.items and p.finished:
            failures.set(r.name, None)
    failed = [r.name for r, _ in plans if r.name in failures.items]
    print(progress.line())
    print(f"records: {records}  (python -m fairseq_idpg.results {records}"
          + (f" --published {spec.published}" if spec.published else "") + ")")  # fmt: skip
    if progress.in_use:
        print(
            f"{progress.in_use} run(s) in use by another process (another sweep or run.sh), skipped: "
            "run this sweep again after it ends to record them"
        )
    if progress.damaged:
        print(
            f"{progress.damaged} run(s) skipped for a damaged results.json or config.json (named above): "
            "move each file away and run this sweep again"
        )
    if progress.cancelled:
        print(
            f"{progress.cancelled} run(s) cancelled (scancel): run this sweep again to train them (each resumes "
            "from its last checkpoint where it saved one)"
        )
    if failed:
        print(f"{len(failed)} run(s) failed (details in {sweep_dir / 'failures.json'}):")
        for name in failed:
            entry = failures.items[name]
            how = f"exit {entry['exit']}" if "exit" in entry else f"job {entry.get('job')} {entry.get('state', '?')}"
            cause = f": {entry['cause']}" if entry.get("cause") else ""
            print(f"  {name}: {how}, log {entry.get('log', entry.get('job'))}{cause}")
    return 1 if failed or progress.damaged or progress.cancelled else 0


def sweep(opts):
    from fairseq_idpg import sweep_estimate as estimate

    slots = local_slots(opts.jobs, opts.runs_per_gpu, opts.threads) if opts.executor == "local" else None
    parallel, device, where = estimate.parallelism(opts, slots)
    measured = estimate.sources(opts.timings, device)  # a bad --timings file: one line before anything runs
    spec = _narrowed_spec(opts)
    opts.model = spec.model
    if opts.executor == "slurm" and not opts.dry_run:
        from fairseq_idpg import sweep_slurm

        sweep_slurm.preflight(opts)  # the cluster's partition, GPUs, CPUs, memory, time limit: before any data
    sweep_dir = Path(opts.work_dir) / "sweeps" / spec.name
    records = Path(opts.records) if opts.records else sweep_dir / "records"
    print(summary(spec, spec.runs), flush=True)

    missing = check_runs(spec.runs, spec.model, opts.work_dir, opts.dry_run)
    # every run decided first: data prepared (one folder at a time), folders known, finished ones found
    plans = _plan_runs(spec.runs, spec.model, opts)
    damaged = damaged_runs(plans)  # skipped, said in one line each
    kept = [(r, p) for r, p in plans if r.name not in damaged]
    finished = [(r, p) for r, p in kept if p.finished]
    elsewhere = {r.name: path for r, p in kept if not p.finished and (path := recorded(r, p, records))}
    # seed by seed: an unfinished sweep's table has every cell's first seeds rather than some cells' all
    pending = sorted(
        ((r, p) for r, p in kept if not p.finished and r.name not in elsewhere), key=lambda item: item[0].seed
    )
    if opts.dry_run:
        _print_plan(plans, elsewhere, pending, damaged)
        units = fused_units(pending, opts.fuse) if opts.fuse > 1 else None
        if units is not None:
            print(fused_line(units))
        print(estimate.report(estimate.estimate(pending, spec.model, measured, device), parallel, where))
        if units is not None:  # the same runs trained together: each group's time over its measured speed-up
            rows, longest = estimate.fused_estimate(units, spec.model, measured, device)
            print(estimate.fused_report(rows, longest, opts.fuse, parallel, where))
        warn_missing(missing + [m for _, p in plans for m in p.missing], "sweep")
        return 0

    _record_earlier(finished, elsewhere, records, damaged)
    failures = Failures(sweep_dir / "failures.json")
    progress = SweepProgress(spec.name, len(plans), len(finished) + len(elsewhere), 1)
    progress.damaged = len(damaged)
    print(progress.line(), flush=True)
    if pending:
        if opts.executor == "local":
            run_local(pending, opts, sweep_dir, progress, failures, records)
        else:
            sweep_slurm.run_slurm(pending, opts, sweep_dir, progress, failures, records, measured, device)
    return _outcome(plans, spec, progress, failures, records, sweep_dir)


if __name__ == "__main__":
    from fairseq_idpg.logs import quiet_setup_logs

    quiet_setup_logs()
    sys.exit(main())
