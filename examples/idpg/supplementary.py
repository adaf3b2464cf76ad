#!/usr/bin/env python3
"""IDPG supplementary training, stage 1 (IDPG appendix A.4): train a method on MNLI with the
backbone, export the backbone as a model folder, and print the stage-2 sweep that uses it.

    python examples/idpg/supplementary.py [--method s-idpg-phm] [--double] [--model roberta.large]
        [--mnli-raw DIR] [--seed 1] [--work-dir DIR] [--dry-run] [-- fairseq-train flags]

Stage 1 (IDPG Table 4, "Supplementary" column): the method on MNLI with ``--idpg-train-backbone``,
the prompt at position 0, lr 1e-5 linearly decayed after 6% warmup, batch 32, 10 epochs;
``--double`` first doubles MNLI's train set by appending a copy with the two sentences swapped
(IDPG A.4, "on one shard"). Then ``WORK/models/<model>-mnli[-doubled]-<method>/`` (``model.pt`` +
dictionary) holds the stage-1 backbone with the rest of the base model's ``model.pt``. Stage 2 is a
sweep with that folder as its frozen backbone:

    scripts/sweep.sh examples/idpg/supplementary.yaml --model WORK/models/<model>-mnli-doubled-<method>
"""

import argparse
import json
import math
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from fairseq_idpg.preprocessing.formats import get_task  # noqa: E402
from fairseq_idpg.run import RunError, bpe_args, find_runs, model_dir, model_name, raw_dir  # noqa: E402

BATCH, EPOCHS, LR, WARMUP = 32, 10, 1e-5, 0.06  # IDPG Table 4, supplementary column
FP16_FLAGS = ["--fp16", "--fp16-init-scale", "4", "--threshold-loss-scale", "1", "--fp16-scale-window", "128"]


def double_pairs(src, dst):
    """``dst`` = ``src`` whose train split is followed by a copy with input0 and input1 swapped
    (IDPG A.4: "double the MNLI dataset by reordering the two sentences on one shard")."""
    from fairseq.data import indexed_dataset

    src, dst = Path(src), Path(dst)
    if not (src / "input1").is_dir():
        raise SystemExit(f"{src}: not a sentence-pair dataset (no input1/), nothing to swap")
    shutil.copytree(src, dst)
    for column, parts in (
        ("input0", ("input0", "input1")),
        ("input1", ("input1", "input0")),
        ("label", ("label", "label")),
    ):
        if not (src / column / "train.idx").exists():
            continue
        dtype = indexed_dataset.MMapIndexedDataset.Index(str(src / column / "train.idx")).dtype
        builder = indexed_dataset.MMapIndexedDatasetBuilder(str(dst / column / "train.bin"), dtype=dtype)
        for part in parts:
            builder.merge_file_(str(src / part / "train"))
        builder.finalize(str(dst / column / "train.idx"))
    if (src / "label" / "train.label").exists():  # regression labels (text)
        (dst / "label" / "train.label").write_text((src / "label" / "train.label").read_text() * 2)
    info = json.loads((src / "task.json").read_text())
    info["splits"]["train"] *= 2
    info["doubled_by_swapping"] = True
    (dst / "task.json").write_text(json.dumps(info, indent=1))


