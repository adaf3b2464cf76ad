"""Mixed-task inference on one frozen backbone (fairseq_idpg.hub.MultiTaskModel) against the K tasks' own models
run one after another, on the same sentences, in one process; and the memory of K attached tasks against K
loaded models. docs/benchmarks.md ("Serving many tasks") has the figures and this command.

    python scripts/bench_serving.py                       # the offline stand-in, LoRA, K = 1, 4, 16, one thread
    python scripts/bench_serving.py --methods lora,prompt-tuning-5,m-idpg-phm,houlsby-adapter --ks 16

The K tasks are run-like checkpoints of untrained methods (``fairseq_idpg.hub.synthetic``: trained tensors at
their initialisation plus noise; speed and memory are those of trained runs, their predictions mean nothing),
written to a temporary folder, of the methods of ``--methods`` in turn (one pass per method in the mixed batch).
Each task gets ``--rows`` SST-2-like sentences; both sides tokenize them (each task's own BPE). Times are the
median of ``--repeats`` after a warm-up; memory is the bytes of distinct tensors each side holds (a tensor shared
by several models counts once); launches are the operators of the model forwards of one batch (tokens ready, as a
GPU would launch them: ``fairseq_idpg.launches.count_launches``), a figure that does not depend on the device.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def tensor_bytes(modules):
    """Bytes of the distinct tensors (by storage) of ``modules`` and of bare tensors among them."""
    seen, total = set(), 0
    for m in modules:
        tensors = list(m.parameters()) + list(m.buffers()) if isinstance(m, torch.nn.Module) else [m]
        for t in tensors:
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
    return total


def forward_launches(mt, hubs, names, rows):
    """Operators of the model forwards alone (tokens already on the device): the mixed batch's passes, and the
    K models' forwards one after another."""
    from fairseq.data.data_utils import collate_tokens

    from fairseq_idpg.hub.attached import HEAD
    from fairseq_idpg.hub.packing import pack
    from fairseq_idpg.launches import count_launches

    dictionary = hubs[0].task.source_dictionary
    packed = []
    for group in mt.groups:
        index = {t.name: i for i, t in enumerate(group.tasks)}
        mine = [(index[n], mt.encode(n, t)) for n, t in rows if n in index]
        tokens, *_ = pack([r for _, r in mine], torch.tensor([m for m, _ in mine]), 1, 0, 2)
        packed.append((group.stacked(), tokens))
    own = [
        collate_tokens([h.encode(t) for n, t in rows if n == name], pad_idx=dictionary.pad())
        for h, name in zip(hubs, names, strict=True)
    ]
    with torch.no_grad():
        mixed = count_launches(lambda: [s(t, classification_head_name=HEAD) for s, t in packed], trace=False).total
        alone = count_launches(
            lambda: [h.model(t, classification_head_name=HEAD) for h, t in zip(hubs, own, strict=True)], trace=False
        ).total
    return mixed, alone


def measure(k, runs, data, args, bpe):
    """One line of the table: K tasks mixed against their K models one by one."""
    from fairseq.models.roberta import RobertaModel

    from fairseq_idpg.hub import MultiTaskModel
    from fairseq_idpg.hub.attached import HEAD
    from fairseq_idpg.hub.timing import mixed_seconds, one_by_one_seconds, task_rows

    names = [f"task{i}" for i in range(k)]
    mt = MultiTaskModel(args.backbone, device=args.device, **bpe)
    for name, run in zip(names, runs, strict=False):
        mt.attach(name, run)
    hubs = [
        RobertaModel.from_pretrained(str(run), "checkpoint_best.pt", data_name_or_path=str(data),
            user_dir=str(REPO / "fairseq_idpg"), backbone=args.backbone, **bpe).eval().to(args.device)
        for run in runs[:k]
    ]  # fmt: skip
    rows, _, _ = task_rows(names, args.rows)
    t_mixed = mixed_seconds(mt, names, args.rows, args.repeats)
    t_seq = one_by_one_seconds(hubs, names, args.rows, args.repeats, HEAD)
    mem_mixed = tensor_bytes(
        [g.template for g in mt.groups] + [g.stacked() for g in mt.groups]
        + [t for task in mt.tasks.values() for t in task.state.values()]
    )  # fmt: skip
    mem_models = tensor_bytes([h.model for h in hubs])
    launch_mixed, launch_seq = forward_launches(mt, hubs, names, rows)
    print(f"{k:>3} {mt.passes(names):>6} {1000 * t_mixed:>9.1f} {1000 * t_seq:>14.1f} {t_seq / t_mixed:>7.2f}x "
          f"{mem_mixed / 2**20:>9.1f} {mem_models / 2**20:>12.1f} {mem_models / mem_mixed:>6.1f}x "
          f"{launch_mixed:>9,} {launch_seq:>11,}", flush=True)  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    standin = REPO / "models" / "minilm-l6-fairseq"
    p.add_argument("--backbone", default=str(standin / "model.pt"), help="default: the offline stand-in")
    p.add_argument("--vocab", default=str(standin / "vocab.txt"), help="the backbone's WordPiece vocab.txt")
    p.add_argument("--methods", default="lora", help="comma-separated method records, given to the tasks in turn")
    p.add_argument("--ks", default="1,4,16", help="numbers of tasks")
    p.add_argument("--rows", type=int, default=8, help="sentences per task in a batch")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a shared machine)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from fairseq_idpg.hub.synthetic import write_data, write_run
    from fairseq_idpg.logs import quiet_setup_logs

    quiet_setup_logs()
    methods = args.methods.split(",")
    ks = [int(k) for k in args.ks.split(",")]
    state = torch.load(args.backbone, map_location="cpu", weights_only=False)
    cfg = state["cfg"]["model"]
    cfg = cfg if isinstance(cfg, dict) else vars(cfg)
    sizes = {
        k: cfg[k] for k in ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads")
    }
    del state
    print(f"backbone {args.backbone} ({sizes}); methods {methods}; {args.rows} sentences per task; "
          f"{args.threads} thread(s); device {args.device}; torch {torch.__version__}")  # fmt: skip
    bpe = {"bpe": "wordpiece", "wordpiece_vocab": args.vocab}
    with tempfile.TemporaryDirectory(prefix="bench-serving.") as work:
        data = write_data(Path(work) / "data", Path(args.backbone).parent / "dict.txt", ["0", "1"])
        runs = [
            write_run(Path(work) / f"run{i}", methods[i % len(methods)], data, args.backbone, i, sizes, args.vocab)
            for i in range(max(ks))
        ]
        print(f"{'K':>3} {'passes':>6} {'mixed ms':>9} {'one by one ms':>14} {'speed-up':>8} "
              f"{'mixed MB':>9} {'K models MB':>12} {'memory':>7} {'launches':>9} {'one by one':>11}")  # fmt: skip
        for k in ks:
            measure(k, runs, data, args, bpe)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
