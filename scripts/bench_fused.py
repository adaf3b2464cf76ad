#!/usr/bin/env python3
"""Runs trained together on one backbone against the same runs one after another, in one process.

    python scripts/bench_fused.py launches                       # kernel launches per member-update, K = 1, 4, 20
    python scripts/bench_fused.py launches lora --k 20 --layers 24
    python scripts/bench_fused.py wall --k 4 --updates 50        # CPU wall time: K fused runs vs the K alone
    python scripts/bench_fused.py wall prompt-tuning-5 bitfit --k 1 4 20 --alone 2 --size standin --dtype fp32
    python scripts/bench_fused.py wall --k 20 --alone 2 --device cuda --size large --batch 16 --length 128

``launches`` (does not depend on the device): a whole fairseq-train update of one run alone
(``launches.update_launches``: its trainer, the run's flags, bf16, 24 layers x 64, batch 4 x 32, a quarter of
the rows padded), against one round of K runs trained together by ``python -m fairseq_idpg.fused.train`` on the
same synthetic data, counted in every member's thread (``FusedGroup.count_round``: each member's update once,
its optimizer step and logging, and the one fused forward and backward; not the next batch's making, which a
GPU run does on the host, as the lone count reuses its batch), divided by K. Printed per
method and K: launches per member-update, and the ratio to the lone run's.

``wall``: fairseq-train's main run K times one after another (seeds 1..K, validation every ``--updates / 2``
updates) against the K runs trained together, both in this process on the same data and threads, for each K of
``--k``, on the CPU or a GPU (``--size``: the offline stand-in's shape, all-MiniLM-L6-v2's 6 x 384, or
RoBERTa-base's or -large's; random weights). Printed: seconds of the K runs
each way (startup and validation included; ``--alone N`` times N of the K lone runs and scales to K) and their
ratio; the steady state: ms per update of a lone run (the median gap between updates), ms per round of the
group (one update of every member) and the updates-per-second ratio, K x the one / the other.
"""

import argparse
import contextlib
import logging
import sys
import tempfile
from pathlib import Path

import torch

from fairseq_idpg.launches import (
    DTYPES,
    PRECISIONS,
    SIZES,
    Shape,
    fused_update_launches,
    one_thread,
    update_launches,
)

DEFAULT_METHODS = ("prompt-tuning-5", "m-idpg-phm", "lora")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("launches", "wall", "step"))
    p.add_argument("methods", nargs="*", default=list(DEFAULT_METHODS))
    p.add_argument("--k", type=int, nargs="+", default=None, help="members (default: 1 4 20; wall: 4)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--updates", type=int, default=40, help="wall: updates per run")
    p.add_argument("--work", default=None, help="wall: where the random backbone and data are written (reused)")
    p.add_argument("--bpe-dir", default=None, help="a GPT-2 BPE folder: the random backbone gets RoBERTa's dictionary")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="wall: where the runs train")
    p.add_argument("--size", choices=("tiny", *SIZES), default="tiny", help="wall: tiny is --layers x --dim")
    p.add_argument("--batch", type=int, default=16, help="wall: sentences per batch")
    p.add_argument("--length", type=int, default=64, help="wall: tokens per sentence")
    p.add_argument("--alone", type=int, default=None, help="wall: run this many of the K runs alone, scaled to K")
    return p.parse_args(argv)


def launches(opts):
    shape = Shape(layers=opts.layers, dim=opts.dim)
    dtype = DTYPES[opts.dtype]
    ks = opts.k or [1, 4, 20]
    print(f"kernel launches per member-update: {shape.layers} layers x {shape.dim}, batch {shape.batch} x "
          f"{shape.length}, {PRECISIONS[dtype]}; a lone run's whole fairseq-train update = 1")  # fmt: skip
    print(f"{'method':<18} {'alone':>7} " + " ".join(f"{'K=' + str(k):>14}" for k in ks))
    for name in opts.methods:
        with tempfile.TemporaryDirectory() as folder:
            alone = update_launches(name, shape, dtype, trace=False, folder=folder).total
            with one_thread():
                fused = [fused_update_launches(name, shape, dtype, k, folder) for k in ks]
        cells = " ".join(f"{f:>7.1f} ({f / alone:.2f})" for f in fused)
        print(f"{name:<18} {alone:>7,} {cells}", flush=True)


