"""The check's training runs: fairseq-train as ``scripts/run.sh`` builds it, a few updates per run.

Each run is the fairseq-train command of ``fairseq_idpg.run.plan`` (the method record's task,
architecture and options, its recipe's lr, Adam, clipping and schedule; the criterion
``sentence_prediction_metrics``) on synthetic data (``data.py``). One process runs
``fairseq_cli.train.cli_main`` in this interpreter (fairseq's import costs seconds; its own tests do
the same); several run under torchrun through ``fairseq_idpg.launch`` (``scripts/train.sh``), NCCL on
GPUs and gloo on the CPU. What fairseq logs (``--log-format json``, one line per update) is read
back with ``fairseq_idpg.logs.read_log`` and judged here:

- the loss of every update is finite;
- a half-precision run is judged against the fp32 run of the same record, seed and batches: no
  update's loss exceeds ``SANE_LOSS_BITS`` bits (fairseq's sentence-prediction loss is in base 2; a
  fresh 2-class head starts near 1 bit) or, where the fp32 run itself went higher,
  ``REFERENCE_FACTOR`` x fp32's largest. The recipes' own first steps can spike: at lr 5e-3 (prompt
  tuning, IDPG) Adam's first step moves every weight of a fresh 1024-wide head by about the lr, and on
  a random roberta.large on an H200 the second update's loss was 9.9 (prompt tuning) and 15.8 bits
  (M-IDPG-PHM) in fp32, 10.4 and 13.0 in fp16 (docs/benchmarks.md). The losses are not compared
  update by update: on CUDA the dropout masks depend on the dtype (the first update's loss, on the same
  weights and batch, differed from fp32's by up to 0.14 bits with dropout on, while fp16 and bf16
  agreed within 0.002). The fp32 run is the reference and is judged on finiteness alone;
- fp16: the final loss scale is at least ``MIN_SANE_LOSS_SCALE`` (fairseq stops training only at its
  ``--min-loss-scale`` 1e-4; a scale that fell to 1 after a few updates overflows on every step);
- the run made the updates it was asked for.
"""

import contextlib
import logging
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

from fairseq_idpg.methods import representatives

SANE_LOSS_BITS = 3.0  # 3 x log2(2 classes): a random 2-class head starts at ~1 bit
REFERENCE_FACTOR = 1.5  # half precision may exceed the fp32 run's largest loss by half of it, no more
MIN_SANE_LOSS_SCALE = 1.0  # fairseq's fp16 starts at 2^7 and halves on each overflow
PRECISION_FLAGS = {"fp32": (), "fp16": ("--fp16",), "bf16": ("--bf16",)}
LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"  # fairseq_cli.train's
# one record per family of fairseq_idpg.methods, as the records name it: {family: its representative}
FAMILIES = representatives()
# the 1-vs-2-device comparison: IDPG's main method with every dropout off (each worker draws its own masks)
DISTRIBUTED_METHOD = "m-idpg-phm"
NO_DROPOUT = ("--dropout", "0", "--attention-dropout", "0", "--pooler-dropout", "0", "--idpg-dropout", "0")


@dataclass(frozen=True)
class Setup:
    """What every run of one check shares: the model folder, the data, where runs write, the shapes."""

    model: Path  # model.pt + dict.txt
    data: Path  # write_synthetic_data's folder
    work: Path  # save folders and logs
    cpu: bool
    batch_size: int
    tokens: int
    updates: int
    extra: Tuple[str, ...] = ()  # fairseq-train flags for every run (--train-args)


@dataclass
class RunResult:
    """One fairseq-train run: its command, what it logged (``logs.Entry`` list), the error that ended it."""

    argv: List[str]
    log: Path
    entries: list = field(default_factory=list)
    error: Optional[str] = None
    refused: Optional[str] = None  # fairseq-train refused its arguments (exit status 2): its one-line reason
    seconds: float = 0.0

    def train_inner(self):
        return [e.stats for e in self.entries if e.tag == "train_inner"]


