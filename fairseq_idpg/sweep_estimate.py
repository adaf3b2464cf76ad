"""How long a sweep takes: device-hours per method and in all, and the wall time at the sweep's
parallelism, from measured seconds per update (``scripts/sweep.sh SPEC --dry-run``).

A run's time is its updates x seconds per update, the measurement's seconds scaled to the run's
work, linear in the tokens an update processes (an assumption the output states)::

    s_run = s_measured * (B_run * T_run) / (B_measured * T_measured)      B: batch, T: tokens per sample

T_run is the mean length of the run's prepared train set (fairseq's dataset sizes); where the data is
not prepared yet, the measurement's T (the count of such runs is printed). Wall time = device-hours /
parallel slots, as if every slot were busy until the last run ends (full packing).

Where the seconds per update come from, first found wins:

1. the GPU check's timings file (``scripts/check_gpu.sh`` writes it): ``--timings FILE``, else
   ``TIMINGS`` when present; JSON ``{"device", "model", "seconds_per_update": [{"method",
   "precision", "batch_size", "tokens_per_sample", "seconds"}]}``, for the machine it ran on (its
   ``step:NAME`` and ``peft:NAME`` entries, one process's loop against PEFT, are not fairseq-train's
   updates: no run matches them);
2. for a GPU sweep, the committed GPU checks ``GPU_CHECKS`` (docs/data/gpu_check/*.json: the check's
   file from GPUs this project was lent, by device and model, e.g. an H200 at roberta.large size);
3. the committed table ``TABLE`` (docs/data/seconds_per_update_cpu.csv: measured CPU seconds per
   update by device and model), its rows of the sweep's kind of device (CPU or GPU) only.

Within a source, the run's method at the run's precision, then a method of its architecture (the
records of one ``arch``, e.g. ``roberta_blocks``), then either at another precision. A model with no measurement
gets no hours: the row says which check to run instead of guessing.

Runs trained together (``--fuse K``): a group of K runs costs their time alone divided by the speed-up measured
for such a group (``FUSED_SPEEDUPS``: the figures of docs/benchmarks.md, by the device the per-update times were
measured on, the method or its architecture, and the largest measured group size not above the group's); where
none applies, no speed-up is assumed and the row says "unmeasured".
"""

import csv
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from fairseq_idpg.errors import SweepError
from fairseq_idpg.layout import REPO
from fairseq_idpg.run import format_duration

TIMINGS = REPO / "checkpoints" / "gpu_check.json"  # scripts/check_gpu.sh's default --out, read when present
TABLE = REPO / "docs" / "data" / "seconds_per_update_cpu.csv"
GPU_CHECKS = REPO / "docs" / "data" / "gpu_check"  # committed check files, one per GPU and model
ENTRY_KEYS = ("method", "precision", "batch_size", "tokens_per_sample", "seconds")
TIMINGS_SHAPE = (
    'valid: JSON written by scripts/check_gpu.sh, {"device": str, "model": str, "seconds_per_update": '
    '[{"method", "precision", "batch_size", "tokens_per_sample", "seconds"}]}'
)
GPU_NAMES = re.compile(r"cuda|nvidia|gpu|tesla|radeon|instinct", re.IGNORECASE)
ASSUMPTION = (
    "seconds per update scale linearly with an update's tokens, batch x tokens per sample (the run's "
    "against the measurement's)"
)


@dataclass(frozen=True)
class Measurement:
    """Measured seconds per update of one method at one precision, batch and length."""

    device: str
    model: str
    method: str
    precision: str
    batch_size: int
    tokens_per_sample: int
    seconds: float
    source: str  # the file it was read from

    @property
    def tokens(self):
        return self.batch_size * self.tokens_per_sample


def device_kind(name):
    """'cuda' for a GPU's name (``torch.cuda.get_device_name``, 'cuda'), else 'cpu'."""
    return "cuda" if GPU_NAMES.search(name) else "cpu"


def architecture(method):
    """``method``'s record's architecture, shared by the records it can stand in for (None for a name that
    is no record)."""
    from fairseq_idpg.methods import METHODS

    return METHODS[method].arch if method in METHODS else None


def _shown(path):
    path = Path(path)
    return str(path.relative_to(REPO)) if path.is_absolute() and path.is_relative_to(REPO) else str(path)


