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
                                      # few_shot may name K per task: {default: 1000, CR: 775}
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

``--dry-run`` ends with the device-hours of the runs to run, per method and in all, and the wall time at the
executor's parallel slots, from measured seconds per update (``--timings FILE``: scripts/check_gpu.sh's file;
see fairseq_idpg/sweep_estimate.py and docs/sweeps.md).
"""

import argparse
import itertools
import json
import math
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import List, Optional

from fairseq_idpg.errors import SweepError
from fairseq_idpg.results.records import few_shot_budget
from fairseq_idpg.run import (
    IN_USE_EXIT,
    REPO,
    DamagedRecord,
    check,
    child_process_options,
    format_duration,
    format_lr,
    hash_note,
    plan,
    portable_hash,
    quiet,
    read_run_file,
    read_run_folder,
    warn_missing,
    work_dir_refusal,
)
from fairseq_idpg.run_config import RunConfig, RunError, canonical_task

SPEC_KEYS = {"name", "description", "model", "published", "tasks", "methods", "lrs", "seeds", "budget"}
SPEC_KEYS |= {"max_update", "args", "head_lrs"}
VARIANT_KEYS = {"label", "method", "args", "lrs", "head_lrs", "seeds", "tasks", "max_update"}
BUDGET_KEYS = {"few_shot", "data_seed", "dev_from_train"}


# ---------------------------------------------------------------------------------------- the specification
@dataclass(frozen=True)
class Run:
    """One cell entry: a run's request (a method on a task at one lr, seed and data budget) under its
    table label. ``run.task``, ``run.lr``, ... are the request's fields."""

    config: RunConfig  # lr None: the one run.sh chooses (the recipe's, the stand-in's fine-tuning lr)
    label: str
    table_budget: Optional[str] = None  # a per-task K's common name in tables, "K=1000 (CR: 775)"

    def __getattr__(self, name):
        if name == "config":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.config, name)

    @property
    def budget(self):
        """The budget's name in records and tables: full, K=<k>, dev<N> (or the spec's per-task name)."""
        if self.table_budget:
            return self.table_budget
        if self.few_shot is not None:
            return few_shot_budget(self.few_shot)
        return f"dev{self.dev_from_train}" if self.dev_from_train is not None else "full"

    @property
    def name(self):
        lr = f"lr{format_lr(self.lr)}" if self.lr is not None else "lr-recipe"
        lr += f".headlr{format_lr(self.head_lr)}" if self.head_lr is not None else ""
        if self.few_shot is not None:
            data = f"K={self.few_shot}.data{self.data_seed}."
        else:
            data = f"dev{self.dev_from_train}.data{self.data_seed}." if self.dev_from_train is not None else ""
        return f"{self.task}.{self.label}.{data}{lr}.seed{self.seed}"

    def request(self, model, work_dir, dry_run=False):
        """The run's request on ``model`` in ``work_dir``."""
        return replace(self.config, model=model, work_dir=str(work_dir), dry_run=dry_run)

    def argv(self, model, work_dir):
        """run.sh's command line."""
        return self.request(model, work_dir).argv()


@dataclass
class Spec:
    name: str
    path: Path
    description: str = ""
    model: str = "standin"
    published: Optional[str] = None
    runs: List[Run] = field(default_factory=list)


def _list(value, where, kind, least=None):
    """``value`` as a list whose items are each of ``kind`` (int: at least ``least``, when given)."""
    values = value if isinstance(value, list) else [value]
    for v in values:
        if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
            valid = f" (valid: integers >= {least})" if least is not None else ""
            raise SweepError(f"{where}: {v!r} is not an integer{valid}")
        if kind is int and least is not None and v < least:
            raise SweepError(f"{where}: {v!r} is too small (valid: integers >= {least})")
        if kind is float and not _positive(v):
            raise SweepError(f"{where}: {v!r} is not a positive number (valid: finite numbers > 0, e.g. 1e-3)")
        if kind is str and not isinstance(v, str):
            raise SweepError(f"{where}: {v!r} is not a name")
    return values


def _positive(value):
    """YAML 1.1 reads 5e-3 as text (a float needs a dot there): numbers in either form."""
    try:
        return not isinstance(value, bool) and math.isfinite(float(value)) and float(value) > 0  # not .inf, .nan
    except (TypeError, ValueError):
        return False


def _unknown(mapping, valid, where):
    extra = sorted(set(mapping) - valid)
    if extra:
        raise SweepError(f"{where}: unknown key {extra[0]!r}; valid: {', '.join(sorted(valid))}")