def launcher_command(setup, name, precision="fp32", nproc=1, update_freq=1, save=None, extra=()):
    """``python -m fairseq_idpg.launch ... -- DATA ... fairseq-train flags``: run.sh's command for method
    ``name`` at ``setup``'s shapes, ``nproc`` devices x ``setup.batch_size`` x ``update_freq`` per update."""
    from fairseq_idpg import run
    from fairseq_idpg.methods import METHODS
    from fairseq_idpg.run_config import RunConfig

    method = METHODS[name]
    flags = [*PRECISION_FLAGS[precision], *extra, *setup.extra]
    if method.arch == "roberta_idpg":
        flags += ["--idpg-cache", "memory"]  # M(x) of synthetic sentences: not worth a file in the cache folder
    flags += [] if save else ["--no-save"]
    request = RunConfig(
        task="SST-2", method=name, model=str(setup.model), max_update=setup.updates,
        total_batch=nproc * setup.batch_size * update_freq, nproc=nproc, batch_size=setup.batch_size,
        work_dir=str(setup.work), extra_args=tuple(flags),
    )  # fmt: skip
    given = dict(backbone=run.backbone_at(setup.model), data=run.prepared(setup.data), folder=save or setup.work / name)
    return run.plan(request, log=run.quiet, **given).train


def fairseq_train_argv(launcher, cpu):
    """The fairseq-train arguments of a one-process launcher command (``launch.build_command``'s: one
    process, pinned to a world of 1)."""
    from fairseq_idpg.launch import FAIRSEQ_TRAIN, build_command

    split = launcher.index("--")
    ours, train_args = launcher[:split], launcher[split + 1 :]
    value = lambda flag: int(ours[ours.index(flag) + 1])  # noqa: E731
    assert value("--nproc") == 1, "fairseq_train_argv is for one process"
    cmd = build_command(train_args, 1, value("--total-batch"), value("--batch-size"), cpu=cpu)
    assert cmd[0].endswith(FAIRSEQ_TRAIN), cmd[0]
    return cmd[1:]  # after the fairseq-train console script


