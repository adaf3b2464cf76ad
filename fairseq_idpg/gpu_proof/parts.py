"""The device script's four parts (the package docstring). Each part is a function of (``cli.Part``: its budget and
its rows, ``Setting``: the sizes); before each measurement it asks ``part.fits()`` (the part's time left against
its last measurement's) and hands each result to ``part.add`` (written at once). The measurements are the
project's own: whole runs by ``fused.train`` and fairseq-train's main, one update by ``launches``' trainer, the
plain loops and Hugging Face's Trainer by ``check_gpu.timing``, serving by ``hub``."""

import contextlib
import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from fairseq_idpg.launches import DTYPES, Shape


@dataclass
class Setting:
    """The sizes of one run of the script (``cli.SETTINGS``: the GPU's and the CPU's)."""

    device: torch.device
    size: str  # a key of launches.SIZES, or "tiny"
    shape: Shape
    dtype: str  # the fused part's precision
    k: int  # members of the fused groups
    k_small: int  # the second group size whose peak memory is taken (first method only)
    alone: int  # lone runs timed, scaled to k
    updates: int  # per run, fused part
    methods: Tuple[str, ...]  # the fused part's, one per family
    peft_methods: Tuple[str, ...]  # the updates part's (each has a PEFT counterpart)
    precisions: Tuple[str, ...]
    steps: int  # timed updates / steps per window (3 windows, after 3 warm-up)
    resume: Tuple[int, int, int]  # members, updates, stopped after
    resume_shape: Shape
    tasks: int  # serving
    models: int  # serving: own models timed, scaled to tasks
    per_task: int
    repeats: int
    work: Path


# ---------------------------------------------------------------------------------------- measuring helpers
@contextlib.contextmanager
def update_starts(starts):
    """Append the start of every fairseq ``Trainer.train_step`` (one update) to ``starts``."""
    from fairseq.trainer import Trainer

    train_step = Trainer.train_step

    def timed(self, *args, **kwargs):
        starts.append(time.perf_counter())
        return train_step(self, *args, **kwargs)

    Trainer.train_step = timed
    try:
        yield
    finally:
        Trainer.train_step = train_step


def steady(starts, skip=3):
    """The median time between consecutive starts, the first ``skip`` left out (warm-up); NaN with too few."""
    gaps = [b - a for a, b in zip(starts[skip:-1], starts[skip + 1 :], strict=True)]
    return statistics.median(gaps) if gaps else float("nan")


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device):
    """(bytes, what they are): CUDA's peak allocation since ``reset_peak``; on the CPU the process's peak resident
    memory so far (not reset: a high-water mark of everything before too)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "CUDA peak allocated since the group's start"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "the process's peak RSS so far (not reset)"


def count_flops(fn):
    """The FLOPs ``fn`` runs (torch's ``FlopCounterMode``: matmuls and attention, forward and backward). On the CPU
    attention runs as ``_scaled_dot_product_flash_attention_for_cpu``, which torch's table leaves out: counted here
    with torch's own attention formulas, as on CUDA."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    cpu_attention = {
        aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *_, **__: fc.sdpa_flop_count(q, k, v),
        aten._scaled_dot_product_flash_attention_for_cpu_backward: (
            lambda grad, q, k, v, *_, **__: fc.sdpa_backward_flop_count(grad, q, k, v)
        ),
    }
    with fc.FlopCounterMode(display=False, custom_mapping=cpu_attention) as counter:
        fn()
    return counter.get_total_flops()


def tflops(flops, seconds):
    return flops / seconds / 1e12 if flops and seconds else None


def finite(x):
    return x if x is not None and math.isfinite(x) else None


