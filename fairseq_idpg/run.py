"""The main job: prepare a task, train a method on it with fairseq-train, score it with
fairseq-validate. ``scripts/run.sh`` is a thin wrapper.

    scripts/run.sh SST-2                          # the offline stand-in, ../shared/data
    scripts/run.sh RTE --model roberta.large      # models/roberta.large (scripts/download.sh roberta large)
    scripts/run.sh RTE --method NAME --seed 2     # any method of fairseq_idpg/methods.py
    scripts/run.sh MNLI --method inducer-lora --model roberta.large --dry-run   # the command and budget

One run = one configuration. Its folder is
``checkpoints/<model>/<task>/<method>/lr<lr>.seed<seed>.<hash>``, the hash covering everything that
defines the run (the model file and its sha256, the prepared data's provenance, the task, the method
record, lr, seed, effective batch, updates, scheduler, warmup, clipping, weight decay, selection
split, and the extra fairseq-train flags); ``config.json`` beside the checkpoints holds all of it.
The same command again reports the finished result without training (``results.json`` exists), or
resumes an interrupted run from its ``checkpoint_last.pt``; ``--restart`` removes that one folder
and trains again. The per-device batch, gradient accumulation and number of devices are not part
of the hash: they keep the effective batch (``fairseq_idpg/launch.py``).

Every stage is the ordinary command a researcher would type (printed with ``+``):
``scripts/prepare_data.py`` -> ``fairseq-train`` (through ``fairseq_idpg.launch`` for N devices;
its output reaches the terminal as it comes, with an estimate of the time left, and ``train.log``)
-> ``fairseq-validate`` on ``checkpoint_best.pt`` (``validate.log``) -> ``results.json`` (the
scores as numbers, the seed, the configuration, the git commit, the timings, the command).
Prepared data is reused while its provenance (``task.json``: raw files' and BPE files' sha256,
sampling) matches what would be prepared now, and prepared again otherwise, saying why.

Where the files come from:
- raw data: ``--raw DIR``, else ``$GLUE_DIR/<TASK>`` (GLUE) or ``$LMBFF_DIR/<task>`` (MR, CR,
  MPQA, SUBJ), else ``../shared/data/{glue,lmbff}/...`` beside the checkout;
- model: ``standin`` (default): all-MiniLM-L6-v2 converted to fairseq RoBERTa format, the
  project's offline stand-in for roberta.large (``scripts/build_standin.sh``; it is a 6-layer
  BERT, not RoBERTa); ``roberta.base`` / ``roberta.large``: ``models/<name>/model.pt`` as
  unpacked by ``scripts/download.sh roberta {base,large}``; or any folder with model.pt + dict.txt.

Hyperparameters: the method's recipe (``Method.recipe.for_task(task)`` in
``fairseq_idpg/methods.py``: lr, effective batch, epochs or updates, scheduler and warmup,
clipping, weight decay, the dev split that selects checkpoint_best), with Adam (0.9, 0.98), eps
1e-6, the recipe's encoder dropout (0.1; 0 for the l = 100 prompts). With roberta.* or a model
folder the updates are the recipe's epochs over the prepared train set; the stand-in keeps a smoke
budget (300 updates; full fine-tuning at lr 5e-5).
Explicit flags (``--lr``, ``--max-update``, ``--total-batch``, ...) win and are checked first.
"""

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SHARED_DATA = SHARED / "data"
STANDIN_DIR = REPO / "models" / "minilm-l6-fairseq"

LMBFF_TASKS = {"MR": "mr", "CR": "cr", "MPQA": "mpqa", "SUBJ": "subj"}
GLUE_TASKS = ["SST-2", "QNLI", "RTE", "MRPC", "STS-B", "QQP", "MNLI", "CoLA"]
STANDIN_UPDATES = 300  # the stand-in's smoke budget (a CPU can run it)
STANDIN_FINETUNE_LR = 5e-5  # full fine-tuning of the 22M stand-in; roberta.* use fairseq's table
MAX_POSITIONS = 512
SPLIT_NAMES = {"valid": "dev", "valid1": "second dev set (MNLI: dev-mismatched)"}
# the encoder sizes a dry run uses when the model file is absent (models/build.py's tables)
KNOWN_SIZES = {"roberta.large": "ROBERTA_LARGE", "roberta.base": "ROBERTA_BASE", "standin": "STANDIN"}


class RunError(Exception):
    """A bad request, reported as one line before anything runs."""


# ---------------------------------------------------------------------------------------- where things are
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


def model_name(model):
    """The model's folder under data-bin/ and checkpoints/."""
    return "standin" if model == "standin" else model_dir(model).name