def export_backbone(checkpoint, base_dir, out_dir):
    """A model folder (model.pt + dictionary) whose weights are the backbone of a stage-1
    checkpoint trained with --idpg-train-backbone; the rest of model.pt is the base model's."""
    import torch

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    trained = torch.load(checkpoint, map_location="cpu", weights_only=False)["model"]
    base = torch.load(base_dir / "model.pt", map_location="cpu", weights_only=False)
    missing = [k for k in base["model"] if k not in trained]
    if missing:
        raise SystemExit(f"{checkpoint}: no backbone tensor {missing[0]} (was stage 1 run with --idpg-train-backbone?)")
    base["model"] = {k: trained[k].to(v.dtype) for k, v in base["model"].items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(base, out_dir / "model.pt")
    for name in ("dict.txt", "vocab.txt", "tokenizer_config.json"):
        if (base_dir / name).exists():
            shutil.copy(base_dir / name, out_dir / name)


def call(cmd, dry):
    print("+ " + shlex.join(str(c) for c in cmd), flush=True)
    if not dry:
        subprocess.run([str(c) for c in cmd], check=True)


def stage1(opts, extra):
    """Train stage 1 and export its backbone; returns the exported folder."""
    base, name, work = model_dir(opts.model), model_name(opts.model), Path(opts.work_dir)
    tag = f"{name}-mnli{'-doubled' if opts.double else ''}-{opts.method}"
    rows = get_task("MNLI").sizes[0]
    run_work = work  # the doubled set gets a work folder of its own: plain MNLI stays where run.sh finds it
    raw = ["--raw", opts.mnli_raw] if opts.mnli_raw else []
    if opts.double:
        run_work = work / "checkpoints" / "mnli-doubled"
        plain, doubled = work / "data-bin" / name / "MNLI", run_work / "data-bin" / name / "MNLI"
        if opts.dry_run or not (plain / "task.json").exists():
            try:
                mnli = raw_dir("MNLI", opts.mnli_raw)
            except RunError:
                if not opts.dry_run:
                    raise
                mnli = "<MNLI raw folder>"
            prepare = [sys.executable, REPO / "scripts" / "prepare_data.py", "MNLI", "--raw", mnli, "--out", plain]
            call(prepare + bpe_args(base, model=opts.model), opts.dry_run)
        print(f"+ double_pairs({plain}, {doubled})")
        if not opts.dry_run and not doubled.exists():
            double_pairs(plain, doubled)
        rows *= 2
    updates = EPOCHS * math.ceil(rows / BATCH)
    # fmt: off
    cmd = [
        REPO / "scripts" / "run.sh", "MNLI", "--method", opts.method, "--model", opts.model, "--work-dir", run_work,
        "--lr", f"{LR:g}", "--seed", opts.seed, "--total-batch", BATCH, "--max-update", updates, *raw,
        "--idpg-train-backbone", "--prompt-position", 0,
        "--lr-scheduler", "polynomial_decay", "--total-num-update", updates, "--warmup-updates", int(WARMUP * updates),
    ]
    # fmt: on
    if not opts.dry_run and _cuda():
        cmd += FP16_FLAGS
    call(cmd + extra, opts.dry_run)
    exported = work / "models" / tag
    if opts.dry_run:
        checkpoint = run_work / "checkpoints" / name / "MNLI" / opts.method / "<run folder>" / "checkpoint_best.pt"
    else:
        runs = find_runs(run_work, name, "MNLI", opts.method, seed=opts.seed, lr=LR)
        if not runs:
            raise RunError(f"no stage-1 run of {opts.method} seed {opts.seed} under {run_work}")
        checkpoint = runs[-1] / "checkpoint_best.pt"
    print(f"+ export_backbone({checkpoint}, {base}, {exported})")
    if not opts.dry_run:
        export_backbone(checkpoint, base, exported)
    return exported


def _cuda():
    import torch

    return torch.cuda.is_available()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="examples/idpg/supplementary.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="s-idpg-phm", help="an IDPG method of fairseq_idpg/methods.py (s-idpg-phm)")
    p.add_argument("--model", default="standin", help="standin, roberta.base, roberta.large or a model folder")
    p.add_argument("--double", action="store_true", help="MNLI doubled by swapping the two sentences")
    p.add_argument("--mnli-raw", help="MNLI's raw folder (default: $GLUE_DIR/MNLI, then data/glue/MNLI)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work-dir", default=str(REPO), help="run.sh's --work-dir (default: the checkout)")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    opts = p.parse_args(ours)
    try:
        exported = stage1(opts, extra)
    except (RunError, subprocess.CalledProcessError) as e:
        print(f"supplementary.py: error: {e}", file=sys.stderr)
        return 2
    print(f"stage 2: scripts/sweep.sh examples/idpg/supplementary.yaml --model {exported}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
