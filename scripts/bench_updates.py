#!/usr/bin/env python3
"""Milliseconds per whole fairseq-train update, per method and precision, beside PEFT's plain loop, in one process.

    python scripts/bench_updates.py                                   # CPU, a tiny random RoBERTa
    python scripts/bench_updates.py --device cuda --size large --batch 16 --length 128

The update: fairseq's ``Trainer`` built as ``fairseq_cli.train.main`` builds it from the arguments
``scripts/run.sh`` plans for the record (``launches.build_trainer``: its recipe's Adam, clipping, schedule, the
meters and the log line every update), one batch of synthetic sentences reused (data loading aside), after 3
warm-up updates; the fastest of 3 runs of ``--updates`` updates (synchronised on a GPU; CPU time of the process
with one torch thread on the CPU). Then ``check_gpu.timing.compare``'s plain loops on the same backbone and
batch: our model's step and PEFT's (forward, fp32 cross-entropy, backward, ``torch.optim.Adam``; no fairseq
trainer). Then PEFT's model trained by ``transformers.Trainer`` (``check_gpu.timing.trainer_step_times``):
``trainer.train()`` on the same batch (an in-memory dataset repeating its rows), AdamW, the record's recipe lr,
weight decay, clipping and schedule, fp16 / bf16 as ``TrainingArguments`` mixed precision, a log every step;
each update timed by a ``TrainerCallback`` from ``on_step_begin`` to the step's ``on_log`` (training_step,
clipping, optimizer and scheduler steps, zero_grad, the log; the next batch's fetch left out), after 3 warm-up
updates, the fastest mean of 3 windows of ``--updates`` updates. ``--no-trainer`` skips it.

Printed per record: ms per update in each precision and bf16 / fp16; per PEFT pair: our fairseq-train update,
our plain step and PEFT's plain step, and fairseq-train update / PEFT step (what a user pays against PEFT);
then per PEFT pair: our fairseq-train update, PEFT's plain step, PEFT's Trainer update and ours / Trainer.
"""

import argparse
import contextlib
import gc
import logging
import sys
import tempfile
from pathlib import Path

import torch

from fairseq_idpg.check_gpu.training import FAMILIES
from fairseq_idpg.launches import (
    DTYPES,
    SIZES,
    Shape,
    build_trainer,
    time_updates,
    train_argv,
    train_folders,
)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "methods", nargs="*", default=list(FAMILIES.values()), help="method records (default: one per family)"
    )
    p.add_argument("--work", default=None, help="where the random backbone and data are written (reused)")
    p.add_argument("--bpe-dir", default=None, help="a GPT-2 BPE folder: the random backbone gets RoBERTa's dictionary")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--size", choices=("tiny", *SIZES), default="tiny", help="tiny: 2 layers x 32")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--precisions", nargs="+", choices=DTYPES, default=["fp16", "bf16"])
    p.add_argument("--updates", type=int, default=10, help="timed updates per run (3 runs, the fastest kept)")
    p.add_argument("--no-peft", action="store_true", help="skip the plain-loop pairs (and the Trainer's)")
    p.add_argument("--no-trainer", action="store_true", help="skip PEFT trained by transformers.Trainer")
    return p.parse_args(argv)