def bpe_args(mdir, bpe_dir=None, model=None):
    """prepare_data.py's BPE flags for a model folder: WordPiece with its vocab.txt (the stand-in),
    else RoBERTa's GPT-2 BPE (``--bpe-dir``, else ../shared/roberta_bpe, else models/gpt2_bpe)."""
    mdir = Path(mdir)
    if (mdir / "vocab.txt").is_file() or model == "standin":
        return ["--bpe", "wordpiece", "--vocab", mdir / "vocab.txt"]
    if bpe_dir is None:
        bpe_dir = SHARED / "roberta_bpe" if (SHARED / "roberta_bpe").is_dir() else REPO / "models" / "gpt2_bpe"
    return ["--bpe", "gpt2", "--bpe-dir", Path(bpe_dir)]


def data_folder(work, name, task, few_shot=None, dev_from_train=None, data_seed=1):
    """``WORK/data-bin/<model>/<TASK>``; sampled data gets its own folder (``RTE.few-shot100.seed3``)."""
    base = Path(work) / "data-bin" / name
    if few_shot is not None:
        return base / f"{task}.few-shot{few_shot}.seed{data_seed}"
    if dev_from_train is not None:
        return base / f"{task}.dev{dev_from_train}.seed{data_seed}"
    return base / task


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


def known_dims(model):
    """Encoder flags of roberta.large / roberta.base / the stand-in without their file (dry runs)."""
    from fairseq_idpg.models import build

    sizes = getattr(build, KNOWN_SIZES[model])
    return {**{"--" + k.replace("_", "-"): v for k, v in sizes.items()}, "--max-positions": MAX_POSITIONS}


def sha256(path):
    from fairseq_idpg.data.digest import file_sha256

    return file_sha256(path)


def checkpoint_updates(path):
    """The number of updates a fairseq checkpoint was saved at (the tensors are not read); a damaged file:
    those of the newest intact checkpoint beside it, which fairseq-train resumes from (fairseq_idpg_compat
    fix 9), saying so. Returns (updates, the file they come from)."""
    from fairseq_idpg_compat import resume_checkpoint

    found, updates, damage = resume_checkpoint(path)
    if damage and found is None:
        raise RunError(f"{path} is damaged ({damage}) and no intact checkpoint is left; --restart trains again")
    if damage:
        print(f"warning: {path} is damaged ({damage}); the newest intact checkpoint is {found}", flush=True)
    return updates, Path(found)


# ---------------------------------------------------------------------------------------- results
SHOWN_METRICS = ("accuracy", "f1", "acc_and_f1", "mcc", "pearson", "spearman", "pearson_and_spearman", "loss")


def learning_curve(log):
    """The validations of a train.log, the last one per (split, updates): a resumed run repeats some."""
    from fairseq_idpg.logs import curve

    points = {(c["split"], c["updates"]): c for c in curve(log, SHOWN_METRICS)}
    return sorted(points.values(), key=lambda c: (c["updates"], c["split"]))


def show_scores(results, metric):
    for subset, values in results.items():
        shown = {k: v for k, v in values.items() if k in SHOWN_METRICS}
        print(f"{subset}: " + ", ".join(f"{k} {v}" for k, v in shown.items()) + f"   (paper metric: {metric})")


