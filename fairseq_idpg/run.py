"""The main job: prepare a task, train a method on it with fairseq-train, score it with
fairseq-validate. ``scripts/run.sh`` is a thin wrapper.

    scripts/run.sh SST-2                          # the offline stand-in, ../shared/data
    scripts/run.sh RTE --model roberta.large      # models/roberta.large (scripts/download.sh roberta large)
    scripts/run.sh MRPC --max-update 300 --nproc 2
    scripts/run.sh RTE --method NAME              # any method of fairseq_idpg/methods.py

Every stage is the ordinary command a researcher would type (printed with ``+``):
``scripts/prepare_data.py`` -> ``fairseq-train`` (through ``fairseq_idpg.launch`` for N
devices) -> ``fairseq-validate`` on ``checkpoint_best.pt``. Stages whose output exists are
skipped (prepared data, the stand-in); training always runs.

Where the files come from:
- raw data: ``--raw DIR``, else ``$GLUE_DIR/<TASK>`` (GLUE) or ``$LMBFF_DIR/<task>`` (MR, CR,
  MPQA, SUBJ), else ``../shared/data/{glue,lmbff}/...`` beside the checkout;
- model: ``standin`` (default): all-MiniLM-L6-v2 converted to fairseq RoBERTa format, the
  project's offline stand-in for roberta.large (``scripts/build_standin.sh``; it is a 6-layer
  BERT, not RoBERTa); ``roberta.base`` / ``roberta.large``: ``models/<name>/model.pt`` as
  unpacked by ``scripts/download.sh roberta {base,large}``; or any folder with model.pt + dict.txt.

Hyperparameters: fairseq's RoBERTa GLUE recipe (``examples/roberta/README.glue.md``: Adam
(0.9, 0.98), eps 1e-6, weight decay 0.1, polynomial decay with 6% warmup, dropout 0.1,
the per-task lr / batch / updates of its table) for roberta.*; for the stand-in the same
with lr 5e-5 and ``--max-update`` as given (it is for smoke-scale runs on a CPU). A method
other than ``finetune`` brings its task, architecture, options, lr and scheduler: its record in
``fairseq_idpg/methods.py`` (``Method.train_args`` and ``Method.recipe``).
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
STANDIN_DIR = REPO / "models" / "minilm-l6-fairseq"

LMBFF_TASKS = {"MR": "mr", "CR": "cr", "MPQA": "mpqa", "SUBJ": "subj"}
GLUE_TASKS = ["SST-2", "QNLI", "RTE", "MRPC", "STS-B", "QQP", "MNLI", "CoLA"]
# fairseq's RoBERTa GLUE table (roberta.large): lr, batch, total updates
FINETUNE_TABLE = {
    "MNLI": (1e-5, 32, 123873),
    "QNLI": (1e-5, 32, 33112),
    "QQP": (1e-5, 32, 113272),
    "RTE": (2e-5, 16, 2036),
    "SST-2": (1e-5, 32, 20935),
    "MRPC": (1e-5, 16, 2296),
    "CoLA": (1e-5, 16, 5336),
    "STS-B": (2e-5, 16, 3598),
}
# LM-BFF tasks are not in that table: the SST-2 setting, 10 epochs of their ~8k examples
for _t in LMBFF_TASKS:
    FINETUNE_TABLE[_t] = (1e-5, 32, 2700)


class RunError(Exception):
    """A bad request, reported as one line before anything runs."""


def canonical_task(name):
    for t in GLUE_TASKS + list(LMBFF_TASKS):
        if t.lower() == name.lower():
            return t
    raise RunError(f"unknown task {name!r}; valid: {', '.join(GLUE_TASKS + list(LMBFF_TASKS))}")


def raw_dir(task, raw=None):
    if raw:
        path = Path(raw)
    elif task in LMBFF_TASKS:
        base = os.environ.get("LMBFF_DIR")
        path = Path(base) / LMBFF_TASKS[task] if base else SHARED_DATA / "lmbff" / LMBFF_TASKS[task]
    else:
        base = os.environ.get("GLUE_DIR")
        path = Path(base) / task if base else SHARED_DATA / "glue" / task
    if not path.is_dir():
        raise RunError(
            f"raw data for {task} not found at {path} (give --raw DIR, set $GLUE_DIR/$LMBFF_DIR, "
            f"or run scripts/download.sh glue / lmbff)"
        )
    return path


def model_dir(model):
    if model == "standin":
        return STANDIN_DIR
    if model in ("roberta.base", "roberta.large"):
        return REPO / "models" / model
    return Path(model)


def model_dims(checkpoint):
    """Encoder flags of a fairseq RoBERTa checkpoint (new cfg or old args), no tensor read."""
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)
    m = state["cfg"]["model"] if state.get("cfg") is not None else vars(state["args"])
    get = (lambda k: getattr(m, k)) if not isinstance(m, dict) else m.__getitem__
    return {
        "--encoder-layers": get("encoder_layers"),
        "--encoder-embed-dim": get("encoder_embed_dim"),
        "--encoder-ffn-embed-dim": get("encoder_ffn_embed_dim"),
        "--encoder-attention-heads": get("encoder_attention_heads"),
        "--max-positions": get("max_positions"),
    }


def run(cmd, log=None):
    print("+ " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    start = time.time()
    if log is None:
        code = subprocess.call([str(c) for c in cmd])
        out = ""
    else:
        proc = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        code, out = proc.returncode, proc.stdout
        Path(log).write_text(out)
    if code:
        tail = "\n".join(out.splitlines()[-20:])
        raise RunError(f"command failed with exit code {code}: {cmd[0]} ... {tail and chr(10) + tail}")
    return time.time() - start, out


def parse_valid_line(text):
    """The metrics of the last ``valid on 'X' subset | k v | ...`` line per subset."""
    results = {}
    for line in text.splitlines():
        m = re.search(r"valid on '([^']+)' subset \| (.*)$", line)
        if m:
            fields = [f.strip().split(" ", 1) for f in m.group(2).split("|")]
            results[m.group(1)] = {k: v for k, v in (f for f in fields if len(f) == 2)}
    return results


def main(argv=None):
    p = argparse.ArgumentParser(prog="scripts/run.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("task", help=", ".join(GLUE_TASKS + list(LMBFF_TASKS)))
    p.add_argument("--method", default="finetune", help="a method of fairseq_idpg/methods.py (default finetune)")
    p.add_argument(
        "--model",
        default="standin",
        help="standin (default), roberta.base, roberta.large, or a folder with model.pt + dict.txt",
    )
    p.add_argument("--raw", help="the task's raw folder (default: $GLUE_DIR / $LMBFF_DIR / ../shared/data)")
    p.add_argument(
        "--bpe-dir", default=None, help="RoBERTa GPT-2 BPE files (default ../shared/roberta_bpe, else models/gpt2_bpe)"
    )
    p.add_argument(
        "--max-update", type=int, help="updates (default: the recipe's total for roberta.*, 300 for the stand-in)"
    )
    p.add_argument("--lr", type=float, help="learning rate (default: the recipe's)")
    p.add_argument("--total-batch", type=int, help="effective batch (default: the recipe's)")
    p.add_argument("--nproc", type=int, default=1, help="devices / CPU workers (torchrun)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fp16", action="store_true", help="mixed precision (CUDA)")
    p.add_argument("--work-dir", default=str(REPO), help="where data-bin/ and checkpoints/ go (default: the checkout)")
    args, extra = p.parse_known_args(argv)

    from fairseq_idpg.data.task_info import TaskInfo
    from fairseq_idpg.methods import METHODS

    try:
        if args.method not in METHODS:
            raise RunError(f"unknown --method {args.method!r}; valid: {', '.join(sorted(METHODS))}")
        method = METHODS[args.method]
        recipe = method.recipe
        task = canonical_task(args.task)
        raw = raw_dir(task, args.raw)
        mdir = model_dir(args.model)
        name = "standin" if args.model == "standin" else mdir.name
        if args.model == "standin" and not (mdir / "model.pt").exists():
            run(["bash", REPO / "scripts" / "build_standin.sh", mdir])
        if not (mdir / "model.pt").is_file() or not (mdir / "dict.txt").is_file():
            raise RunError(
                f"--model {args.model}: {mdir}/model.pt and dict.txt not found "
                f"(scripts/download.sh roberta large, or scripts/build_standin.sh for the stand-in)"
            )
        if (mdir / "vocab.txt").is_file():
            bpe = ["--bpe", "wordpiece", "--vocab", mdir / "vocab.txt"]
        else:
            bpe_dir = (
                Path(args.bpe_dir)
                if args.bpe_dir
                else (
                    REPO.parent / "shared" / "roberta_bpe"
                    if (REPO.parent / "shared" / "roberta_bpe").is_dir()
                    else REPO / "models" / "gpt2_bpe"
                )
            )
            bpe = ["--bpe", "gpt2", "--bpe-dir", bpe_dir]

        work = Path(args.work_dir)
        data = work / "data-bin" / name / task
        timings = {}
        if TaskInfo.read(data) is None:
            timings["prepare"], _ = run(
                [sys.executable, REPO / "scripts" / "prepare_data.py", task, "--raw", raw, "--out", data, *bpe]
            )
        info = TaskInfo.read(data)

        lr, total_batch, updates = FINETUNE_TABLE[task]
        if args.model == "standin":
            lr, updates = 5e-5, 300
        lr = args.lr or recipe.lr or lr
        total_batch = args.total_batch or total_batch
        updates = args.max_update or updates
        metric = info.metric
        save = work / "checkpoints" / name / task / args.method
        dims = model_dims(mdir / "model.pt")
        if method.frozen_backbone:
            init = ["--backbone", mdir / "model.pt"]
        else:
            init = ["--restore-file", mdir / "model.pt", "--reset-optimizer", "--reset-dataloader", "--reset-meters"]
        # a command line reads best as flag-value pairs
        # fmt: off
        if recipe.scheduler == "fixed":
            schedule = ["--lr-scheduler", "fixed"]
        else:
            schedule = ["--lr-scheduler", "polynomial_decay", "--total-num-update", str(updates),
                        "--warmup-updates", str(int(recipe.warmup * updates))]
        train_args = [
            data, "--user-dir", REPO / "fairseq_idpg", *method.train_args(),
            "--criterion", "sentence_prediction_metrics", "--num-classes", str(info.num_outputs),
            "--init-token", "0", "--separator-token", "2",
            *[str(x) for kv in dims.items() for x in kv], *init,
            "--dropout", "0.1", "--attention-dropout", "0.1", "--weight-decay", "0.1",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-06", "--clip-norm", "0.0",
            *schedule, "--lr", str(lr), "--max-update", str(updates),
            "--best-checkpoint-metric", metric, "--maximize-best-checkpoint-metric",
            "--save-dir", save, "--no-epoch-checkpoints", "--seed", str(args.seed),
            "--log-format", "simple", "--log-interval", "50", "--num-workers", "0",
            "--validate-interval-updates", str(max(1, updates // 3)),
        ]
        # fmt: on
        if info.regression:
            train_args.append("--regression-target")
        if args.fp16:
            train_args.append("--fp16")
        train_args += extra
        launch = [
            sys.executable,
            "-m",
            "fairseq_idpg.launch",
            "--nproc",
            str(args.nproc),
            "--total-batch",
            str(total_batch),
            "--",
        ]
        save.mkdir(parents=True, exist_ok=True)
        timings["train"], _ = run(launch + train_args, log=save / "train.log")

        subsets = ",".join(s for s in ("valid", "valid1") if s in info.splits)
        validate = [
            "fairseq-validate",
            data,
            "--user-dir",
            REPO / "fairseq_idpg",
            "--path",
            save / "checkpoint_best.pt",
            "--valid-subset",
            subsets,
            "--batch-size",
            "64",
            "--num-workers",
            "0",
        ]
        if not _cuda():
            validate.append("--cpu")
        _, out = run(validate, log=save / "validate.log")
    except RunError as e:
        print(f"run.sh: error: {e}", file=sys.stderr)
        return 2

    results = parse_valid_line(out)
    print(f"\n== {task} | model {args.model} | method {args.method} | {updates} updates, batch {total_batch}, lr {lr}")
    for subset, values in results.items():
        shown = {
            k: v
            for k, v in values.items()
            if k in ("accuracy", "f1", "acc_and_f1", "mcc", "pearson", "spearman", "pearson_and_spearman", "loss")
        }
        print(f"{subset}: " + ", ".join(f"{k} {v}" for k, v in shown.items()) + f"   (paper metric: {metric})")
    print("times: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    (save / "results.json").write_text(
        json.dumps(
            {
                "task": task,
                "model": args.model,
                "method": args.method,
                "metric": metric,
                "results": results,
                "timings": timings,
                "updates": updates,
                "lr": lr,
                "total_batch": total_batch,
                "command": shlex.join(["scripts/run.sh", *(sys.argv[1:] if argv is None else argv)]),
            },
            indent=1,
        )
    )
    return 0


def _cuda():
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
