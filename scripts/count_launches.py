#!/usr/bin/env python3
"""Kernel launches per update of our methods against their PEFT / transformers counterparts, counted on the CPU.

    python scripts/count_launches.py                                   # the records with a counterpart, + IDPG, inducer
    python scripts/count_launches.py prefix-tuning m-idpg-phm --top 15 # any method records, their top source lines
    python scripts/count_launches.py --dtype fp16 --layers 24 --dim 64

A small model's training step on a GPU is bound by its kernel launches, and the launches do not depend on
the device: each aten operator a step dispatches is one (``fairseq_idpg/launches.py`` counts them in a
``TorchDispatchMode``: views and allocations excluded, dropout and attention counted as CUDA runs them).

For each method record: ours (its fairseq model, built from the record as ``models.build.build_method``
builds it) and its counterpart (the record's ``peft_counterpart`` in PEFT, configured as
``check_gpu.timing.peft_model`` configures it, on ``RobertaForSequenceClassification``; for ``finetune``,
that model with every weight trained), at the same tiny shape (``--layers`` deep, random weights, cast to
``--dtype``), each counted over one training step (forward, fp32 cross-entropy, backward, Adam with
``foreach``) after two warm-up steps. Printed per method: launches per update, per layer (from a model half
as deep) and fixed (the rest), ours / PEFT, and with ``--top N`` the N source lines of ours that issue the
most (a backward operator under the forward line that made it). Then the same steps of the methods with a
counterpart counted by a second tracer (``fairseq_idpg/profiled_launches.py``: torch.profiler's events, the
CPU's own dropout and attention), and one whole fairseq-train update against the model step.
"""

import argparse
import logging
import sys

import torch

from fairseq_idpg.launches import Shape, counterpart, ours, per_update, theirs, update_launches
from fairseq_idpg.methods import METHODS, methods_where
from fairseq_idpg.profiled_launches import model_profiled_launches

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# the records with a counterpart, then the methods with none whose launches the project tracks
DEFAULT_METHODS = ("finetune", *methods_where(peft_counterpart=bool), "m-idpg-phm", "houlsby-adapter", "inducer")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("methods", nargs="*", default=list(DEFAULT_METHODS), help="method records (fairseq_idpg.methods)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--top", type=int, default=0, help="also the N source lines of ours that launch the most")
    p.add_argument("--no-update", action="store_true", help="without the whole fairseq-train update's table")
    args = p.parse_args(argv)
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        p.error(f"unknown method(s) {', '.join(unknown)}; valid: {', '.join(sorted(METHODS))}")
    if args.layers < 2:
        p.error("--layers must be >= 2 (per layer is measured against a model half as deep)")
    return args


def row(name, mine, peft):
    """One table line: ours, PEFT's (or dashes) and the ratio."""
    theirs_cells = (
        f"{peft.total:>8,}{peft.per_layer:>9.1f}{peft.fixed:>7.0f}{mine.total / peft.total:>8.2f}"
        if peft
        else f"{'-':>8}{'-':>9}{'-':>7}{'-':>8}"
    )
    kind = counterpart(name) or "-"
    return f"{name:<17}{mine.total:>8,}{mine.per_layer:>9.1f}{mine.fixed:>7.0f}  {kind:<15}{theirs_cells}"


def main(argv=None):
    args = parse_args(argv)
    logging.disable(logging.INFO)  # the models' build logs
    shape = Shape(args.layers, args.dim, args.heads, args.ffn, 100, args.batch, args.length)
    dtype = DTYPES[args.dtype]
    print(
        f"launches per update (aten operators of one training step): {args.layers} layers x {args.dim}, "
        f"{args.heads} heads, ffn {args.ffn}; batch {args.batch} x {args.length} tokens; {args.dtype}"
    )
    print(f"{'method':<17}{'ours':>8}{'/layer':>9}{'fixed':>7}  {'counterpart':<15}{'theirs':>8}{'/layer':>9}"
          f"{'fixed':>7}{'ratio':>8}")  # fmt: skip
    tops, steps = {}, {}
    for name in args.methods:
        mine = steps[name] = per_update(ours, name, shape, dtype, trace=args.top > 0)
        peft = per_update(theirs, name, shape, dtype, trace=False)
        print(row(name, mine, peft), flush=True)
        tops[name] = mine.launches.by_line.most_common(args.top)
    for name, lines in tops.items():
        if lines:
            print(f"\n{name}: top source lines (ours)")
            for line, n in lines:
                print(f"{n:>7,}  {line}")
    second_tracer([name for name in args.methods if counterpart(name)], shape, dtype)
    if not args.no_update:
        whole_updates(args.methods, shape, dtype, {name: mine.total for name, mine in steps.items()}, args.top)
    return 0


def second_tracer(methods, shape, dtype):
    """The same steps (ours and the counterpart's) counted by torch.profiler's events (profiled_launches.py)."""
    print("\nthe same steps by a second tracer (torch.profiler's events; the CPU's own dropout and attention)")
    print(f"{'method':<17}{'ours':>8}{'theirs':>8}{'ratio':>7}")
    for name in methods:
        mine, peft = (
            sum(model_profiled_launches(build, name, shape, dtype=dtype).values()) for build in (ours, theirs)
        )
        print(f"{name:<17}{mine:>8,}{peft:>8,}{mine / peft:>7.2f}", flush=True)


def whole_updates(methods, shape, dtype, steps, top):
    """The second table: one fairseq-train update (fairseq's Trainer: optimizer wrappers, clipping, loss
    scaling, meters, the log line) against the model's own step, and the update's host syncs."""
    print("\na whole fairseq-train update (its Trainer, the run's flags) / the model step above; host syncs")
    print(f"{'method':<17}{'step':>8}{'update':>8}{'ratio':>7}{'syncs':>7}")
    lines = {}
    for name in methods:
        update = update_launches(name, shape, dtype, trace=top > 0)
        print(f"{name:<17}{steps[name]:>8,}{update.total:>8,}{update.total / steps[name]:>7.2f}"
              f"{update.host_syncs:>7}", flush=True)  # fmt: skip
        lines[name] = update.syncs
    if top:
        for name, syncs in lines.items():
            print(f"\n{name}: host syncs of the update, by line")
            for line, n in syncs.most_common():
                print(f"{n:>7,}  {line}")


if __name__ == "__main__":
    sys.exit(main())