def git_state(repo=REPO):
    """{"commit", "dirty"} of the checkout holding this code; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        if head.returncode:
            return None
        # --no-optional-locks: a read-only look (no index refresh written)
        status = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if not status.returncode else None}
    except (OSError, subprocess.TimeoutExpired):
        return None


def find_runs(work, name, task, method, **match):
    """Run folders of ``WORK/checkpoints/<name>/<task>/<method>`` whose config.json has the given
    values (e.g. ``seed=2, lr=5e-3``), oldest first."""
    root = Path(work) / "checkpoints" / name / task / method
    found = []
    for config_file in sorted(root.glob("*/config.json"), key=lambda p: p.stat().st_mtime):
        config = json.loads(config_file.read_text())
        if all(config.get(k) == v for k, v in match.items()):
            found.append(config_file.parent)
    return found


# ---------------------------------------------------------------------------------------- live output
def format_duration(seconds):
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """Appends ``eta 3m10s`` to fairseq's log lines that report ``num_updates``: the updates left
    times the seconds per update seen since the first such line (before that: fairseq's wall
    clock over its updates)."""

    UPDATES = re.compile(r"\bnum_updates\"?[=: ]+\"?(\d+)")  # simple and json formats
    WALL = re.compile(r"\bwall\"?[=: ]+\"?([\d.]+)")

    def __init__(self, total_updates, clock=time.monotonic):
        self.total, self.clock, self.first = total_updates, clock, None

    def annotate(self, line):
        found = self.UPDATES.search(line)
        if not found or "valid on" in line or '"valid' in line:
            return line
        done, now = int(found.group(1)), self.clock()
        if self.first is None:
            self.first = (now, done)
        start, start_done = self.first
        if done > start_done:
            per_update = (now - start) / (done - start_done)
        else:
            wall = self.WALL.search(line)
            if not wall or not done:
                return line
            per_update = float(wall.group(1)) / done
        return f"{line} | eta {format_duration(per_update * max(0, self.total - done))}"


def tee(cmd, log, progress=None, show=None, keep=False):
    """Run ``cmd``; each line of its output goes to ``log`` (appended, flushed line by line) and to
    the terminal as it comes (``show(line)`` filters, ``progress`` annotates). Returns (seconds, the
    output if ``keep`` else its last lines). Ctrl-C reaches the command too (same process group);
    SIGTERM is passed on; either way the log keeps everything printed."""
    cmd = [str(c) for c in cmd]
    print("+ " + shlex.join(cmd), flush=True)
    start = time.time()
    lines = [] if keep else deque(maxlen=30)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # fairseq logs to stdout: unbuffered, line by line
    with open(log, "a", encoding="utf-8") as f:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, errors="replace", bufsize=1
        )
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signal.SIGTERM))
        interrupted = False
        try:
            while True:
                try:
                    line = proc.stdout.readline()
                except KeyboardInterrupt:
                    # Ctrl-C: a terminal sends it to the command too; read what it prints until it exits
                    interrupted = True
                    try:
                        proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        proc.send_signal(signal.SIGINT)  # only run.sh was interrupted: pass it on
                    except KeyboardInterrupt:
                        pass
                    continue
                if not line:
                    break
                f.write(line)
                f.flush()
                lines.append(line)
                if show is None or show(line):
                    text = line.rstrip("\n")
                    sys.stdout.write((progress.annotate(text) if progress else text) + "\n")
                    sys.stdout.flush()
            code = proc.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)
    if interrupted or code in (-signal.SIGINT, -signal.SIGTERM, 130):
        raise RunError(f"interrupted; {log} keeps the output; the same command resumes")
    said = lines[-1].strip() if lines else ""
    if code == 2 and re.match(r"[\w.-]+: error: ", said):  # the command's own one-line error
        raise RunError(said.split(": error: ", 1)[1])
    if code:
        tail = "".join(list(lines)[-20:]).rstrip()
        raise RunError(f"command failed with exit code {code}: {cmd[0]} ... {tail and chr(10) + tail}")
    return time.time() - start, "".join(lines)


def console_script(name):
    """``name`` (fairseq-validate, ...) of this interpreter's environment, else the one on PATH.
    Not ``python -m fairseq_cli.validate``: as ``__main__`` the compatibility fixes of that module
    (task and criterion from the checkpoint) would not apply."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else name


def call(cmd):
    cmd = [str(c) for c in cmd]
    print("+ " + shlex.join(cmd), flush=True)
    start = time.time()
    code = subprocess.call(cmd)
    if code:
        raise RunError(f"command failed with exit code {code}: {shlex.join(cmd)}")
    return time.time() - start