def _release(device):
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------- 1. fused against alone
@dataclass
class FusedRun:
    """K runs of one method trained together against lone runs of the same flags (``fused_against_alone``)."""

    method: str
    k: int
    updates: int
    alone_timed: int  # lone runs timed; alone_seconds is their time scaled to k
    alone_seconds: float
    fused_seconds: float
    start_seconds: float  # from the group's start to its first fused step (the members' builds)
    per_update: float  # a lone run's steady seconds per update
    per_round: float  # the group's steady seconds per round (one update of every member)
    lone_updates: int  # updates the lone runs made (each)
    rounds: int  # fused steps the group made
    peak_memory: Optional[int] = None
    memory_measure: str = ""

    @property
    def speedup(self):
        """K members' updates per second over a lone run's: above 1, fused is faster."""
        return self.k * self.per_update / self.per_round

    def to_dict(self):
        return {
            "method": self.method, "k": self.k, "updates": self.updates,
            "alone_runs_timed": self.alone_timed, "alone_scaled_to_k": self.alone_timed < self.k,
            "ms_per_update_alone": finite(self.per_update * 1e3), "ms_per_round_fused": finite(self.per_round * 1e3),
            "updates_per_s_alone": finite(1 / self.per_update), "updates_per_s_fused": finite(self.k / self.per_round),
            "speedup": finite(self.speedup),
            "alone_seconds": self.alone_seconds, "fused_seconds": self.fused_seconds,
            "seconds_ratio": self.alone_seconds / self.fused_seconds, "start_seconds": self.start_seconds,
            "peak_memory_bytes": self.peak_memory, "memory_measure": self.memory_measure,
            "lone_updates": self.lone_updates, "fused_rounds": self.rounds,
            "cut": self.rounds < self.updates or self.lone_updates < self.updates,
        }  # fmt: skip