def main(argv=None):
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    logging.getLogger().setLevel(logging.WARNING)
    for name in ("fairseq", "fairseq_cli", "fairseq_idpg"):
        logging.getLogger(name).setLevel(logging.WARNING)
    cuda = opts.device == "cuda"
    if not cuda:
        torch.set_num_threads(1)  # CPU time of one thread, as check_gpu times it: the machine may be shared
    shape = Shape(**SIZES.get(opts.size, dict(layers=2, dim=32)), batch=opts.batch, length=opts.length)
    where = torch.cuda.get_device_name() if cuda else "CPU (CPU time of the process)"
    print(f"ms per fairseq-train update: {shape.layers} layers x {shape.dim}, batch {shape.batch} x {shape.length}, "
          f"{where}", flush=True)  # fmt: skip
    updates = {}
    with contextlib.ExitStack() as stack:
        folder = opts.work or stack.enter_context(tempfile.TemporaryDirectory())
        for name in opts.methods:
            cells = []
            for precision in opts.precisions:
                with contextlib.redirect_stdout(None):
                    trainer, sample = build_trainer(
                        train_argv(name, shape, DTYPES[precision], folder, cpu=not cuda, bpe_dir=opts.bpe_dir)
                    )
                updates[name, precision] = time_updates(trainer, sample, opts.updates, cuda)
                cells.append(f"{precision} {updates[name, precision] * 1e3:8.2f}")
                del trainer, sample
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
            ratio = ""
            if ("bf16" in opts.precisions) and ("fp16" in opts.precisions):
                ratio = f"  bf16 / fp16 {updates[name, 'bf16'] / updates[name, 'fp16']:.3f}"
            print(f"  {name:<18} " + "  ".join(cells) + ratio, flush=True)
        if opts.no_peft:
            return 0
        model_dir, _ = train_folders(shape, folder, bpe_dir=opts.bpe_dir)
        device = torch.device("cuda" if cuda else "cpu")
        by, skipped = plain_loops(model_dir, device, opts, shape, updates)
        if not opts.no_trainer:
            trainer_updates(model_dir, device, opts, shape, updates, by, skipped)
    return 0


def plain_loops(model_dir, device, opts, shape, updates):
    """``compare``'s plain loops printed, with our fairseq-train update / PEFT step; returns ({(name,
    precision): seconds}, skipped)."""
    from fairseq_idpg.check_gpu.timing import PEFT_PAIRS, compare

    print("plain loops (check_gpu's pairs):", flush=True)
    times, skipped = compare(model_dir, device, opts.precisions, shape.batch, shape.length)
    for kind, reason in skipped.items():
        print(f"  {kind}: skipped ({reason})")
    by = {(t.name, t.precision): t.seconds for t in times}
    print("fairseq-train update / PEFT step (ms):", flush=True)
    for kind, record in PEFT_PAIRS.items():
        for precision in opts.precisions:
            peft, step = by.get((f"peft:{kind}", precision)), by.get((f"step:{record}", precision))
            update = updates.get((record, precision))
            if peft is None or step is None:
                continue
            line = f"  {record:<18} {precision}: our step {step * 1e3:7.2f}  PEFT {peft * 1e3:7.2f}"
            line += f"  ours/PEFT {step / peft:.3f}"
            if update is not None:
                line += f"  our update {update * 1e3:7.2f}  update/PEFT {update / peft:.3f}"
            print(line, flush=True)
    return by, skipped


def trainer_updates(model_dir, device, opts, shape, updates, plain, skipped):
    """Print per PEFT pair and precision: our fairseq-train update, PEFT's plain step, PEFT's Trainer update
    (module docstring) and ours / Trainer."""
    from fairseq_idpg.check_gpu.timing import (
        PEFT_PAIRS,
        hf_roberta,
        load_backbone,
        peft_model,
        sample_batch,
        trainer_step_times,
    )

    state, sizes, dictionary = load_backbone(model_dir)
    batch, labels = sample_batch(dictionary, shape.batch, shape.length, device)  # compare's batch
    print("fairseq-train update against PEFT with transformers.Trainer (ms):", flush=True)
    for kind, record in PEFT_PAIRS.items():
        if f"peft:{kind}" in skipped:
            print(f"  {record:<18} PEFT {kind}: skipped ({skipped[f'peft:{kind}'][:80]})", flush=True)
            continue
        for precision in opts.precisions:
            model = peft_model(hf_roberta(state, sizes), kind)
            with contextlib.redirect_stdout(None):  # the Trainer's log dict every step
                seconds, _, ran = trainer_step_times(model, batch, labels, precision, record, steps=opts.updates)
            update, step = updates.get((record, precision)), plain.get((f"peft:{kind}", precision))
            line = f"  {record:<18} {precision}: our update " + (f"{update * 1e3:7.2f}" if update else "      -")
            line += "  PEFT plain " + (f"{step * 1e3:7.2f}" if step else "      -")
            line += f"  PEFT Trainer {seconds * 1e3:7.2f}" + ("" if ran == precision else f" (ran {ran})")
            if update:
                line += f"  ours/Trainer {update / seconds:.3f}"
            print(line, flush=True)
            del model
            gc.collect()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