def _task(name, where):
    try:
        return canonical_task(str(name))
    except RunError as e:
        raise SweepError(f"{where}: {e}") from None


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _few_shot(value, tasks, where):
    """task -> [(K, its table budget name or None)]. ``value``: K, [K...], or per task
    ``{default: [100, 500, 1000], CR: [100, 500, 775]}`` (lists of one length): the i-th K of every
    task shares a table, named ``K=1000 (CR: 775)`` where a task's K differs from the default."""
    per_task = value if isinstance(value, dict) else {"default": value}
    per_task = {
        k if k == "default" else _task(k, where): _list(v, f"{where} ({k})", int, least=1) for k, v in per_task.items()
    }
    default = per_task.get("default")
    if default is None:
        missing = [t for t in tasks if t not in per_task]
        if missing:
            raise SweepError(f"{where} names no K for {missing[0]} (give it, or a default)")
        default = per_task[tasks[0]]
    if any(len(ks) != len(default) for ks in per_task.values()):
        raise SweepError(f"{where}: every task's list of K has the same length (the i-th K of each share a table)")
    names = []
    for i, k in enumerate(default):
        differ = [f"{t}: {ks[i]}" for t, ks in per_task.items() if t != "default" and ks[i] != k]
        names.append(few_shot_budget(k, differ) if differ else None)
    return {t: list(zip(per_task.get(t, default), names, strict=False)) for t in tasks}


def _lrs(value, method, task, where):
    """The learning rates a run list gets: the recipe's grid, its one lr (None), or the list given."""
    if value in (None, "paper"):
        recipe = method.recipe.for_task(task)
        return list(recipe.lr_grid) or [None]
    if value == "recipe":
        return [None]
    if isinstance(value, str):
        raise SweepError(f"{where}: lrs {value!r}; valid: paper, recipe, or a list of numbers")
    return [float(v) for v in _list(value, where, float)]


def _head_lrs(value, where):
    """The head lrs a run list gets: [None] (the recipe's, else the lr) or the list given."""
    return [None] if value is None else [float(v) for v in _list(value, where, float)]


def load_spec(path, model=None, tasks=None, methods=None, seeds=None, max_update=None):
    """The specification at ``path`` as its list of runs (``tasks``, ``methods``, ``seeds`` narrow it;
    ``model`` and ``max_update`` override it). SweepError names the key and what is valid."""
    path = Path(path)
    data = _read_spec(path)
    spec = Spec(str(data["name"]), path, str(data.get("description", "")), model or data.get("model", "standin"))
    spec.published = data.get("published")
    all_tasks = [_task(t, f"{path}: tasks") for t in _list(data["tasks"], path, str)]
    budgets = _budgets(data.get("budget", "full"), all_tasks, path)
    base_args = [str(a) for a in _list(data.get("args", []), f"{path}: args", object)] if data.get("args") else []
    labels = set()
    for entry in _list(data["methods"], f"{path}: methods", object):
        variant = _variant(entry, labels, path)
        where = f"{path}: {variant['label']}"
        run_tasks = [_task(t, where) for t in _list(variant["tasks"], where, str)] if "tasks" in variant else all_tasks
        updates = variant.get("max_update", data.get("max_update"))
        if updates is not None:
            _list(updates, f"{where}: max_update", int, least=1)
        common = {
            "seeds": [s for s in _list(variant.get("seeds", data.get("seeds", [1])), f"{where}: seeds", int, least=0)
                      if not seeds or s in seeds],
            "lrs": variant.get("lrs", data.get("lrs")),
            "head_lrs": _head_lrs(variant.get("head_lrs", data.get("head_lrs")), f"{where}: head_lrs"),
            "max_update": max_update if max_update is not None else updates,
            "args": base_args + [str(a) for a in variant.get("args", [])],
        }  # fmt: skip
        if methods and variant["label"] not in methods and variant["method"] not in methods:
            continue
        for task in run_tasks:
            if tasks and task not in tasks:
                continue
            spec.runs += _runs(spec.model, task, variant, budgets(task, where), where, **common)
    if not spec.runs:
        raise SweepError(f"{path}: no run left (check --tasks / --methods / --seeds)")
    return spec


class DuplicateKey(Exception):
    """A mapping of the specification names a key twice."""