# ---------------------------------------------------------------------------------------- options
def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/run.sh", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("task", help=", ".join(GLUE_TASKS + list(LMBFF_TASKS)))
    p.add_argument("--method", default="finetune", help="a method of fairseq_idpg/methods.py (default finetune)")
    p.add_argument(
        "--model", default="standin", help="standin (default), roberta.base, roberta.large, or a folder with model.pt"
    )
    p.add_argument("--raw", help="the task's raw folder (default: $GLUE_DIR / $LMBFF_DIR / ../shared/data)")
    p.add_argument("--bpe-dir", help="RoBERTa GPT-2 BPE files (default ../shared/roberta_bpe, else models/gpt2_bpe)")
    p.add_argument("--few-shot", type=int, metavar="K", help="train on K sampled examples (prepare_data.py --few-shot)")
    p.add_argument("--dev-from-train", type=int, metavar="N", help="hold out N train examples as the dev set")
    p.add_argument("--data-seed", type=int, default=1, help="seed of --few-shot / --dev-from-train (default 1)")
    g = p.add_argument_group("budget (default: the method's recipe)")
    g.add_argument("--lr", type=float, help="learning rate")
    g.add_argument("--max-update", type=int, help="updates (the stand-in: 300)")
    g.add_argument("--epochs", type=float, help="or the budget in epochs of the prepared train set")
    g.add_argument("--total-batch", type=int, help="effective batch per update")
    g.add_argument("--seed", type=int, default=1, help="fairseq-train's seed (default 1)")
    g = p.add_argument_group("devices (the effective batch stays --total-batch)")
    g.add_argument("--nproc", type=int, default=1, help="devices / CPU workers (torchrun; default 1)")
    g.add_argument("--batch-size", type=int, help="per-device batch (default: total / (nproc x update-freq))")
    g.add_argument("--update-freq", type=int, help="batches accumulated per update (default: as --batch-size needs)")
    g.add_argument("--max-tokens", type=int, help="also cap a per-device batch at N tokens (passed to fairseq)")
    g.add_argument("--fp16", action="store_true", help="mixed precision (CUDA)")
    g = p.add_argument_group("run")
    g.add_argument("--work-dir", default=str(REPO), help="where data-bin/ and checkpoints/ go (default: the checkout)")
    g.add_argument("--restart", action="store_true", help="remove this configuration's folder and train again")
    g.add_argument("--dry-run", action="store_true", help="print the budget and the fairseq-train command; run nothing")
    p.epilog = (
        "Other flags go to fairseq-train as given (e.g. --validate-interval-updates 50); see fairseq_idpg/run.py."
    )
    return p.parse_known_args(argv)


def check_values(args):
    """Explicit values are used as given, so impossible ones are errors (never 'use the default')."""
    positive = (
        "lr",
        "max_update",
        "epochs",
        "total_batch",
        "nproc",
        "batch_size",
        "update_freq",
        "max_tokens",
        "few_shot",
    )
    for dest in positive + ("dev_from_train",):
        value = getattr(args, dest)
        if value is not None and value <= 0:
            raise RunError(f"--{dest.replace('_', '-')} must be > 0, got {value}")
    for dest in ("seed", "data_seed"):
        if getattr(args, dest) < 0:
            raise RunError(f"--{dest.replace('_', '-')} must be >= 0, got {getattr(args, dest)}")
    if args.max_update is not None and args.epochs is not None:
        raise RunError("--max-update and --epochs exclude each other (both set the budget)")
    if args.few_shot is not None and args.dev_from_train is not None:
        raise RunError("--few-shot and --dev-from-train exclude each other (few-shot samples its own dev set)")