# ---------------------------------------------------------------------------------------- the sources
def read_timings(path, flag="--timings"):
    """The GPU check's measurements; SweepError (one line naming ``flag``) for a file that is not one."""
    where = f"{flag} {path}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise SweepError(f"{where}: cannot be read ({e.strerror or e}); {TIMINGS_SHAPE}") from None
    except ValueError as e:
        raise SweepError(f"{where}: not JSON ({e}); {TIMINGS_SHAPE}") from None
    entries = data.get("seconds_per_update") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(data.get(k), str) for k in ("device", "model")):
        raise SweepError(f"{where}: needs device, model and a seconds_per_update list; {TIMINGS_SHAPE}")
    return [_measurement(e, data, _shown(path), f"{where}: seconds_per_update[{i}]") for i, e in enumerate(entries)]


def _measurement(entry, top, source, where):
    """One entry of the check's file (its device and model: the file's unless the entry names them)."""
    missing = [k for k in ENTRY_KEYS if not isinstance(entry, dict) or k not in entry]
    if missing:
        raise SweepError(f"{where} has no {missing[0]!r}; {TIMINGS_SHAPE}")
    try:
        sizes = int(entry["batch_size"]), int(entry["tokens_per_sample"]), float(entry["seconds"])
        valid = all(v > 0 and math.isfinite(v) for v in sizes)
    except (TypeError, ValueError):
        valid = False
    if not valid:
        raise SweepError(
            f"{where}: batch_size, tokens_per_sample and seconds must be positive numbers; {TIMINGS_SHAPE}"
        )
    device, model = str(entry.get("device", top["device"])), str(entry.get("model", top["model"]))
    return Measurement(device, model, str(entry["method"]), str(entry["precision"]), *sizes, source)


def read_table(path=None):
    """The committed table's rows (CPU seconds per update of one thread); [] when it is not there."""
    path = Path(path or TABLE)
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    source = f"{_shown(path)} (1 thread)"
    try:
        return [Measurement(r["device"], r["model"], r["method"], r["precision"], int(r["batch_size"]),
                            int(r["tokens_per_sample"]), float(r["seconds_per_update_cpu"]), source)
                for r in rows if r.get("seconds_per_update_cpu")]  # fmt: skip
    except (KeyError, TypeError, ValueError) as e:
        raise SweepError(f"{path}: a row lacks or misstates {e}; columns: device, model, method, precision, "
                          "batch_size, tokens_per_sample, seconds_per_update_cpu, ...") from None  # fmt: skip


def sources(timings=None, device="cpu"):
    """[measurements of one source] in the order they are asked: the check's file (``timings``, else
    ``TIMINGS`` when present), for a GPU sweep the committed GPU checks, then the table's rows of
    ``device``'s kind. A bad file: SweepError."""
    found = []
    if timings is not None:
        found.append(read_timings(timings))
    elif TIMINGS.is_file():
        found.append(read_timings(TIMINGS, flag="the GPU check's file"))
    if device_kind(device) == "cuda":
        found += [read_timings(f, flag="the committed GPU check") for f in sorted(GPU_CHECKS.glob("*.json"))]
    return found + [[m for m in read_table() if device_kind(m.device) == device_kind(device)]]


def parallelism(opts, slots=None):
    """(parallel slots, their device, in words) of the sweep's executor; ``slots``: the local
    executor's (``sweep.local_slots``)."""
    if opts.executor == "slurm":
        device = "cuda" if opts.gpus_per_run else "cpu"
        return opts.array_parallelism, device, f"slurm: --array-parallelism, {opts.gpus_per_run} GPU(s) per run"
    gpus = sorted({s["CUDA_VISIBLE_DEVICES"] for s in slots} - {""})
    if not gpus:
        return len(slots), "cpu", f"local: {len(slots)} CPU run(s), {slots[0]['OMP_NUM_THREADS']} thread(s) each"
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cuda"
    return len(slots), device, f"local: {len(gpus)} GPU(s) x {len(slots) // len(gpus)} run(s) each"


# ---------------------------------------------------------------------------------------- a run's share
def precision(request):
    """fp32, fp16, bf16, memory-efficient-fp16 or memory-efficient-bf16: the run's mixed precision."""
    for name in ("memory-efficient-bf16", "memory-efficient-fp16"):  # fairseq-train flags: in extra_args
        if f"--{name}" in request.extra_args:
            return name
    return "bf16" if request.bf16 else "fp16" if request.fp16 else "fp32"