def fused_against_alone(name, shape, dtype, k, alone, work, updates, device="cpu", stop_hours=None, bpe_dir=None):
    """``alone`` of ``k`` runs of record ``name`` (seeds 1..k, validation every ``updates / 2`` updates) trained one
    after another by fairseq-train's main, then the ``k`` trained together (``fused.train.train_group``), in this
    process on the same data (written into ``work`` once, with the backbone); ``stop_hours``: fairseq's
    ``--stop-time-hours`` for every run (a budget's end)."""
    from fairseq_idpg.check_gpu.training import train_in_process
    from fairseq_idpg.fused.train import train_group
    from fairseq_idpg.launches import train_argv
    from fairseq_idpg.member_flags import split_own

    device = torch.device(device)
    argv = train_argv(name, shape, dtype, work, cpu=device.type == "cpu", batches=updates, bpe_dir=bpe_dir)
    shared, _ = split_own(argv)
    shared += ["--max-update", str(updates), "--validate-interval-updates", str(max(1, updates // 2))]
    shared += ["--stop-time-hours", f"{stop_hours:.6f}"] if stop_hours else []
    with tempfile.TemporaryDirectory(dir=work) as folder:
        members = [["--lr", "1e-4", "--seed", str(s), "--save-dir", f"{folder}/fused/{s}"] for s in range(1, k + 1)]
        lone, made = [], []
        start = time.perf_counter()
        for own in members[:alone]:
            starts = []
            with update_starts(starts):
                run = train_in_process([*shared, *own[:4], "--save-dir", f"{folder}/alone"], Path(folder) / "alone.log")
            if run.error:
                raise RuntimeError(f"{name}: the lone run failed: {run.error}")
            lone.append(steady(starts))
            made.append(len(starts))
        alone_seconds = (time.perf_counter() - start) * k / alone
        reset_peak(device)
        rounds = []
        start = time.perf_counter()
        outcome = train_group(shared, members, round_starts=rounds)
        fused = time.perf_counter() - start
        peak, measure = peak_memory(device)
    failed = {i: line for i, line in outcome.items() if line}
    if failed:
        raise RuntimeError(f"{name}: fused members failed: {failed}")
    return FusedRun(
        name, k, updates, alone, alone_seconds, fused, (rounds[0] - start) if rounds else fused,
        statistics.median(lone), steady(rounds), min(made), len(rounds), peak, measure,
    )  # fmt: skip


def fused(part, s):
    """Part 1: each method at K (the first also at k_small, for its peak memory)."""
    from fairseq_idpg.fused.train import limit_malloc_arenas

    limit_malloc_arenas()  # as python -m fairseq_idpg.fused.train: the members' threads share a few malloc arenas
    last_k = None
    for i, method in enumerate(s.methods):
        for k in (s.k, s.k_small) if i == 0 else (s.k,):
            # a group's time grows with its members (each builds its model, one after another)
            if not part.fits(f"{method} K={k}", scale=k / last_k if last_k else 1.0):
                return
            last_k = k
            with part.measuring(f"{method} K={k}"):
                alone, hours = min(k, s.alone), part.left() / 3600
                run = fused_against_alone(
                    method, s.shape, DTYPES[s.dtype], k, alone, s.work, s.updates, s.device, hours
                )
                row = run.to_dict()
                part.add(row, f"{method} K={k}: {row['speedup'] or float('nan'):.2f}x the updates per second of "
                              f"{'a lone run' if s.alone == 1 else f'{s.alone} lone runs'} (scaled), group start "
                              f"{row['start_seconds']:.1f} s")  # fmt: skip
            _release(s.device)


# ---------------------------------------------------------------------------------------- 2. a lone update against PEFT
def updates(part, s):
    """Part 2: per PEFT pair and precision, our whole fairseq-train update, PEFT's plain step and its Trainer's."""
    from fairseq.logging import metrics

    from fairseq_idpg.check_gpu.timing import load_backbone, sample_batch
    from fairseq_idpg.check_gpu.training import describe_error
    from fairseq_idpg.launches import build_trainer, counterpart, fairseq_train_update, time_updates, train_argv

    from .backbone import write_backbone

    cuda = s.device.type == "cuda"
    state, sizes, dictionary = load_backbone(write_backbone(s.work, s.shape))
    batch, labels = sample_batch(dictionary, s.shape.batch, s.shape.length, s.device)
    for precision in s.precisions:  # bf16 first: the precision the papers' GPUs train in
        for method in s.peft_methods:
            if not part.fits(f"{method} {precision}"):
                return
            with part.measuring(f"{method} {precision}"):
                trainer, sample = build_trainer(train_argv(method, s.shape, DTYPES[precision], s.work, cpu=not cuda))
                update = time_updates(trainer, sample, s.steps, cuda)
                with metrics.aggregate("train"):
                    flops = count_flops(lambda t=trainer, x=sample: fairseq_train_update(t, x))
                del trainer, sample
                _release(s.device)
                row = {"method": method, "peft": counterpart(method), "precision": precision,
                       "fairseq_update_ms": update * 1e3, "fairseq_update_flops": flops,
                       "fairseq_update_tflops": tflops(flops, update)}  # fmt: skip
                try:
                    row.update(_peft_side(row, state, sizes, batch, labels, s))
                except Exception as e:  # noqa: BLE001 (PEFT or the Trainer refusing is a finding; our update stands)
                    row["peft_error"] = describe_error(e)
                _release(s.device)
                said = [f"{method} {precision}: update {row['fairseq_update_ms']:.1f} ms"]
                if "peft_error" in row:
                    said.append(f"PEFT: {row['peft_error']}")
                else:
                    said.append(f"PEFT step {row['peft_step_ms']:.1f} ms ({row['update_over_peft']:.3f})")
                    said.append(f"Trainer {row['trainer_update_ms']:.1f} ms ({row['update_over_trainer']:.3f})")
                part.add(row, ", ".join(said))


def _peft_side(row, state, sizes, batch, labels, s):
    """PEFT's model of the pair on the same backbone and batch: its Hugging Face Trainer's update (fp32 weights,
    mixed precision: ``trainer_step_times``), then its plain step cast to the precision (``time_steps``); their
    FLOPs (one count: the same model, batch and maths) and ratios against our update ``row``."""
    from fairseq_idpg.check_gpu.timing import hf_roberta, peft_model, time_steps, trained_params, trainer_step_times

    precision, update = row["precision"], row["fairseq_update_ms"] / 1e3
    peft = peft_model(hf_roberta(state, sizes), row["peft"])
    with contextlib.redirect_stdout(None):  # the Trainer's log dict every step
        trainer, _, ran = trainer_step_times(peft, batch, labels, precision, row["method"], steps=s.steps)
    peft = peft.to(device=s.device, dtype=DTYPES[precision]).train()
    mask = torch.ones_like(batch)
    forward = lambda: peft(input_ids=batch, attention_mask=mask).logits  # noqa: E731
    plain, _ = time_steps(forward, trained_params(peft), labels, s.steps, warmup=3, repeats=3)
    flops = count_flops(lambda: F.cross_entropy(forward().float(), labels).backward())
    return {
        "trainer_ran": ran, "peft_step_ms": plain * 1e3, "trainer_update_ms": trainer * 1e3, "peft_step_flops": flops,
        "peft_step_tflops": tflops(flops, plain), "trainer_update_tflops": tflops(flops, trainer),
        "update_over_peft": update / plain, "update_over_trainer": update / trainer,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------- 3. stopped and resumed
RESUME_METHOD = "prompt-tuning-5"  # fixed lr (--max-update does not move its schedule), dropout 0.1 in every layer
RESUME_RTOL, RESUME_ATOL = 1e-4, 5e-6  # docs/fused.md's tolerance of a fused run against its lone run


def resume(part, s):
    """Part 3: K members trained through N updates against the same group stopped after M updates (its
    checkpoints written, as a kill after a save leaves them) and resumed to N; fp32, dropout on, on the device."""
    import shutil

    from fairseq_idpg.check_gpu.training import compare_tensors, trained_tensors
    from fairseq_idpg.fused.train import train_group
    from fairseq_idpg.launches import train_argv
    from fairseq_idpg.member_flags import split_own

    k, total, stop = s.resume
    if not part.fits(f"{RESUME_METHOD} K={k}"):
        return
    work = s.work / "resume"
    argv = train_argv(RESUME_METHOD, s.resume_shape, torch.float32, work, cpu=s.device.type == "cpu", batches=total)
    shared = [a for a in split_own(argv)[0] if a != "--no-save"]

    def group(folder, updates):
        dirs = [work / folder / str(i) for i in range(1, k + 1)]
        members = [["--lr", "5e-3", "--seed", d.name, "--save-dir", str(d)] for d in dirs]
        failed = {i: line for i, line in train_group([*shared, "--max-update", str(updates)], members).items() if line}
        if failed:
            raise RuntimeError(f"fused members failed: {failed}")
        return [d / "checkpoint_last.pt" for d in dirs]

    through = group("through", total)
    at_stop = group("stopped", stop)
    for path in at_stop:
        shutil.copyfile(path, path.with_name("checkpoint_stopped.pt"))
    resumed = group("stopped", total)
    # a member that started afresh would equal the run through trivially: each must say it loaded its checkpoint
    loaded = f"(epoch 1 @ {stop} updates)"
    resumed_all = all(loaded in (p.parent / "train.log").read_text(encoding="utf-8") for p in resumed)
    worst, moved, equal = 0.0, math.inf, True
    for a, b in zip(through, resumed, strict=True):
        same, gap, _ = compare_tensors(trained_tensors(a), trained_tensors(b), RESUME_RTOL, RESUME_ATOL)
        equal &= same
        worst = max(worst, gap)
        _, step, _ = compare_tensors(trained_tensors(b.with_name("checkpoint_stopped.pt")), trained_tensors(b), 0, 0)
        moved = min(moved, step)
    row = {
        "method": RESUME_METHOD, "k": k, "updates": total, "stopped_after": stop, "precision": "fp32",
        "dropout": 0.1, "layers": s.resume_shape.layers, "dim": s.resume_shape.dim,
        "largest_difference": worst, "least_moved_after_stop": moved, "rtol": RESUME_RTOL, "atol": RESUME_ATOL,
        "resumed": resumed_all, "equal": bool(equal) and resumed_all, "moved": moved > RESUME_ATOL,
    }  # fmt: skip
    said = ("equal" if equal else "NOT equal") + ("" if resumed_all else "; a member did not load its checkpoint")
    part.add(row, f"K={k}, stopped after {stop} of {total} updates and resumed: largest difference {worst:.3g} "
                  f"({said}), the tensors moved by {moved:.3g} after the stop")  # fmt: skip


# ---------------------------------------------------------------------------------------- 4. serving
SERVING_METHOD = "lora"  # one method: the tasks' rows go through the backbone in one pass


def serving(part, s):
    """Part 4: ``s.tasks`` tasks attached to one ``MultiTaskModel`` answering one mixed batch, against their own hub
    models one after another (``s.models`` of them timed, scaled to the tasks). The tasks are copies of one
    run-like checkpoint (``hub.synthetic``; speed does not depend on the values); as many are attached as the
    budget leaves time for."""
    from fairseq.models.roberta import RobertaModel

    from fairseq_idpg.hub import MultiTaskModel
    from fairseq_idpg.hub.attached import HEAD, USER_DIR
    from fairseq_idpg.hub.synthetic import write_data, write_run
    from fairseq_idpg.hub.timing import mixed_seconds, one_by_one_seconds

    from .backbone import write_backbone

    if not part.fits(f"{s.tasks} tasks"):
        return
    model = write_backbone(s.work, s.shape)
    backbone, vocab = model / "model.pt", model / "vocab.txt"
    folder = Path(tempfile.mkdtemp(dir=s.work, prefix="serving."))
    data = write_data(folder / "data", model / "dict.txt", ["0", "1"])
    run = write_run(folder / "run", SERVING_METHOD, data, backbone, 1, s.shape.sizes(), vocab)
    bpe = {"bpe": "wordpiece", "wordpiece_vocab": str(vocab)}
    mt = MultiTaskModel(backbone, device=s.device, **bpe)
    names, started, why = [], time.perf_counter(), None
    for i in range(s.tasks):
        each = (time.perf_counter() - started) / max(1, i)
        if i and part.left() < each * (s.models + 3):  # left for the own models and the timings
            why = f"{i} of {s.tasks} tasks attached in the budget"
            break
        mt.attach(f"task{i}", run)
        names.append(f"task{i}")
    mixed = mixed_seconds(mt, names, s.per_task, s.repeats)
    hubs = [
        RobertaModel.from_pretrained(str(run), "checkpoint_best.pt", data_name_or_path=str(data),
                                     user_dir=str(USER_DIR), backbone=str(backbone), **bpe).eval().to(s.device)
        for _ in range(min(s.models, len(names)))
    ]  # fmt: skip
    timed = one_by_one_seconds(hubs, names, s.per_task, s.repeats, HEAD)
    one_by_one = timed * len(names) / len(hubs)
    row = {
        "tasks": len(names), "asked": s.tasks, "method": SERVING_METHOD, "passes": mt.passes(names),
        "sentences_per_task": s.per_task, "precision": "fp32", "mixed_ms": mixed * 1e3,
        "models_timed": len(hubs), "one_by_one_scaled": len(hubs) < len(names), "one_by_one_ms": one_by_one * 1e3,
        "speedup": one_by_one / mixed,
    }  # fmt: skip
    line = (f"{len(names)} tasks mixed {row['mixed_ms']:.1f} ms against one after another {row['one_by_one_ms']:.1f} "
            f"ms ({len(hubs)} models timed, scaled): {row['speedup']:.2f}x")  # fmt: skip
    part.add(row, line, cut=why)


PART_FUNCTIONS = {"fused": fused, "updates": updates, "resume": resume, "serving": serving}