def flag_value(argv, flag):
    """The last value given to ``flag`` in a fairseq-train command line, or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def format_lr(lr):
    """5e-3 -> "5e-3", 2e-05 -> "2e-5", 0.3 -> "3e-1": short and exact for folder names."""
    mantissa, exponent = f"{lr:.10e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def config_hash(config):
    """8 hex digits over what defines the run (not where it is, nor how many devices share the batch)."""
    defining = json.loads(json.dumps(config, default=str))
    defining.pop("layout", None)
    defining["data"].pop("folder", None)
    (defining["data"].get("provenance") or {}).pop("raw", None)  # the same files elsewhere are the same data
    defining["model"].pop("name", None)
    return hashlib.sha256(json.dumps(defining, sort_keys=True).encode()).hexdigest()[:8]


# ---------------------------------------------------------------------------------------- the job
def prepare_if_needed(task, raw, data, bpe, few_shot=None, dev_from_train=None, data_seed=1, dry=False):
    """Prepare ``data`` unless its task.json records the provenance that ``raw`` + ``bpe`` (prepare_data.py's
    BPE flags) and the sampling would give now; again, with the reasons printed, when it differs.
    Returns (TaskInfo or None in a dry run, the reasons to prepare, the provenance now, seconds or None)."""
    from fairseq_idpg.data.task_info import TaskInfo
    from fairseq_idpg.preprocessing import get_task
    from fairseq_idpg.preprocessing.prepare import bpe_files, provenance, provenance_differences

    spec, data = get_task(task), Path(data)
    encoding = {"bpe": bpe[1], "bpe_dir" if bpe[1] == "gpt2" else "vocab": str(bpe[3])}
    sampled = few_shot is not None or dev_from_train is not None
    wanted = None
    have_bpe = all(f.is_file() for f in bpe_files(**encoding).values())
    if raw is not None and have_bpe and all((Path(raw) / f).is_file() for f in spec.files):
        wanted = provenance(spec, raw, **encoding, few_shot=few_shot, dev_from_train=dev_from_train, seed=data_seed)
    info = TaskInfo.read(data) if TaskInfo.exists(data) else None
    if info is None:
        if data.exists() and (not data.is_dir() or any(data.iterdir())):
            raise RunError(
                f"{data} exists but holds no task.json (not made by scripts/prepare_data.py); "
                f"move it away or give another --work-dir"
            )
        reasons = ["not prepared yet"]
    elif wanted is None:
        reasons = [] if dry else ["the raw or BPE files are missing"]
    else:
        reasons = provenance_differences(info.provenance, wanted)
    if not reasons:
        return info, reasons, wanted, None
    prepare = [sys.executable, REPO / "scripts" / "prepare_data.py", task, "--raw", raw or f"<{task} raw folder>"]
    prepare += ["--out", data, *bpe]
    prepare += ["--few-shot", few_shot] if few_shot is not None else []
    prepare += ["--dev-from-train", dev_from_train] if dev_from_train is not None else []
    prepare += ["--seed", data_seed] if sampled else []
    prepare += ["--overwrite"] if info is not None else []
    if dry:
        print(f"data: {data} would be prepared ({'; '.join(reasons)}):")
        print("+ " + shlex.join(str(c) for c in prepare))
        return info, reasons, wanted, None
    if info is not None:
        print(f"data: preparing {data} again: {'; '.join(reasons)}", flush=True)
    seconds = call(prepare)
    info = TaskInfo.read(data)
    if info is None:
        raise RunError(f"{data}: prepare_data.py wrote no task.json")
    return info, reasons, wanted, seconds


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args, extra = parse_args(argv)
    try:
        return job(args, extra, argv)
    except RunError as e:
        print(f"run.sh: error: {e}", file=sys.stderr)
        return 130 if str(e).startswith("interrupted") else 2


@dataclasses.dataclass
class Plan:
    """One run, decided but not started: its configuration, folder and commands."""

    args: argparse.Namespace
    argv: list
    task: str
    method: Any
    config: dict
    folder: Path  # the run folder (its name holds "<hash>" until the model and data exist)
    complete: bool  # the hash is known
    train: list  # the launcher + fairseq-train command
    data: Path
    model_dir: Path
    evals: list  # the dev/test splits fairseq-validate scores
    batch_size: int
    timings: dict
    start: float

    @property
    def finished(self):
        return self.complete and (self.folder / "results.json").is_file()


def job(args, extra, argv):
    p = plan(args, extra, argv)
    if args.dry_run:
        if not p.complete:
            print("  (<hash> is known once the model file and the prepared data exist)")
        if args.restart and p.folder.exists():
            print(f"--restart would remove {p.folder}")
        print("+ " + shlex.join(p.train))
        return 0
    return execute(p)


def plan(args, extra, argv):
    """Check the request, prepare the data if needed, and decide the run (printing what it will be)."""
    check_values(args)  # before anything is imported or run
    from fairseq_idpg.launch import layout
    from fairseq_idpg.methods import METHODS
    from fairseq_idpg.preprocessing import get_task
    from fairseq_idpg.preprocessing.prepare import FEW_SHOT_DEV

    if args.method not in METHODS:
        raise RunError(f"unknown --method {args.method!r}; valid: {', '.join(sorted(METHODS))}")
    method = METHODS[args.method]
    task = canonical_task(args.task)
    spec = get_task(task)
    if args.few_shot is not None and args.few_shot > spec.sizes[0] - FEW_SHOT_DEV:
        raise RunError(
            f"--few-shot {args.few_shot}: {task}'s train file has {spec.sizes[0]:,} rows and the "
            f"{FEW_SHOT_DEV:,}-example dev set is sampled from it too, so K can be at most "
            f"{max(0, spec.sizes[0] - FEW_SHOT_DEV):,}"
        )
    recipe = method.recipe.for_task(task)
    dry = args.dry_run
    start = time.time()
    timings = {}

    # --- lr and batch: explicit flags, else the recipe's (the stand-in fine-tunes at its own lr)
    standin = args.model == "standin"
    if args.lr is not None:
        lr = args.lr
    elif standin and not method.frozen_backbone:
        lr = STANDIN_FINETUNE_LR
    else:
        lr = recipe.lr
    if lr is None:
        raise RunError(f"the {args.method} recipe has no lr for {task}; give --lr")
    batch = args.total_batch if args.total_batch is not None else recipe.batch
    if batch is None:
        raise RunError(f"the {args.method} recipe has no batch for {task}; give --total-batch")
    try:
        batch_size, update_freq = layout(batch, args.nproc, args.batch_size, args.update_freq)
    except ValueError as e:
        raise RunError(str(e)) from None

    # --- the model
    mdir, name = model_dir(args.model), model_name(args.model)
    if args.model == "standin" and not (mdir / "model.pt").exists() and not dry:
        os.environ.setdefault("PYTHON", sys.executable)  # the script's Python: this one
        call(["bash", REPO / "scripts" / "build_standin.sh", mdir])
    have_model = (mdir / "model.pt").is_file() and (mdir / "dict.txt").is_file()
    if have_model:
        dims = model_dims(mdir / "model.pt")
    elif dry and args.model in KNOWN_SIZES:
        dims = known_dims(args.model)
    else:
        made_by = {
            "standin": "scripts/build_standin.sh",
            "roberta.base": "scripts/download.sh roberta base",
            "roberta.large": "scripts/download.sh roberta large",
        }  # any other folder: a conversion, or the export of IDPG's supplementary stage 1
        hint = made_by.get(args.model, "scripts/convert_hf_to_fairseq.py or examples/idpg/supplementary.py make one")
        raise RunError(f"--model {args.model}: {mdir}/model.pt and dict.txt not found ({hint})")

    print(f"{task} | method {args.method} ({method.source}) | model {args.model} ({mdir})", flush=True)

    # --- the data: prepared again when what it was made from differs from what would be used now
    try:
        raw = raw_dir(task, args.raw)
    except RunError:
        if not dry:
            raise
        raw = None
    bpe = bpe_args(mdir, args.bpe_dir, args.model)
    data = data_folder(args.work_dir, name, task, args.few_shot, args.dev_from_train, args.data_seed)
    sampling = {"few_shot": args.few_shot, "dev_from_train": args.dev_from_train, "data_seed": args.data_seed}
    info, reasons, wanted, seconds = prepare_if_needed(task, raw, data, bpe, **sampling, dry=dry)
    if seconds is not None:
        timings["prepare"] = round(seconds, 1)

    # --- the budget: the recipe, explicit flags first
    if info is not None and dry and reasons:
        info = None  # a dry run's stale data: the budget is that of the data it would prepare
    if info is not None:
        train_examples, splits = info.splits["train"], list(info.splits)
    else:
        sampled = args.few_shot is not None or args.dev_from_train is not None
        train_examples = args.few_shot if args.few_shot is not None else spec.sizes[0] - (args.dev_from_train or 0)
        evals = ["valid"] if sampled else ["valid" + (str(i) if i else "") for i in range(len(spec.files) - 1)]
        splits = ["train", *evals]
    epochs = None
    if args.max_update is not None:
        updates = args.max_update
    elif args.epochs is not None:
        updates = dataclasses.replace(recipe, batch=batch, epochs=args.epochs, updates=None).num_updates(train_examples)
        epochs = args.epochs
    elif standin:
        updates = STANDIN_UPDATES
    else:
        budget = dataclasses.replace(recipe, batch=batch)
        updates = budget.num_updates(train_examples)
        epochs = None if recipe.updates is not None else recipe.epochs
    warmup = int(recipe.warmup * updates) if recipe.scheduler == "polynomial_decay" else 0
    evals = [s for s in splits if re.fullmatch(r"valid\d*", s)]
    select = recipe.select_on if recipe.select_on in evals else "valid"
    valid_subset = [select] + [s for s in evals if s != select]
    metric = info.metric if info is not None else spec.metric
    regression = info.regression if info is not None else spec.regression
    num_outputs = info.num_outputs if info is not None else spec.num_classes

    # --- the configuration and its folder
    config = {
        "task": task,
        "method": {
            "name": method.name,
            "arch": method.arch,
            "task": method.task,
            "options": dict(method.options),
            "frozen_backbone": method.frozen_backbone,
        },
        "model": {
            "name": args.model,
            "path": str((mdir / "model.pt").resolve()),
            "sha256": sha256(mdir / "model.pt") if have_model else None,
            "dict_sha256": sha256(mdir / "dict.txt") if have_model else None,
        },
        "data": {
            "folder": str(data),
            # what the data is made of: as recorded, or (a dry run) as it would be prepared
            "provenance": info.provenance if info is not None else wanted,
            "extra": dict(info.extra) if info is not None else {},  # e.g. a protocol's doubled train set
            "train_examples": train_examples,
        },
        "seed": args.seed,
        "lr": lr,
        "batch": batch,
        "epochs": epochs,
        "updates": updates,
        "scheduler": recipe.scheduler,
        "warmup": recipe.warmup if recipe.scheduler == "polynomial_decay" else 0.0,
        "warmup_updates": warmup,
        "clip_norm": recipe.clip_norm,
        "dropout": recipe.dropout,
        "weight_decay": recipe.weight_decay,
        "select_on": select,
        "valid_subset": valid_subset,
        "metric": metric,
        "max_tokens": args.max_tokens,
        "fp16": args.fp16,
        "extra_args": list(extra),
        "layout": {"nproc": args.nproc, "batch_size": batch_size, "update_freq": update_freq},
    }
    complete = have_model and config["data"]["provenance"] is not None
    run_name = f"lr{format_lr(lr)}.seed{args.seed}.{config_hash(config) if complete else '<hash>'}"
    save = Path(args.work_dir) / "checkpoints" / name / task / args.method / run_name

    # --- the fairseq-train command
    if method.frozen_backbone:
        init = ["--backbone", mdir / "model.pt"]
    else:  # used on the first launch only: a resumed run continues from its checkpoint_last.pt
        init = ["--finetune-from-model", mdir / "model.pt"]
    if recipe.scheduler == "fixed":
        schedule = ["--lr-scheduler", "fixed"]
    else:
        schedule = ["--lr-scheduler", "polynomial_decay", "--total-num-update", updates, "--warmup-updates", warmup]
    intervals = []
    if standin:  # smoke budgets: validate and save (resumably) 3 times, whatever the epochs' length
        every = flag_value(extra, "--validate-interval-updates") or max(1, updates // 3)
        intervals += ["--validate-interval-updates", every]
        if flag_value(extra, "--save-interval-updates") is None:
            intervals += ["--save-interval-updates", every]
        # not also at each epoch's end: few-shot epochs of 32 updates would validate 10 times
        for flag in ("--validate-interval", "--save-interval"):
            if flag_value(extra, flag) is None:
                intervals += [flag, 10**6]
    saves_mid_epoch = "--save-interval-updates" in intervals or flag_value(extra, "--save-interval-updates")
    if saves_mid_epoch and flag_value(extra, "--keep-interval-updates") is None:
        intervals += ["--keep-interval-updates", 1]  # checkpoint_<epoch>_<update>.pt: the latest only
    # a command line reads best as flag-value pairs
    # fmt: off
    train_args = [
        data, "--user-dir", REPO / "fairseq_idpg", *method.train_args(),
        "--criterion", "sentence_prediction_metrics", "--num-classes", num_outputs,
        "--init-token", 0, "--separator-token", 2,
        *[x for kv in dims.items() for x in kv], *init,
        "--dropout", recipe.dropout, "--attention-dropout", recipe.dropout, "--weight-decay", recipe.weight_decay,
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", 1e-06, "--clip-norm", recipe.clip_norm,
        *schedule, "--lr", lr, "--max-update", updates,
        "--valid-subset", ",".join(valid_subset),
        "--best-checkpoint-metric", metric, "--maximize-best-checkpoint-metric",
        "--save-dir", save, "--no-epoch-checkpoints", *intervals, "--seed", args.seed,
        "--log-format", "json", "--log-interval", max(1, min(100, updates // 30)), "--num-workers", 0,
    ]
    # fmt: on
    if regression:
        train_args.append("--regression-target")
    if args.max_tokens is not None:
        train_args += ["--max-tokens", args.max_tokens]
    if args.fp16:
        train_args.append("--fp16")
    train_args = [str(x) for x in train_args] + list(extra)
    launch = [sys.executable, "-m", "fairseq_idpg.launch", "--nproc", args.nproc, "--total-batch", batch]
    launch += ["--batch-size", batch_size, "--"]
    launch = [str(x) for x in launch] + train_args

    budget = (
        f"batch {batch} ({batch_size} per device x {args.nproc} device(s) x update-freq {update_freq}), "
        + (f"{epochs:g} epochs of {train_examples:,} examples = " if epochs is not None else "")
        + f"{updates:,} updates, lr {lr:g} ({recipe.scheduler}"
        + (f", warmup {recipe.warmup:.0%} = {warmup:,} updates" if recipe.scheduler == "polynomial_decay" else "")
        + f"), clip {recipe.clip_norm}, weight decay {recipe.weight_decay:g}, dropout {recipe.dropout:g}, "
        + f"selection on {select} ({SPLIT_NAMES.get(select, select)}) by {metric}"
    )
    overridden = [f for f in ("--clip-norm", "--lr-scheduler", "--warmup-updates", "--weight-decay") if f in extra]
    print(f"budget: {budget}" + (f" (flags given override {', '.join(overridden)})" if overridden else ""))
    print(f"run folder: {save}", flush=True)
    scored = evals + [s for s in splits if re.fullmatch(r"test\d*", s)]
    return Plan(
        args, argv, task, method, config, save, complete, launch, data, mdir, scored, batch_size, timings, start
    )


def execute(p):
    """Train (or resume) and score the planned run; results.json marks it finished."""
    args, argv, save, config, task, method = p.args, p.argv, p.folder, p.config, p.task, p.method
    updates, batch, lr = config["updates"], config["batch"], config["lr"]
    metric, select = config["metric"], config["select_on"]
    timings, data, mdir, batch_size, start = p.timings, p.data, p.model_dir, p.batch_size, p.start
    from fairseq_idpg.logs import validate_scores

    # --- this configuration's state: finished, interrupted, or new
    results_file, last = save / "results.json", save / "checkpoint_last.pt"
    if args.restart and save.exists():
        print(f"--restart: removing {save}", flush=True)
        shutil.rmtree(save)
    if results_file.is_file():
        done = json.loads(results_file.read_text())
        print(f"cached: this configuration finished on {done.get('finished', '?')}; not training it again")
        print(f"  (results {results_file}; --restart trains it again)")
        show_scores(done["results"], done["metric"])
        return 0
    trained = False
    if last.is_file():
        done_updates, resume = checkpoint_updates(last)
        if done_updates >= updates:
            print(f"training finished earlier ({done_updates} updates in {resume}); scoring it", flush=True)
            trained = True
        else:
            print(f"resuming from {resume} at update {done_updates} of {updates}", flush=True)
        before = (
            json.loads((save / "config.json").read_text()).get("layout") if (save / "config.json").is_file() else None
        )
        if before and before != config["layout"]:
            print(f"note: device layout {before} -> {config['layout']}; the same effective batch, other batch shards")
    save.mkdir(parents=True, exist_ok=True)
    (save / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    if not trained:
        with open(save / "train.log", "a", encoding="utf-8") as f:
            f.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} scripts/run.sh {shlex.join(argv)}\n")
        timings["train"], _ = tee(p.train, save / "train.log", progress=Progress(updates))
        timings["train"] = round(timings["train"], 1)
        # checkpoint_<epoch>_<updates>.pt (mid-epoch saves, for resuming) repeat checkpoint_last.pt now
        for interval in save.glob("checkpoint_*_*.pt"):
            if re.fullmatch(r"checkpoint_\d+_\d+\.pt", interval.name):
                interval.unlink()

    # fairseq-validate of this interpreter's environment; the backbone where it is now (the
    # checkpoint names the path it was trained with, which may have moved since)
    validate = [
        console_script("fairseq-validate"), data, "--user-dir", REPO / "fairseq_idpg",
        "--path", save / "checkpoint_best.pt",
        "--valid-subset", ",".join(p.evals), "--batch-size", batch_size, "--num-workers", 0,
        "--log-format", "json", "--log-interval", 10**9,  # one json line per subset, in order
    ]  # fmt: skip
    if method.frozen_backbone:
        validate += ["--model-overrides", repr({"backbone": str(mdir / "model.pt")})]
    if args.max_tokens is not None:
        validate += ["--max-tokens", args.max_tokens]
    if not _cuda():
        validate.append("--cpu")
    seconds, out = tee(validate, save / "validate.log", show=lambda line: False, keep=True)
    timings["validate"] = round(seconds, 1)
    try:
        results = validate_scores(out, p.evals)
    except ValueError as e:
        raise RunError(f"{e} (see {save / 'validate.log'})") from None
    if select not in results:
        raise RunError(f"fairseq-validate printed no score for {select} (see {save / 'validate.log'})")

    print(f"\n== {task} | model {args.model} | method {args.method} | {updates} updates, batch {batch}, lr {lr:g}")
    show_scores(results, metric)
    timings["total"] = round(time.time() - start, 1)
    print("times: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    print(f"run folder: {save}")
    record = {
        "task": task,
        "model": args.model,
        "method": args.method,
        "metric": metric,
        "select_on": select,
        "score": results[select].get(metric),
        "results": results,
        "seed": args.seed,
        "lr": lr,
        "updates": updates,
        "total_batch": batch,
        "config": config,
        "run": save.name,
        "git": git_state(),
        "timings": timings,
        # the dev metrics fairseq-train logged at each validation (its --log-format json lines)
        "curve": learning_curve((save / "train.log").read_text(encoding="utf-8", errors="replace")),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": shlex.join(["scripts/run.sh", *argv]),
    }
    results_file.write_text(json.dumps(record, indent=1) + "\n")
    return 0


def _cuda():
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