def lookup(measured, model, method, prec, batch):
    """(measurement, how it matched) for a run, or None. Levels: method at the precision, its architecture
    at the precision, method at another, architecture at another; among several, the closest batch size."""
    mine = [m for m in measured if m.model in (model, Path(model).name)]
    base = prec.replace("memory-efficient-", "")
    for same_precision in (True, False):
        for by_architecture in (False, True):
            hits = [m for m in mine if (m.precision in (prec, base)) == same_precision
                    and (architecture(m.method) == architecture(method) if by_architecture
                         else m.method == method)]  # fmt: skip
            if hits:
                hits.sort(key=lambda m: abs(math.log(m.batch_size / batch)))
                how = f"{hits[0].method} (arch {architecture(method)})" if hits[0].method != method else method
                return hits[0], how
    return None


@lru_cache(maxsize=None)
def tokens_per_sample(data):
    """Mean tokens per train example of a prepared data folder: input0 (+ input1) as binarized, each with its
    </s>, plus <s> (and the second </s> of a pair); None when it is not prepared."""
    from fairseq.data import indexed_dataset

    parts = [Path(data) / f"input{i}" / "train" for i in (0, 1)]
    parts = [p for p in parts if Path(f"{p}.idx").is_file()]
    # each dataset is kept while its sizes, a view of its memory-mapped file, are read
    datasets = [indexed_dataset.MMapIndexedDataset(str(p)) for p in parts]
    return sum(float(d.sizes.mean()) + 1 for d in datasets) if datasets else None


def run_seconds(run, p, model, found, device):
    """(seconds, where they come from, whether the run's own tokens per sample were known) of one planned
    run, or None when no source has a measurement for it."""
    prec, batch = precision(run.config), p.config["batch"]
    hit = next(filter(None, (lookup(ms, model, run.method, prec, batch) for ms in found)), None)
    if hit is None:
        return None
    m, how = hit
    tokens = tokens_per_sample(str(p.data))
    per_update = m.seconds * batch * (tokens or m.tokens_per_sample) / m.tokens  # linear in an update's tokens
    prec_note = m.precision if m.precision == prec else f"{m.precision} (run: {prec})"
    other = "" if device_kind(m.device) == device_kind(device) else f" (this sweep: {device})"
    source = (f"{m.source}: {m.device}, {m.model}, {prec_note}, {how} at batch {m.batch_size} x "
              f"{m.tokens_per_sample} tokens = {m.seconds:.4g} s/update{other}")  # fmt: skip
    return p.config["updates"] * per_update, source, tokens is not None, m


# ---------------------------------------------------------------------------------------- runs trained together
FUSED_SOURCE = 'docs/benchmarks.md, "Runs trained together on one backbone"'


@dataclass(frozen=True)
class FusedSpeedup:
    """A measured speed-up of K runs trained together (``--fuse K``): their time one after another over their
    time as one group."""

    device: str  # the device it was measured on: 'cpu' (any CPU), or a GPU's model as in its name ('H100')
    method: str
    k: int
    factor: float
    what: str  # what was timed, on what

    def matches(self, device):
        return device_kind(device) == "cpu" if self.device == "cpu" else self.device.lower() in device.lower()


_H100_STEP = "the training step only, NVIDIA H100, roberta.large's shape, bf16, batch 16 x 128"
_CPU_WALL = "updates per second of whole runs, stand-in's shape (6 x 384), fp32, batch 16 x 64, one CPU thread"
# on a CPU, K = 1, 4, 20: a fused update costs more than the K lone ones (the fused batch leaves the caches)
_CPU_FIGURES = {"prompt-tuning-5": (0.83, 0.86, 0.58), "m-idpg-phm": (0.87, 0.88, 0.74), "lora": (0.82, 0.83, 0.77),
                "prefix-tuning": (0.79, 0.75, 0.63), "bitfit": (0.95, 0.96, 0.84)}  # fmt: skip
# every figure measured so far (FUSED_SOURCE); a device, method or group size not here: unmeasured
FUSED_SPEEDUPS = (
    *(FusedSpeedup("cpu", method, k, factor, _CPU_WALL)
      for method, factors in _CPU_FIGURES.items() for k, factor in zip((1, 4, 20), factors, strict=True)),
    FusedSpeedup("H100", "prompt-tuning-5", 4, 2.08, _H100_STEP),
    FusedSpeedup("H100", "prompt-tuning-5", 20, 2.31, _H100_STEP),
    FusedSpeedup("H100", "lora", 4, 1.68, _H100_STEP),
    FusedSpeedup("H100", "lora", 20, 3.03, _H100_STEP),
    FusedSpeedup("H100", "m-idpg-phm", 4, 1.99, _H100_STEP),
    FusedSpeedup("H100", "m-idpg-phm", 20, 3.12, _H100_STEP),
)  # fmt: skip


