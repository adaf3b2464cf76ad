#!/usr/bin/env python3
"""Runs trained together on one backbone against the same runs one after another, in one process.

    python scripts/bench_fused.py launches                       # kernel launches per member-update, K = 1, 4, 20
    python scripts/bench_fused.py launches lora --k 20 --layers 24
    python scripts/bench_fused.py wall --k 4 --updates 50        # CPU wall time: K fused runs vs the K alone

``launches`` (does not depend on the device): a whole fairseq-train update of one run alone
(``launches.update_launches``: its trainer, the run's flags, bf16, 24 layers x 64, batch 4 x 32, a quarter of
the rows padded), against one round of K runs trained together by ``python -m fairseq_idpg.fused.train`` on the
same synthetic data, counted in every member's thread (``FusedGroup.count_round``: each member's update once,
its optimizer step and logging, and the one fused forward and backward; not the next batch's making, which a
GPU run does on the host, as the lone count reuses its batch), divided by K. Printed per
method and K: launches per member-update, and the ratio to the lone run's.

``wall``: fairseq-train's main run K times one after another (seeds 1..K, validation every ``--updates / 2``
updates) against the K runs trained together, both in this process on the same data and threads; printed:
seconds each, and lone / fused.
"""

import argparse
import contextlib
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

from fairseq_idpg.launches import PRECISIONS, Shape, ThreadsCount, one_thread, train_argv, update_launches

DEFAULT_METHODS = ("prompt-tuning-5", "m-idpg-phm", "lora")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MEMBER = ("--lr", "--seed", "--save-dir")
HOST_DATA = ("fairseq/data/", "fairseq_idpg/data/")  # source lines of the data pipeline


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("launches", "wall"))
    p.add_argument("methods", nargs="*", default=list(DEFAULT_METHODS))
    p.add_argument("--k", type=int, nargs="+", default=None, help="members (default: 1 4 20; wall: 4)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--updates", type=int, default=40, help="wall: updates per run")
    return p.parse_args(argv)


def without_member_flags(argv):
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in MEMBER:
            skip = True
        else:
            out.append(arg)
    return out


def fused_launches(name, shape, dtype, k, folder):
    """Launches of one round of ``k`` runs trained together (after 3 warm-up rounds), per member."""
    from fairseq_idpg.fused.train import train_group

    shared = without_member_flags(train_argv(name, shape, dtype, folder))
    shared += ["--max-update", "5", "--validate-interval-updates", "1000", "--disable-validation"]
    members = [["--lr", "1e-4", "--seed", str(s), "--save-dir", str(Path(folder) / f"m{k}" / str(s))] for s in range(k)]
    count = ThreadsCount(trace=True)
    with count.cuda_like():
        outcome = train_group(shared, members, count=(3, count))
    failed = {i: line for i, line in outcome.items() if line}
    if failed:
        raise SystemExit(f"bench_fused: member failed: {failed}")
    # the next batch's making (fairseq's datasets and collater) runs on the host in a GPU run: no launches
    host = sum(n for line, n in count.launches.by_line.items() if line.startswith(HOST_DATA))
    return (count.launches.total - host) / k


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
                fused = [fused_launches(name, shape, dtype, k, folder) for k in ks]
        cells = " ".join(f"{f:>7.1f} ({f / alone:.2f})" for f in fused)
        print(f"{name:<18} {alone:>7,} {cells}", flush=True)


def wall(opts):
    from fairseq_idpg.fused.train import train_group
    from fairseq_idpg.launches import PRECISIONS as P

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from checkpoint_support import fairseq_train  # fairseq-train's main in this process, from a new process's state

    shape = Shape(layers=opts.layers, dim=opts.dim, batch=16, length=64)
    dtype = DTYPES[opts.dtype]
    k = (opts.k or [4])[0]
    print(f"CPU wall time: {k} runs of {opts.updates} updates, {shape.layers} layers x {shape.dim}, batch "
          f"{shape.batch} x {shape.length}, {P[dtype]}, {torch.get_num_threads()} threads")  # fmt: skip
    for name in opts.methods:
        with tempfile.TemporaryDirectory() as folder:
            shared = without_member_flags(train_argv(name, shape, dtype, folder))
            shared += ["--max-update", str(opts.updates), "--validate-interval-updates", str(max(1, opts.updates // 2))]
            members = [["--lr", "1e-4", "--seed", str(s), "--save-dir", f"{folder}/fused/{s}"] for s in range(1, k + 1)]
            start = time.perf_counter()
            with contextlib.redirect_stdout(None):
                for own in members:
                    fairseq_train([*shared, *own[:4], "--save-dir", own[5].replace("fused", "alone")])
            alone = time.perf_counter() - start
            start = time.perf_counter()
            outcome = train_group(shared, members)
            fused = time.perf_counter() - start
            assert not any(outcome.values()), outcome
        print(f"{name:<18} alone {alone:7.1f} s   fused {fused:7.1f} s   alone / fused {alone / fused:5.2f}")


def main(argv=None):
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    logging.getLogger().setLevel(logging.WARNING)
    for name in ("fairseq", "fairseq_cli", "fairseq_idpg"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return launches(opts) if opts.what == "launches" else wall(opts)


if __name__ == "__main__":
    sys.exit(main())