def train_in_process(argv, log):
    """``fairseq-train ARGV`` in this interpreter; its log and its stderr (its one-line error: the check says
    what it means) go to ``log``, not the terminal."""
    from fairseq_cli import train

    from fairseq_idpg.logs import read_log

    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    result = RunResult(list(argv), log)
    root, handler = logging.getLogger(), logging.FileHandler(log, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
    saved = (root.handlers[:], root.level, sys.argv)
    root.handlers, sys.argv = [handler], ["fairseq-train", *argv]
    root.setLevel(logging.INFO)
    start = time.monotonic()
    try:
        with open(log, "a", encoding="utf-8") as stderr, contextlib.redirect_stderr(stderr):
            train.cli_main()
    except SystemExit as e:  # compat fixes 10 and 13: a refused configuration or a divergence, one line
        if e.code:
            result.error, result.refused = _said_in_one_line(e)
    except Exception as e:  # noqa: BLE001  (a failed run is the check's finding, not the check's crash)
        result.error = describe_error(e)
        logging.getLogger("fairseq_idpg.check_gpu").exception("fairseq-train failed")
    finally:
        result.seconds = time.monotonic() - start
        root.handlers, root.level, sys.argv = saved[0], saved[1], saved[2]
        handler.close()
        _release_memory()
    result.entries = read_log(log.read_text(encoding="utf-8", errors="replace"))
    return result


def _said_in_one_line(exit):
    """(error, refused) of fairseq-train's SystemExit: what its one line said (the exception being handled
    when it exited); ``refused`` is set when it refused its arguments (exit status 2)."""
    from fairseq_idpg_compat import Diverged, config_error_in

    cause = exit.__context__
    if isinstance(cause, Diverged):
        return cause.line(), None
    refused = config_error_in(cause) if cause is not None else None
    if exit.code == 2 and refused is not None:
        return f"fairseq-train refused its arguments: {refused}", " ".join(str(refused).split())
    return f"fairseq-train exited with status {exit.code}", None


def describe_error(error):
    """``Type: message`` of the exception that started it all (fairseq's NanDetector, run after a
    ``FloatingPointError``, may raise an empty one of its own), the last one after it when they differ."""
    chain = [error]
    while chain[-1].__context__ is not None and len(chain) < 10:
        chain.append(chain[-1].__context__)
    first, last = chain[-1], chain[0]
    text = f"{type(first).__name__}: {first}"
    return text if first is last else f"{text} (then {type(last).__name__} {last})".replace(" )", ")")


def train_in_subprocess(cmd, log, timeout=1800):
    """A launcher command (torchrun for several processes) with its output in ``log``."""
    import subprocess

    from fairseq_idpg.logs import read_log

    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    result = RunResult(list(cmd), log)
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        out.write("+ " + shlex.join(cmd) + "\n")
        out.flush()
        try:
            code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = f"timeout after {timeout} s"
    result.seconds = time.monotonic() - start
    text = log.read_text(encoding="utf-8", errors="replace")
    if code != 0:
        last = [line for line in text.splitlines() if line.strip()][-1:] or [""]
        result.error = f"exit status {code}: {last[0].strip()[:300]}"
        from fairseq_idpg.run.processes import ONE_LINE_ERROR

        said = ONE_LINE_ERROR.search(last[0])  # the launcher's or fairseq-train's "PROG: error: MESSAGE"
        if code == 2 and said:
            result.refused = last[0][said.end() :].strip()
    result.entries = read_log(text)
    return result


def _release_memory():
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------- verdicts
def judge(result, precision, updates, reference=None):
    """(status, detail) of one run: see the module docstring. ``reference``: the fp32 run's losses."""
    if result.error:
        return "fail", f"{result.error} (log: {result.log})"
    steps = result.train_inner()
    losses = [s.get("loss") for s in steps]
    if not steps or steps[-1].get("num_updates") != updates:
        done = steps[-1].get("num_updates") if steps else 0
        return "fail", f"{done} of {updates} updates logged (log: {result.log})"
    bad = [x for x in losses if not isinstance(x, (int, float)) or not math.isfinite(x)]
    if bad:
        return "fail", f"non-finite loss {bad[0]} (losses {losses}; log: {result.log})"
    detail = f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {updates} updates"
    if precision == "fp32":
        if max(losses) > SANE_LOSS_BITS:
            detail += f" (largest {max(losses):g} bits: the recipe's own first steps)"
        return "pass", detail
    bound = max(SANE_LOSS_BITS, REFERENCE_FACTOR * max(reference)) if reference else SANE_LOSS_BITS
    if max(losses) > bound:
        why = f"{SANE_LOSS_BITS:g}" if bound == SANE_LOSS_BITS else f"{REFERENCE_FACTOR:g} x fp32's largest"
        return "fail", f"loss {max(losses):g} bits > {bound:g} ({why}; losses {losses}; log: {result.log})"
    if reference:
        detail += f" (fp32: {reference[0]:.3f} -> {reference[-1]:.3f}, largest {max(reference):.3g})"
    if precision == "fp16":
        scale = steps[-1].get("loss_scale")
        if not isinstance(scale, (int, float)) or scale < MIN_SANE_LOSS_SCALE:
            return "fail", f"loss scale {scale} < {MIN_SANE_LOSS_SCALE:g} after {updates} updates ({detail})"
        detail += f", loss scale {scale:g}"
    return "pass", detail


def seconds_per_update(result):
    """Median seconds per update from fairseq's per-update ``ups`` (updates per second of its log interval),
    the first update (allocation, kernel choice) left out; None without such lines."""
    ups = [s["ups"] for s in result.train_inner()[1:] if isinstance(s.get("ups"), (int, float)) and s["ups"] > 0]
    if not ups:
        return None
    per = sorted(1.0 / u for u in ups)
    return per[len(per) // 2]


def trained_tensors(checkpoint):
    """{name: fp32 tensor} of the trained parameters a compact checkpoint holds (``--save-trainable-only``)."""
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    return {k: v.float() for k, v in state["model"].items() if torch.is_tensor(v) and v.is_floating_point()}


def compare_tensors(reference, other, rtol, atol):
    """(equal within ``|a - b| <= atol + rtol |a|``, the largest difference, its tensor's name)."""
    if set(reference) != set(other):
        missing = sorted(set(reference) ^ set(other))
        return False, math.inf, f"tensors differ: {missing[:3]}"
    worst, where, ok = 0.0, "", True
    for name, a in reference.items():
        b = other[name]
        diff = (a - b).abs()
        ok &= bool((diff <= atol + rtol * a.abs()).all())
        if diff.max().item() > worst or not where:
            worst, where = diff.max().item(), name
    return ok, worst, where