def fused_speedup(method, k, measured_on, table=FUSED_SPEEDUPS):
    """(speed-up, what it is) for a group of ``k`` runs of ``method`` whose per-update time was measured on
    ``measured_on``: the figure of the method, else of its architecture, on that device at the largest measured
    group size not above ``k``; (1.0, 'unmeasured ...') where none applies."""
    here = [f for f in table if f.matches(measured_on) and f.k <= k]
    for by_architecture in (False, True):
        hits = [f for f in here if (architecture(f.method) == architecture(method) if by_architecture
                                    else f.method == method)]  # fmt: skip
        if hits:
            f = max(hits, key=lambda f: f.k)
            how = f"{f.method} (arch {architecture(method)})" if f.method != method else f.method
            return f.factor, f"{f.factor:.2f}x ({how}, K={f.k}: {f.what})"
    return 1.0, f"unmeasured (no speed-up assumed: none for {method} in groups of {k} or fewer on {measured_on})"


def unit_seconds(unit, model, found, device):
    """(seconds, [(run, its share, its source)], what the speed-up is) of a unit of work (``sweep.fused_units``:
    one run, or a group trained together: its runs' time alone over the measured speed-up), or None when a run
    has no measurement."""
    shares = [run_seconds(run, p, model, found, device) for run, p in unit]
    if any(share is None for share in shares):
        return None
    factor, what = 1.0, "alone"
    if len(unit) > 1:
        factor, what = fused_speedup(unit[0][0].method, len(unit), shares[0][3].device)
    runs = [(run, share[0] / factor, share) for (run, _), share in zip(unit, shares, strict=True)]
    return sum(share for _, share, _ in runs), runs, what


@dataclass
class FusedRow:
    """One label's runs to run with --fuse: their groups and the speed-ups used."""

    label: str
    runs: int = 0
    groups: int = 0  # groups of two or more runs (the others train alone)
    alone: int = 0
    seconds: Optional[float] = 0.0  # None: no measurement
    speedups: dict = None  # what the speed-up is -> groups it was used for


def fused_estimate(units, model, found, device):
    """(rows per label, the longest unit's seconds) over ``units`` (``sweep.fused_units``): each run its time alone
    over its group's speed-up."""
    rows, longest = {}, 0.0
    for unit in units:
        timed = unit_seconds(unit, model, found, device)
        longest = max(longest, timed[0] if timed else 0.0)
        for i, (run, _) in enumerate(unit):
            row = rows.setdefault(run.label, FusedRow(run.label, speedups={}))
            row.runs += 1
            if timed is None:
                row.seconds = None
            elif row.seconds is not None:
                row.seconds += timed[1][i][1]
            row.alone += len(unit) == 1
            if len(unit) > 1 and (i == 0 or unit[i - 1][0].label != run.label):
                row.groups += 1
                what = timed[2] if timed else "no measurement"
                row.speedups[what] = row.speedups.get(what, 0) + 1
    return list(rows.values()), longest


def fused_report(rows, longest, k, slots, where):
    """The estimate with --fuse: per label its runs, groups, device-hours and the speed-ups used; the total; the
    wall time."""
    lines = [f"estimate with --fuse {k} (a group's time: its runs' time alone / the speed-up measured for such a "
             f"group, {FUSED_SOURCE}; unmeasured: none assumed):",
             f"  {'method':24} {'runs':>6} {'groups':>6} {'device-hours':>13}  speed-up"]  # fmt: skip
    for r in rows:
        shown = hours(r.seconds) if r.seconds is not None else "-"
        used = [f"{what} for {n} group(s)" for what, n in r.speedups.items()]
        used = "; ".join(used + ([f"{r.alone} run(s) alone"] if r.alone else []))
        lines.append(f"  {r.label:24} {r.runs:>6,} {r.groups:>6,} {shown:>13}  {used}")
    measured = [r for r in rows if r.seconds is not None]
    total = sum(r.seconds for r in measured)
    shown = hours(total) if measured else "-"
    lines.append(f"  {'total':24} {sum(r.runs for r in rows):>6,} {sum(r.groups for r in rows):>6,} {shown:>13}")
    lines.append(wall_time(total, longest, slots, where, longest_what="run or group"))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- the estimate