def wall(opts):
    cuda = opts.device == "cuda"
    sizes = SIZES.get(opts.size, dict(layers=opts.layers, dim=opts.dim))
    shape = Shape(**sizes, batch=opts.batch, length=opts.length)
    dtype = DTYPES[opts.dtype]
    ks = opts.k or [4]
    where = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(f"wall time: K runs of {opts.updates} updates (validation every {max(1, opts.updates // 2)}), "
          f"{shape.layers} layers x {shape.dim}, batch {shape.batch} x {shape.length}, {PRECISIONS[dtype]}, "
          f"{where}; alone: the K runs one after another"
          + (f" ({opts.alone} of them timed, scaled to K)" if opts.alone else ""), flush=True)  # fmt: skip
    print(f"{'method':<16} {'K':>3} {'alone s':>8} {'fused s':>8} {'ratio':>6} {'ms/update alone':>16} "
          f"{'ms/round fused':>15} {'updates/s ratio':>16}", flush=True)  # fmt: skip
    with contextlib.ExitStack() as stack:
        work = Path(opts.work or stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        for name in opts.methods:
            for k in ks:
                wall_of(name, shape, dtype, k, min(k, opts.alone or k), work, opts)


def wall_of(name, shape, dtype, k, alone, work, opts):
    """One method's line of ``wall``: ``alone`` of the ``k`` runs one after another, then the ``k`` together
    (``gpu_proof.parts.fused_against_alone``, the device script's measurement)."""
    from fairseq_idpg.gpu_proof.parts import fused_against_alone

    with contextlib.redirect_stdout(None):
        run = fused_against_alone(name, shape, dtype, k, alone, work, opts.updates, opts.device, bpe_dir=opts.bpe_dir)
    print(f"{name:<16} {k:>3} {run.alone_seconds:8.1f} {run.fused_seconds:8.1f} "
          f"{run.alone_seconds / run.fused_seconds:6.2f} {run.per_update * 1e3:16.1f} {run.per_round * 1e3:15.1f} "
          f"{run.speedup:16.2f}", flush=True)  # fmt: skip


def step(opts):
    """ms per training step of K members in one StackedMembers forward/backward and one Adam over the stacked
    tensors (no fairseq trainer: the fused step's own cost), against the method's plain step alone."""
    from fairseq_idpg.check_gpu.timing import time_steps
    from fairseq_idpg.fused.stacked import StackedMembers
    from fairseq_idpg.launches import ours, tiny_batch

    device = torch.device(opts.device)
    sizes = SIZES.get(opts.size, dict(layers=opts.layers, dim=opts.dim))
    shape = Shape(**sizes, batch=opts.batch, length=opts.length)
    dtype = DTYPES[opts.dtype]
    ks = opts.k or [1, 4, 20]
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (CPU time)"
    print(f"ms per step: {shape.layers} layers x {shape.dim}, batch {shape.batch} x {shape.length}, "
          f"{PRECISIONS[dtype]}, {where}; fused: K members' step; K x alone / fused", flush=True)  # fmt: skip
    tokens, labels = tiny_batch(shape, device)
    for name in opts.methods:
        model, _ = ours(name, shape, dtype=dtype)
        model = model.to(device)
        extra = {}
        if hasattr(model, "attach_sentence_cache"):
            extra["sentence_ids"] = torch.arange(shape.batch, device=device)
        params = [p for p in model.parameters() if p.requires_grad]
        forward = lambda m=model, e=extra: m(tokens, classification_head_name="head", **e)[0]  # noqa: E731
        alone, _ = time_steps(forward, params, labels, steps=10, warmup=3, repeats=3)
        cells = []
        for k in ks:
            stacked = StackedMembers(model, k=k)
            many = tokens.expand(k, *tokens.shape).contiguous()
            per_row = {key: v.expand(k, *v.shape).contiguous() for key, v in extra.items()}

            def fused(stacked=stacked, many=many, per_row=per_row):
                logits = stacked(many, features_only=True, classification_head_name="head", **per_row)
                return logits.reshape(-1, logits.size(-1))

            try:
                seconds, _ = time_steps(fused, list(stacked.tensors), labels.repeat(k), steps=10, warmup=3, repeats=3)
                cells.append(f"K={k} {seconds * 1e3:8.2f} ({k * alone / seconds:5.2f})")
            except torch.OutOfMemoryError:
                cells.append(f"K={k} out of memory")
            del stacked, fused
            if device.type == "cuda":
                torch.cuda.empty_cache()
        print(f"  {name:<16} alone {alone * 1e3:8.2f}  " + "  ".join(cells), flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main(argv=None):
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    logging.getLogger().setLevel(logging.WARNING)
    for name in ("fairseq", "fairseq_cli", "fairseq_idpg"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return {"launches": launches, "wall": wall, "step": step}[opts.what](opts)


if __name__ == "__main__":
    sys.exit(main())
