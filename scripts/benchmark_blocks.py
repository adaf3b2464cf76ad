#!/usr/bin/env python3
"""Training-step time and peak memory of inducer-tuning and the adapter-family baselines against
LoRA and full fine-tuning, in one run on the same shapes.

    python scripts/benchmark_blocks.py                    # stand-in shape: 6 x 384, 12 heads, ffn 1536
    python scripts/benchmark_blocks.py --layers 12 --dim 768 --heads 12 --ffn 3072   # roberta-base shape
    python scripts/benchmark_blocks.py --methods finetune,lora,inducer,inducer-gating

Methods are names of ``fairseq_idpg.methods.METHODS``, each built from its record
(``models.build.build_method``); "finetune" is the stock ``roberta`` architecture, everything trains.

A step = forward (classification head on <s>) + cross-entropy + backward + Adam step, on a random
batch of token ids (B x T, a quarter of the rows padded to T/2) and a randomly initialised
backbone of the given shape (speed and memory do not depend on the weights' values).

- Time: every method's model is built in this process; rounds interleave the methods (each
  round times ``--steps`` steps of every method after a warm-up), and the median over rounds is
  reported. On CPU the clock is the CPU time of the calling thread (``time.thread_time``) with
  one torch thread (``--threads 1``, the default): the thread does all the work (autograd
  runs CPU backward on the caller), and its CPU time does not grow when other processes share
  the cores, which wall time does many times over on a loaded machine (the wall time is printed
  too). On CUDA: wall time between synchronisations. Ratios: each method / LoRA (the
  goal: inducer-tuning <= 1.20) and each method / full fine-tuning.
- Memory, each method in a fresh subprocess of this script (``--memory-of NAME``):
  "saved MiB": the bytes autograd keeps for backward during one forward (distinct storages,
  counted through ``torch.autograd.graph.saved_tensors_hooks``): the activation memory, exact
  and independent of the allocator; "peak MiB": on CUDA ``torch.cuda.max_memory_allocated``
  over the first training step, on CPU the peak resident set (VmHWM, reset through
  /proc/self/clear_refs after the model is built) minus the resident set before that step
  (activations, gradients and the Adam state the first step allocates; the allocator makes it
  coarser than the CUDA figure).
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from fairseq_idpg.methods import METHODS, get_method, methods_where
from fairseq_idpg.models.build import build_method

RATIO_BASELINES = ("finetune", "lora")  # each method's time is reported over these
# benchmarked when --methods is not given: the baselines of the ratios, then every other roberta_blocks record
# but inducer-tuning's Table 3 ablations (Method.ablation_of; --methods runs them)
DEFAULT_METHODS = RATIO_BASELINES + tuple(
    name for name in methods_where(arch="roberta_blocks", ablation_of="") if name not in RATIO_BASELINES
)


def build(name, args, device):
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for i in range(args.vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    sizes = dict(
        encoder_layers=args.layers,
        encoder_embed_dim=args.dim,
        encoder_attention_heads=args.heads,
        encoder_ffn_embed_dim=args.ffn,
        dropout=0.1,
        attention_dropout=0.1,
    )
    torch.manual_seed(0)
    model = build_method(get_method(name), dictionary, **sizes)
    model.register_classification_head("head", num_classes=2)
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-6)
    return model, optimizer


def batch(args, device):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, args.vocab, (args.batch, args.length), generator=g)
    tokens[:, 0] = 0
    tokens[:, -1] = 2
    short = args.batch // 4
    tokens[:short, args.length // 2 :] = 1  # padding
    tokens[:short, args.length // 2 - 1] = 2
    labels = torch.randint(0, 2, (args.batch,), generator=g)
    return tokens.to(device), labels.to(device)


def step(model, optimizer, tokens, labels):
    logits, _ = model(tokens, classification_head_name="head")
    F.cross_entropy(logits.float(), labels).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_all(args, device):
    tokens, labels = batch(args, device)
    built = {name: build(name, args, device) for name in args.methods}
    for model, optimizer in built.values():
        for _ in range(args.warmup):
            step(model, optimizer, tokens, labels)
    cpu_clock = device.type == "cpu" and args.threads == 1  # thread CPU time is the whole step's
    times = {name: [] for name in built}
    walls = {name: [] for name in built}
    for _ in range(args.rounds):
        for name, (model, optimizer) in built.items():
            sync(device)
            start, start_cpu = time.perf_counter(), time.thread_time()
            for _ in range(args.steps):
                step(model, optimizer, tokens, labels)
            sync(device)
            walls[name].append((time.perf_counter() - start) / args.steps)
            times[name].append((time.thread_time() - start_cpu) / args.steps if cpu_clock else walls[name][-1])
    trainable = {
        name: m.num_trainable_parameters()
        if hasattr(m, "num_trainable_parameters")
        else sum(p.numel() for n, p in m.named_parameters() if not n.startswith("classification_heads."))
        for name, (m, _) in built.items()
    }
    median = lambda d: {name: statistics.median(t) for name, t in d.items()}  # noqa: E731
    return median(times), median(walls), trainable, "thread CPU time" if cpu_clock else "wall time"


def rss_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def saved_for_backward(model, tokens):
    """MiB of the distinct storages autograd saves during one forward of ``model``."""
    storages = {}

    def pack(t):
        storages[(t.untyped_storage().data_ptr(), t.device)] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits, _ = model(tokens, classification_head_name="head")
    del logits
    weights = {(p.untyped_storage().data_ptr(), p.device) for p in model.parameters()}  # not activations
    return sum(n for key, n in storages.items() if key not in weights) / 2**20


def memory_of(name, args, device):
    """Saved-for-backward and peak memory (MiB) of ``name`` (see the module docstring)."""
    model, optimizer = build(name, args, device)
    tokens, labels = batch(args, device)
    saved = saved_for_backward(model, tokens)
    return saved, peak_of_first_step(model, optimizer, tokens, labels, device)


def peak_of_first_step(model, optimizer, tokens, labels, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step(model, optimizer, tokens, labels)
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    before = rss_kb("VmRSS")
    step(model, optimizer, tokens, labels)
    return (rss_kb("VmHWM") - before) / 1024


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--ffn", type=int, default=1536)
    p.add_argument("--vocab", type=int, default=30522, help="the stand-in's WordPiece vocabulary")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--steps", type=int, default=3, help="steps per method per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--threads", type=int, default=1, help="CPU threads (torch.set_num_threads); 1: time the thread's CPU time"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help=f"comma-separated names of fairseq_idpg.methods (default: {','.join(DEFAULT_METHODS)})",
    )
    p.add_argument("--memory-of", help=argparse.SUPPRESS)  # internal: one method's memory, in a subprocess
    p.add_argument("--json", help="also write the numbers to this file")
    args = p.parse_args(argv)
    args.methods = args.methods.split(",")
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown or "lora" not in args.methods or "finetune" not in args.methods:
        p.error(
            f"--methods: unknown {unknown}; lora and finetune are needed for the ratios"
            if unknown
            else "--methods must include lora and finetune (the ratios' baselines)"
        )
    return args


def memory_in_subprocesses(args):
    """(peak MiB, saved-for-backward MiB) per method, each measured in a fresh subprocess of this script
    (``--memory-of NAME``), so no method's memory is counted in another's."""
    shape = ("layers", "dim", "heads", "ffn", "vocab", "batch", "length", "threads", "device")
    passthrough = [f"--{k}={getattr(args, k)}" for k in shape]
    memory, saved = {}, {}
    for name in args.methods:
        out = subprocess.run(
            [sys.executable, __file__, *passthrough, f"--memory-of={name}"], capture_output=True, text=True, check=True
        )
        numbers = json.loads(out.stdout.strip().splitlines()[-1])
        memory[name], saved[name] = numbers["peak_mib"], numbers["saved_mib"]
    return memory, saved


def print_table(args, device, clock, numbers):
    """The shape, one row per method (with the ratios to LoRA and fine-tuning) and how it was measured."""
    times, walls, memory, saved, trainable = (
        numbers[k] for k in ("step_s", "wall_s", "peak_mib", "saved_mib", "trainable")
    )
    how = "CUDA max_memory_allocated" if device.type == "cuda" else "peak RSS (VmHWM) delta"
    print(
        f"shape: {args.layers} layers x {args.dim}, {args.heads} heads, ffn {args.ffn}, vocab {args.vocab}; "
        f"batch {args.batch} x {args.length} tokens; {device} ({args.threads} threads); "
        f"median of {args.rounds} rounds x {args.steps} steps"
    )
    print(
        f"{'method':<17}{'trainable':>12}{'step ms':>10}{'/ LoRA':>8}{'/ finetune':>11}"
        f"{'saved MiB':>10}{'/ LoRA':>8}{'peak MiB':>10}{'/ finetune':>11}{'wall ms':>10}"
    )
    for name in args.methods:
        print(
            f"{name:<17}{trainable[name]:>12,}{1000 * times[name]:>10.1f}{times[name] / times['lora']:>8.2f}"
            f"{times[name] / times['finetune']:>11.2f}{saved[name]:>10.1f}{saved[name] / saved['lora']:>8.2f}"
            f"{memory[name]:>10.0f}{memory[name] / memory['finetune']:>11.2f}{1000 * walls[name]:>10.1f}"
        )
    print(f"step time: {clock}; memory: {how} of the first training step (activations, gradients, Adam state)")
    if "inducer" in times:
        print(f"inducer-tuning / LoRA step time: {times['inducer'] / times['lora']:.2f} (goal <= 1.20)")


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    if args.memory_of:
        saved, peak = memory_of(args.memory_of, args, device)
        print(json.dumps({"saved_mib": saved, "peak_mib": peak}))
        return 0

    times, walls, trainable, clock = time_all(args, device)
    memory, saved = memory_in_subprocesses(args)
    numbers = {"step_s": times, "wall_s": walls, "peak_mib": memory, "saved_mib": saved, "trainable": trainable}
    print_table(args, device, clock, numbers)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "clock": clock, **numbers}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