@dataclass
class Row:
    """One label's (a table row's) runs to run."""

    label: str
    runs: int = 0
    updates: int = 0
    seconds: Optional[float] = 0.0  # None: no measurement
    longest: float = 0.0  # the longest run's seconds
    source: str = ""
    unprepared: int = 0  # runs whose tokens per sample are the measurement's
    measured_on: tuple = ()  # (file, device) of the measurement its hours scale


def estimate(plans, model, found, device):
    """Rows per label over ``plans`` [(run, plan)], from ``found`` (``sources``) for runs on ``device``."""
    rows = {}
    for run, p in plans:
        row = rows.setdefault(run.label, Row(run.label))
        row.runs += 1
        row.updates += p.config["updates"]
        share = run_seconds(run, p, model, found, device)
        if share is None:  # a label's runs share model, method and precision: all or none are measured
            row.seconds = None
            row.source = (f"no measurement for model {model} on this device ({device}): "
                          f"run scripts/check_gpu.sh --model {model}")  # fmt: skip
        elif row.seconds is not None:
            seconds, row.source, own_tokens, m = share
            row.measured_on = (m.source, m.device)
            row.seconds += seconds
            row.longest = max(row.longest, seconds)
            row.unprepared += not own_tokens
    return list(rows.values())


def hours(seconds):
    return f"{seconds / 3600:,.2f}"


def span(seconds):
    """3h05m, or 12.4 days."""
    return format_duration(seconds) if seconds < 2 * 86400 else f"{seconds / 86400:,.1f} days"


def wall_time(total, longest, slots, where, longest_what="run"):
    """Device-hours over the parallel slots, and never less than the longest run (full packing assumed)."""
    if not total:
        return f"wall time: unknown (no run has a measurement) at {slots} parallel slot(s) ({where})"
    wall = max(total / slots, longest)
    return (f"wall time at {slots} parallel slot(s) ({where}): {hours(wall)} h = {span(wall)} (device-hours / "
            f"slots, at least the longest {longest_what}'s {span(longest)}; assumes full packing: every slot busy "
            "until the last run ends)")  # fmt: skip


def measured_where(rows):
    """One line saying where the per-update times come from: which files, measured on which devices, and, for
    a CPU measurement, that the hours are a CPU's (the GPU check's file gives a GPU's)."""
    places = dict.fromkeys(r.measured_on for r in rows if r.measured_on)
    if not places:
        return "per-update times: none measured for these runs"
    shown = "; ".join(f"{file}, measured on {device}" for file, device in places)
    if all(device_kind(device) == "cpu" for _, device in places):
        return (f"per-update times: CPU measurements ({shown}) scaled to each run: these are CPU-hours, not a "
                "GPU's; for GPU-hours give --timings FILE (scripts/check_gpu.sh's file from the GPU machine; "
                f"{_shown(GPU_CHECKS)}/ holds an NVIDIA H200's) or run the dry run on the GPU machine")  # fmt: skip
    return f"per-update times: {shown}; scaled to each run's batch and tokens"


def report(rows, slots, where):
    """The estimate's lines: per label, the total, the wall time at ``slots`` parallel runs, the notes."""
    lines = ["estimate (device-hours from measured seconds per update; source per row):", measured_where(rows),
             f"  {'method':24} {'runs':>6} {'updates':>13} {'device-hours':>13}  source"]  # fmt: skip
    for r in rows:
        shown = hours(r.seconds) if r.seconds is not None else "-"
        lines.append(f"  {r.label:24} {r.runs:>6,} {r.updates:>13,} {shown:>13}  {r.source}")
    measured = [r for r in rows if r.seconds is not None]
    total = sum(r.seconds for r in measured)
    unmeasured = sum(r.runs for r in rows if r.seconds is None)
    runs, updates = sum(r.runs for r in rows), sum(r.updates for r in rows)
    note = f"  ({unmeasured:,} runs without a measurement: not counted)" if unmeasured else ""
    shown = hours(total) if measured else "-"
    lines.append(f"  {'total':24} {runs:>6,} {updates:>13,} {shown:>13}{note}")
    lines.append(wall_time(total, max((r.longest for r in measured), default=0.0), slots, where))
    unprepared = sum(r.unprepared for r in measured)
    lines.append(f"assumes: {ASSUMPTION}" + (f"; {unprepared:,} runs' data is not prepared: their tokens per "
                                              "sample are the measurement's" if unprepared else ""))  # fmt: skip
    return "\n".join(lines)