def _unique_keys_loader():
    """YAML's safe loader, refusing a key written twice in one mapping: PyYAML keeps the last one silently,
    so a second ``seeds:`` would replace the first unseen."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    line = key_node.start_mark.line + 1
                    raise DuplicateKey(f"line {line}: the key {key!r} is written twice in one mapping (keep one)")
                if isinstance(key, (str, int, float, bool)):
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeys


def _read_spec(path):
    """The YAML mapping, its keys checked."""
    import yaml

    if not path.is_file():
        raise SweepError(f"{path}: no such specification file")
    try:
        data = yaml.load(path.read_text(), Loader=_unique_keys_loader())
    except DuplicateKey as e:
        raise SweepError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SweepError(f"{path}: a specification is a mapping with keys {', '.join(sorted(SPEC_KEYS))}")
    _unknown(data, SPEC_KEYS, str(path))
    for key in ("name", "tasks", "methods"):
        if not data.get(key):
            raise SweepError(f"{path}: {key!r} is missing")
    return data


def _budgets(budget, tasks, path):
    """``budgets(task, where)``: a task's data budgets, [{few_shot, dev_from_train, data_seed ("seed": the
    run's), name}]."""
    if budget == "full":
        return lambda task, where: [{}]
    if not isinstance(budget, dict):
        raise SweepError(f"{path}: budget {budget!r}; valid: full, or a mapping with few_shot or dev_from_train")
    _unknown(budget, BUDGET_KEYS, f"{path}: budget")
    if "few_shot" in budget and "dev_from_train" in budget:
        raise SweepError(f"{path}: budget: few_shot and dev_from_train exclude each other")
    data_seed = budget.get("data_seed", "seed")
    if data_seed != "seed":
        _list(data_seed, f"{path}: budget.data_seed", int, least=0)
    if "few_shot" in budget:
        few_shot = _few_shot(budget["few_shot"], tasks, f"{path}: budget.few_shot")

        def per_task(task, where):
            if task not in few_shot:  # a variant's own task
                raise SweepError(f"{where}: budget.few_shot names no K for {task} (add it to the spec's tasks)")
            return [{"few_shot": k, "data_seed": data_seed, "name": name} for k, name in few_shot[task]]

        return per_task
    if "dev_from_train" in budget:
        _list(budget["dev_from_train"], f"{path}: budget.dev_from_train", int, least=1)
        return lambda task, where: [{"dev_from_train": int(budget["dev_from_train"]), "data_seed": data_seed}]
    raise SweepError(f"{path}: budget needs few_shot or dev_from_train (or is 'full')")


def _variant(entry, labels, path):
    """A ``methods`` entry as a mapping with its method checked and its label (unique) set."""
    from fairseq_idpg.methods import METHODS

    variant = {"method": entry} if isinstance(entry, str) else entry
    if not isinstance(variant, dict):
        raise SweepError(f"{path}: methods: {entry!r} is neither a method name nor a mapping")
    _unknown(variant, VARIANT_KEYS, f"{path}: methods: {variant.get('label', variant.get('method'))}")
    name = variant.get("method")
    if name not in METHODS:
        raise SweepError(f"{path}: methods: unknown method {name!r}; valid: {', '.join(sorted(METHODS))}")
    label = str(variant.get("label", name))
    if label in labels:
        raise SweepError(f"{path}: methods: the label {label!r} is used twice (give variants their own label)")
    labels.add(label)
    return {**variant, "label": label}


def _runs(model, task, variant, budgets, where, seeds, lrs, head_lrs, max_update, args):
    """One variant's runs on one task: every budget x lr x head lr x seed."""
    from fairseq_idpg.methods import METHODS

    runs, name = [], variant["method"]
    for b in budgets:
        for lr, head_lr in itertools.product(_lrs(lrs, METHODS[name], task, f"{where}: lrs"), head_lrs):
            for seed in seeds:
                sample_seed = seed if b.get("data_seed") == "seed" else b.get("data_seed", 1)
                request = RunConfig(task, name, model, seed, lr=lr, head_lr=head_lr, few_shot=b.get("few_shot"),
                                    dev_from_train=b.get("dev_from_train"), data_seed=sample_seed,
                                    max_update=max_update)  # fmt: skip
                try:
                    request = request.with_flags(args)
                except RunError as e:
                    raise SweepError(f"{where}: args: {e}") from None
                runs.append(Run(request, variant["label"], b.get("name")))
    return runs


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
    return [m for run in distinct.values() for m in plan_run(run, model, work_dir, dry, decide=check)]


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


# ---------------------------------------------------------------------------------------- main
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
        tasks = [_task(t, "--tasks") for t in tasks]
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
    # run as fairseq_idpg.sweep, not __main__: sweep_estimate and results raise fairseq_idpg.sweep's
    # SweepError, which main must catch as the same class to say it in one line (not a traceback)
    from fairseq_idpg.logs import quiet_setup_logs
    from fairseq_idpg.sweep import main as module_main

    quiet_setup_logs()

    sys.exit(module_main())
