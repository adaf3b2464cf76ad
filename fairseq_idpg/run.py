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

The request is a ``RunConfig`` (``fairseq_idpg/run_config.py``: run.sh's flags as typed fields);
``check()`` refuses it in one line before anything is prepared or written (every missing file, and the
fairseq-train command it makes, parsed by fairseq and its model built on the meta device), ``plan()``
resolves it into the configuration and commands, ``execute()`` trains and scores.

"""

import contextlib
import dataclasses
import hashlib
import json
import math
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
from typing import Any, NamedTuple, Optional

from fairseq_idpg.errors import ConfigError
from fairseq_idpg.launch import console_script
from fairseq_idpg.run_config import LMBFF_TASKS, REPO, RunConfig, RunError, canonical_task, method_list
from fairseq_idpg_compat import flag_value

SHARED = REPO.parent / "shared"
SHARED_DATA = SHARED / "data"
STANDIN_DIR = REPO / "models" / "minilm-l6-fairseq"

STANDIN_UPDATES = 300  # the stand-in's smoke budget (a CPU can run it)
STANDIN_FINETUNE_LR = 5e-5  # full fine-tuning of the 22M stand-in; roberta.* use fairseq's table
MAX_POSITIONS = 512
SPLIT_NAMES = {"valid": "dev", "valid1": "second dev set (MNLI: dev-mismatched)"}
# the encoder sizes a dry run uses when the model file is absent (models/build.py's tables)
KNOWN_SIZES = {"roberta.large": "ROBERTA_LARGE", "roberta.base": "ROBERTA_BASE", "standin": "STANDIN"}
ONE_LINE_ERROR = re.compile(r"[\w./-]+: error: ")  # a command's refusal: PROG: error: MESSAGE (exit status 2)


class Refused(RunError):
    """A command run.sh ran refused its input in one line (exit status 2): run.sh says it again, once."""


# ---------------------------------------------------------------------------------------- where things are
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


def bpe_encoding(bpe):
    """prepare_data.py's BPE flags (``bpe_args``) as the keywords of its ``bpe_files`` and ``provenance``."""
    return {"bpe": bpe[1], "bpe_dir" if bpe[1] == "gpt2" else "vocab": str(bpe[3])}


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
    from fairseq_idpg.models.frozen_roberta import load_checkpoint_file

    try:
        state = load_checkpoint_file(checkpoint)
    except Exception as e:
        # unpickling, zip and EOF errors of a file that is not a (whole) checkpoint
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise RunError(f"{checkpoint}: not a fairseq checkpoint (torch.load: {reason})") from None
    try:
        m = state["cfg"]["model"] if state.get("cfg") is not None else vars(state["args"])
        get = (lambda k: getattr(m, k)) if not isinstance(m, dict) else m.__getitem__
        return {
            "--encoder-layers": get("encoder_layers"),
            "--encoder-embed-dim": get("encoder_embed_dim"),
            "--encoder-ffn-embed-dim": get("encoder_ffn_embed_dim"),
            "--encoder-attention-heads": get("encoder_attention_heads"),
            "--max-positions": get("max_positions"),
        }
    except (KeyError, AttributeError, TypeError) as e:
        raise RunError(f"{checkpoint}: a fairseq checkpoint without RoBERTa's encoder sizes (no {e})") from None


def known_dims(model):
    """Encoder flags of roberta.large / roberta.base / the stand-in without their file (dry runs)."""
    from fairseq_idpg.models import build

    sizes = getattr(build, KNOWN_SIZES[model])
    return {**{"--" + k.replace("_", "-"): v for k, v in sizes.items()}, "--max-positions": MAX_POSITIONS}


def sha256(path):
    from fairseq_idpg.data.digest import file_sha256

    return file_sha256(path)


def weights_sha256(path):
    from fairseq_idpg.data.digest import weights_sha256 as digest

    return digest(path)


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


class TrainingEta:
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
    refused = None  # the command's one-line error: said once, by run.sh (shown only if it was no refusal)
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
                if refused is not None and (show is None or show(refused)):
                    sys.stdout.write(refused)  # more came after it: not the command's last word
                refused = line if ONE_LINE_ERROR.match(line) else None
                if refused is None and (show is None or show(line)):
                    text = line.rstrip("\n")
                    sys.stdout.write((progress.annotate(text) if progress else text) + "\n")
                    sys.stdout.flush()
            code = proc.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)
    if interrupted or code in (-signal.SIGINT, -signal.SIGTERM, 130):
        raise RunError(f"interrupted; {log} keeps the output; the same command resumes")
    if code == 2 and refused is not None:
        raise Refused(refused.split(": error: ", 1)[1].strip())
    if refused is not None and (show is None or show(refused)):
        sys.stdout.write(refused)
    if code:
        tail = "".join(list(lines)[-20:]).rstrip()
        raise RunError(f"command failed with exit code {code}: {cmd[0]} ... {tail and chr(10) + tail}")
    return time.time() - start, "".join(lines)


def call(cmd, log=print):
    """Run ``cmd`` (its output to the terminal); its one-line error is passed on as a ``Refused``, said once."""
    cmd = [str(c) for c in cmd]
    log("+ " + shlex.join(cmd), flush=True)
    start = time.time()
    proc = subprocess.run(cmd, stderr=subprocess.PIPE, text=True, errors="replace")
    said = proc.stderr.splitlines(keepends=True)
    refused = said.pop() if proc.returncode == 2 and said and ONE_LINE_ERROR.match(said[-1]) else None
    sys.stderr.write("".join(said))
    if refused:
        raise Refused(refused.split(": error: ", 1)[1].strip())
    if proc.returncode:
        raise RunError(f"command failed with exit code {proc.returncode}: {shlex.join(cmd)}")
    return time.time() - start


# ---------------------------------------------------------------------------------------- options
def parse_args(argv):
    """run.sh's arguments as a RunConfig (``--help`` lists the methods)."""
    epilog = "Other flags go to fairseq-train as given (e.g. --validate-interval-updates 50); see fairseq_idpg/run.py."
    return RunConfig.from_argv(argv, description=__doc__.split("\n\n")[0], epilog=method_list() + "\n\n" + epilog)


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
    # added after runs were named: a run folder's name (and a record's) stays what it was
    defining["model"].pop("weights_sha256", None)
    return hashlib.sha256(json.dumps(defining, sort_keys=True).encode()).hexdigest()[:8]


def portable_hash(config):
    """``config_hash`` without the model file's path, which the run folder's hash has always included (to
    keep finished runs' folders, it still does): the same run in another checkout or work folder has the
    same portable hash. The backbone is identified by its weights' sha256 where the config has it (the
    same tensors in another build of the file: a fresh clone's stand-in), else by its file's sha256
    (records made before the weights' digest, which match only the same file)."""
    defining = json.loads(json.dumps(config, default=str))
    defining["model"].pop("path", None)
    weights = defining["model"].get("weights_sha256")
    if weights:
        defining["model"]["sha256"] = "weights:" + weights  # config_hash drops weights_sha256 itself
    return config_hash(defining)


# ---------------------------------------------------------------------------------------- the job
def prepare_if_needed(task, raw, data, bpe, few_shot=None, dev_from_train=None, data_seed=1, dry=False, log=print):
    """Prepare ``data`` unless its task.json records the provenance that ``raw`` + ``bpe`` (prepare_data.py's
    BPE flags) and the sampling would give now; again, with the reasons printed, when it differs.
    Returns (TaskInfo or None in a dry run, the reasons to prepare, the provenance now, seconds or None)."""
    from fairseq_idpg.data.task_info import TaskInfo
    from fairseq_idpg.preprocessing import get_task
    from fairseq_idpg.preprocessing.prepare import bpe_files, provenance, provenance_differences

    spec, data = get_task(task), Path(data)
    encoding = bpe_encoding(bpe)
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
        log(f"data: {data} would be prepared ({'; '.join(reasons)}):")
        log("+ " + shlex.join(str(c) for c in prepare))
        return info, reasons, wanted, None
    if info is not None:
        log(f"data: preparing {data} again: {'; '.join(reasons)}", flush=True)
    seconds = call(prepare, log)
    info = TaskInfo.read(data)
    if info is None:
        raise RunError(f"{data}: prepare_data.py wrote no task.json")
    return info, reasons, wanted, seconds


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return job(parse_args(argv), argv)
    except RunError as e:
        print(f"run.sh: error: {e}", file=sys.stderr)
        if isinstance(e, InUse):
            return IN_USE_EXIT
        return 130 if str(e).startswith("interrupted") else 2


def warn_missing(missing, prog):
    """A dry run's last word when a run could not start: every missing file and folder, one line (exit status 0:
    the plan and its budget stand)."""
    if missing:
        print(f"{prog}: warning: not ready to run: {'; '.join(dict.fromkeys(missing))}", file=sys.stderr, flush=True)


def job(request, argv):
    missing = check(request).missing
    p = plan(request, argv)
    if request.dry_run:
        if not p.complete:
            print("  (<hash> is known once the model file and the prepared data exist)")
        if request.restart and p.folder.exists():
            print(f"--restart would remove {p.folder}")
        print("+ " + shlex.join(p.train))
        warn_missing(missing, "run.sh")
        return 0
    return execute(p)


# ---------------------------------------------------------------------------------------- the plan
@dataclasses.dataclass
class Plan:
    """One run, decided but not started: its configuration, folder and commands."""

    request: RunConfig
    argv: list  # run.sh's command line, for the logs and the record
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
    missing: list  # what a dry run found absent (model files, raw folders), one line each

    @property
    def finished(self):
        return self.complete and (self.folder / "results.json").is_file()


class Backbone(NamedTuple):
    dir: Path  # model.pt and dict.txt
    name: str  # its folder under data-bin/ and checkpoints/
    present: bool  # the files exist (a dry run of roberta.* plans without them)
    dims: dict  # the encoder's fairseq-train flags
    missing: tuple = ()  # what a dry run found absent, one line each


class Data(NamedTuple):
    folder: Path
    info: Any  # its TaskInfo (None: not prepared, or a dry run's stale data)
    provenance: Optional[dict]  # what it is made of: as recorded, or (a dry run) as it would be prepared
    missing: tuple = ()  # what a dry run found absent (the raw folder), one line each


@dataclasses.dataclass(frozen=True)
class Budget:
    """The optimisation of one run: the recipe's, explicit flags first."""

    lr: float
    batch: int  # effective, per update
    batch_size: int  # per device
    update_freq: int
    train_examples: int
    epochs: Optional[float]  # None: the updates were given (or the stand-in's smoke budget)
    updates: int
    warmup_updates: int
    splits: list  # the prepared data's
    select: str  # the dev split that picks checkpoint_best
    metric: str
    regression: bool
    num_outputs: int
    head_lr: Optional[float] = None  # the classification head's own lr (None: --lr trains everything)

    @property
    def evals(self):
        return [s for s in self.splits if re.fullmatch(r"valid\d*", s)]

    @property
    def valid_subset(self):
        return [self.select] + [s for s in self.evals if s != self.select]


def plan(request, argv=None, log=print):
    """Check the request, prepare the data if needed, and decide the run (``log`` says what it will be)."""
    request.validate()  # before anything is imported or run
    from fairseq_idpg.methods import METHODS

    method, task = METHODS[request.method], canonical_task(request.task)
    recipe, start, timings = method.recipe.for_task(task), time.time(), {}
    lr, batch, batch_size, update_freq = lr_and_batch(request, method, recipe)
    backbone = find_backbone(request)
    log(f"{task} | method {request.method} ({method.source}) | model {request.model} ({backbone.dir})", flush=True)
    data, seconds = data_for(request, task, backbone, log)
    if seconds is not None:
        timings["prepare"] = round(seconds, 1)
    budget = decide_budget(request, task, recipe, data, lr, batch, batch_size, update_freq)
    budget = dataclasses.replace(budget, head_lr=request.head_lr if request.head_lr is not None else recipe.head_lr)
    config = configuration(request, task, method, recipe, backbone, data, budget)
    complete = backbone.present and data.provenance is not None
    run_name = f"lr{format_lr(lr)}.seed{request.seed}.{config_hash(config) if complete else '<hash>'}"
    save = Path(request.work_dir) / "checkpoints" / backbone.name / task / request.method / run_name
    train = train_command(request, method, recipe, backbone, data.folder, budget, save)
    log(f"budget: {describe(budget, recipe, request.extra_args)}")
    log(f"run folder: {save}", flush=True)
    scored = budget.evals + [s for s in budget.splits if re.fullmatch(r"test\d*", s)]
    argv = request.argv() if argv is None else argv
    return Plan(request, argv, task, method, config, save, complete, train, data.folder, backbone.dir, scored,
                batch_size, timings, start, [*backbone.missing, *data.missing])  # fmt: skip


def check(request):
    """Refuse, in one line (RunError) and before anything is prepared or written, a request that cannot run:
    its values, what is missing (every model file and raw folder at once), and the fairseq-train command it
    makes (``check_train_command``), with the budget a dry run shows. Returns the dry run's plan."""
    if request.model == "standin" and not request.dry_run:
        find_backbone(request)  # built when missing (a fresh clone): its vocab.txt prepares the data
    p = plan(dataclasses.replace(request, dry_run=True), log=quiet)
    if p.missing and not request.dry_run:
        raise RunError("; ".join(p.missing))
    have_model = all((p.model_dir / name).is_file() for name in ("model.pt", "dict.txt"))
    try:
        check_train_command(p.train, p.model_dir / "dict.txt" if have_model else None)
    except ConfigError as e:
        missing_file = isinstance(e, FileNotFoundError) or isinstance(e.__context__, FileNotFoundError)
        if not (request.dry_run and missing_file):
            raise RunError(str(e)) from None
        p.missing.append(str(e))  # a file the method needs (GloVe vectors): listed like the model's
    return p


def check_train_command(train, dictionary=None):
    """ConfigError for a launcher + fairseq-train command line (``train_command``) that the launcher or
    fairseq-train would refuse, found without the data and without training: the launcher's flags,
    fairseq's own parser (a misspelt flag, a bad value), the values compat fix 10 refuses, and the model
    built on the meta device (every build-time check of a method, ``--backbone``) against ``dictionary``
    (the model's dict.txt; None: the model is not there yet, an empty vocabulary and no backbone). About
    0.1 s after fairseq's import (the data's checks are fairseq-train's, when it runs)."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq_idpg.errors import option_checks
    from fairseq_idpg.launch import build_command
    from fairseq_idpg.models.build import on_meta_device, stub_task
    from fairseq_idpg_compat import check_values, refuse

    ours, args = train[3 : train.index("--")], train[train.index("--") + 1 :]
    try:  # the flags the launcher owns
        build_command(args, *(int(flag_value(ours, f)) for f in ("--nproc", "--total-batch", "--batch-size")), cpu=True)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    parser = options.get_training_parser()
    parser.error = refuse  # argparse would print its usage and exit
    args = options.parse_args_and_arch(parser, input_args=[str(a) for a in args])
    check_values(args, args)
    vocabulary = Dictionary()
    if dictionary is not None:
        vocabulary = Dictionary.load(str(dictionary))
        vocabulary.add_symbol("<mask>")  # as the task does
    else:
        args.backbone = None
    with on_meta_device(), option_checks():
        ARCH_MODEL_REGISTRY[args.arch].build_model(args, stub_task(vocabulary))


def quiet(*args, **kwargs):
    """A ``log`` that says nothing (a sweep plans hundreds of runs)."""


def lr_and_batch(request, method, recipe):
    """(lr, effective batch, per-device batch, update freq): explicit flags, else the recipe's (the
    stand-in fine-tunes at its own lr)."""
    from fairseq_idpg.launch import layout

    if request.lr is not None:
        lr = request.lr
    elif request.model == "standin" and not method.frozen_backbone:
        lr = STANDIN_FINETUNE_LR
    else:
        lr = recipe.lr
    if lr is None:
        raise RunError(f"the {request.method} recipe has no lr for {request.task}; give --lr")
    batch = request.total_batch if request.total_batch is not None else recipe.batch
    if batch is None:
        raise RunError(f"the {request.method} recipe has no batch for {request.task}; give --total-batch")
    try:
        return (lr, batch, *layout(batch, request.nproc, request.batch_size, request.update_freq))
    except ValueError as e:
        raise RunError(str(e)) from None


def standin_lock(folder):
    """A lock beside the stand-in's folder: two runs started at once on a fresh machine (a sweep's first
    slots, test workers) build it once, the second finding it up to date."""
    from filelock import FileLock

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(folder.parent / f".{folder.name}.lock"))


def find_backbone(request):
    """The model's folder and encoder sizes (the stand-in is built when missing; a dry run of roberta.*
    uses the known sizes)."""
    mdir, dry = model_dir(request.model), request.dry_run
    if request.model == "standin" and not (mdir / "model.pt").exists() and not dry:
        os.environ.setdefault("PYTHON", sys.executable)  # the script's Python: this one
        with standin_lock(mdir):
            call(["bash", REPO / "scripts" / "build_standin.sh", mdir])
    present = (mdir / "model.pt").is_file() and (mdir / "dict.txt").is_file()
    made_by = {
        "standin": "scripts/build_standin.sh",
        "roberta.base": "scripts/download.sh roberta base",
        "roberta.large": "scripts/download.sh roberta large",
    }  # any other folder: a conversion, or the export of IDPG's supplementary stage 1
    hint = made_by.get(request.model, "scripts/convert_hf_to_fairseq.py or examples/idpg/supplementary.py make one")
    absent = f"--model {request.model}: {mdir}/model.pt and dict.txt not found ({hint})"
    if present:
        try:
            dims = model_dims(mdir / "model.pt")
        except RunError as e:
            raise RunError(f"--model {request.model}: {e}") from None
    elif dry and request.model in KNOWN_SIZES:
        dims = known_dims(request.model)
    else:
        raise RunError(absent)
    # a dry run plans without the files; the stand-in is built when a run starts
    missing = [absent] if not present and request.model != "standin" else []
    return Backbone(mdir, model_name(request.model), present, dims, missing)


def data_for(request, task, backbone, log=print):
    """The prepared data (prepared again when what it was made from differs from what would be used
    now) and the seconds preparing it took (None: not prepared now)."""
    missing = []
    try:
        raw = raw_dir(task, request.raw)
    except RunError as e:
        if not request.dry_run:
            raise
        raw, missing = None, [str(e)]
    bpe = bpe_args(backbone.dir, request.bpe_dir, request.model)
    sampling = {"few_shot": request.few_shot, "dev_from_train": request.dev_from_train, "data_seed": request.data_seed}
    folder = data_folder(request.work_dir, backbone.name, task, **sampling)
    info, reasons, wanted, seconds = prepare_if_needed(task, raw, folder, bpe, **sampling, dry=request.dry_run, log=log)
    if info is not None and request.dry_run and reasons:
        info = None  # a dry run's stale data: the budget is that of the data it would prepare
    if reasons and not missing and raw is not None and wanted is None:  # the raw folder lacks files, or no BPE
        from fairseq_idpg.preprocessing import get_task
        from fairseq_idpg.preprocessing.prepare import bpe_files

        absent = [Path(raw) / name for name in get_task(task).files if not (Path(raw) / name).is_file()]
        # the stand-in's vocab.txt comes with the stand-in, which a run builds first (check)
        if not (request.model == "standin" and not backbone.present):
            absent += [f for f in bpe_files(**bpe_encoding(bpe)).values() if not Path(f).is_file()]
        if absent:
            missing = [f"{task}: the raw files or BPE files to prepare {folder} are missing: "
                       + ", ".join(map(str, absent))]  # fmt: skip
    return Data(folder, info, info.provenance if info is not None else wanted, missing if reasons else []), seconds


def decide_budget(request, task, recipe, data, lr, batch, batch_size, update_freq):
    """The updates (explicit flags first, then the recipe's epochs over the train set; the stand-in's
    smoke budget), the warmup, and the dev split that selects checkpoint_best."""
    from fairseq_idpg.preprocessing import get_task

    info, spec = data.info, get_task(task)
    if info is not None:
        train_examples, splits = info.splits["train"], list(info.splits)
    else:
        sampled = request.few_shot is not None or request.dev_from_train is not None
        train_examples = (
            request.few_shot if request.few_shot is not None else spec.sizes[0] - (request.dev_from_train or 0)
        )
        evals = ["valid"] if sampled else ["valid" + (str(i) if i else "") for i in range(len(spec.files) - 1)]
        splits = ["train", *evals]
    epochs = None
    if request.max_update is not None:
        updates = request.max_update
    elif request.epochs is not None:
        epochs = request.epochs
        updates = dataclasses.replace(recipe, batch=batch, epochs=epochs, updates=None).num_updates(train_examples)
    elif request.model == "standin":
        updates = STANDIN_UPDATES
    else:
        updates = dataclasses.replace(recipe, batch=batch).num_updates(train_examples)
        epochs = None if recipe.updates is not None else recipe.epochs
    warmup = int(recipe.warmup * updates) if recipe.scheduler == "polynomial_decay" else 0
    evals = [s for s in splits if re.fullmatch(r"valid\d*", s)]
    source = info if info is not None else spec
    return Budget(
        lr, batch, batch_size, update_freq, train_examples, epochs, updates, warmup, splits,
        select=recipe.select_on if recipe.select_on in evals else "valid", metric=source.metric,
        regression=source.regression, num_outputs=info.num_outputs if info is not None else spec.num_classes,
    )  # fmt: skip


def configuration(request, task, method, recipe, backbone, data, budget):
    """config.json: everything that defines the run (``config_hash`` names its folder by it)."""
    model_file = backbone.dir / "model.pt"
    return {
        "task": task,
        "method": {"name": method.name, "arch": method.arch, "task": method.task, "options": dict(method.options),
                   "frozen_backbone": method.frozen_backbone},
        "model": {"name": request.model, "path": str(model_file.resolve()),
                  "sha256": sha256(model_file) if backbone.present else None,
                  "dict_sha256": sha256(backbone.dir / "dict.txt") if backbone.present else None,
                  "weights_sha256": weights_sha256(model_file) if backbone.present else None},
        "data": {"folder": str(data.folder), "provenance": data.provenance,
                 "extra": dict(data.info.extra) if data.info is not None else {},  # e.g. a doubled train set
                 "train_examples": budget.train_examples},
        "seed": request.seed, "lr": budget.lr, "batch": budget.batch, "epochs": budget.epochs,
        "updates": budget.updates, "scheduler": recipe.scheduler,
        "warmup": recipe.warmup if recipe.scheduler == "polynomial_decay" else 0.0,
        "warmup_updates": budget.warmup_updates, "clip_norm": recipe.clip_norm, "dropout": recipe.dropout,
        "weight_decay": recipe.weight_decay, "select_on": budget.select, "valid_subset": budget.valid_subset,
        "metric": budget.metric, "max_tokens": request.max_tokens, "fp16": request.fp16,
        "extra_args": list(request.extra_args),
        "layout": {"nproc": request.nproc, "batch_size": budget.batch_size, "update_freq": budget.update_freq},
        **({"head_lr": budget.head_lr} if budget.head_lr is not None else {}),  # added since: hashed only when set
        **request.config_options(),  # options added since: hashed only when not at their default
    }  # fmt: skip


def intervals(updates, extra, standin):
    """fairseq-train's validation and save intervals: the stand-in's smoke budgets validate and save
    (resumably) 3 times, whatever the epochs' length; mid-epoch saves keep only the latest."""
    flags = []
    if standin:
        every = flag_value(extra, "--validate-interval-updates") or max(1, updates // 3)
        flags += ["--validate-interval-updates", every]
        if flag_value(extra, "--save-interval-updates") is None:
            flags += ["--save-interval-updates", every]
        # not also at each epoch's end: few-shot epochs of 32 updates would validate 10 times
        for flag in ("--validate-interval", "--save-interval"):
            if flag_value(extra, flag) is None:
                flags += [flag, 10**6]
    saves_mid_epoch = "--save-interval-updates" in flags or flag_value(extra, "--save-interval-updates")
    if saves_mid_epoch and flag_value(extra, "--keep-interval-updates") is None:
        flags += ["--keep-interval-updates", 1]  # checkpoint_<epoch>_<update>.pt: the latest only
    return flags


def train_command(request, method, recipe, backbone, data, budget, save):
    """The launcher + fairseq-train command line (the flags given last: they win)."""
    model_file, b, extra = backbone.dir / "model.pt", budget, list(request.extra_args)
    # a frozen backbone is loaded at build time; a fine-tuned one is the first launch's start only (a
    # resumed run continues from its checkpoint_last.pt)
    init = ["--backbone" if method.frozen_backbone else "--finetune-from-model", model_file]
    schedule = ["--lr-scheduler", "fixed"]
    if recipe.scheduler != "fixed":
        schedule = ["--lr-scheduler", "polynomial_decay", "--total-num-update", b.updates]
        schedule += ["--warmup-updates", b.warmup_updates]
    optimizer = ["--optimizer", "adam"]
    if b.head_lr is not None:  # the head at its own lr: fairseq_idpg/optim.py
        optimizer = ["--optimizer", "adam_head_lr", "--head-lr", b.head_lr]
        # fp16's one flat fp32 copy of the trained tensors would merge the head into the rest
        optimizer += ["--fp16-no-flatten-grads"] if request.fp16 else []
    # a command line reads best as flag-value pairs
    # fmt: off
    train = [
        data, "--user-dir", REPO / "fairseq_idpg", *method.train_args(),
        "--criterion", "sentence_prediction_metrics", "--num-classes", b.num_outputs,
        "--init-token", 0, "--separator-token", 2,
        *[x for kv in backbone.dims.items() for x in kv], *init,
        "--dropout", recipe.dropout, "--attention-dropout", recipe.dropout, "--weight-decay", recipe.weight_decay,
        *optimizer, "--adam-betas", "(0.9, 0.98)", "--adam-eps", 1e-06, "--clip-norm", recipe.clip_norm,
        *schedule, "--lr", b.lr, "--max-update", b.updates,
        "--valid-subset", ",".join(b.valid_subset),
        "--best-checkpoint-metric", b.metric, "--maximize-best-checkpoint-metric",
        "--save-dir", save, "--no-epoch-checkpoints", *intervals(b.updates, extra, request.model == "standin"),
        "--seed", request.seed,
        "--log-format", "json", "--log-interval", max(1, min(100, b.updates // 30)), "--num-workers", 0,
    ]
    # fmt: on
    train += ["--regression-target"] if b.regression else []
    train += ["--max-tokens", request.max_tokens] if request.max_tokens is not None else []
    train += ["--fp16"] if request.fp16 else []
    train += ["--bf16"] if request.bf16 else []
    launch = [sys.executable, "-m", "fairseq_idpg.launch", "--nproc", request.nproc, "--total-batch", b.batch]
    launch += ["--batch-size", b.batch_size, "--"]
    return [str(x) for x in launch + train] + extra


def describe(budget, recipe, extra=()):
    """The budget line: batch and its layout, epochs and updates, lr and schedule, selection."""
    b, decay = budget, recipe.scheduler == "polynomial_decay"
    overridden = [f for f in ("--clip-norm", "--lr-scheduler", "--warmup-updates", "--weight-decay") if f in extra]
    return (
        f"batch {b.batch} ({b.batch_size} per device x {b.batch // b.batch_size // b.update_freq} device(s) x "
        f"update-freq {b.update_freq}), "
        + (f"{b.epochs:g} epochs of {b.train_examples:,} examples = " if b.epochs is not None else "")
        + f"{b.updates:,} updates, lr {b.lr:g}"
        + (f", head lr {b.head_lr:g}" if b.head_lr is not None else "")
        + f" ({recipe.scheduler}"
        + (f", warmup {recipe.warmup:.0%} = {b.warmup_updates:,} updates" if decay else "")
        + f"), clip {recipe.clip_norm}, weight decay {recipe.weight_decay:g}, dropout {recipe.dropout:g}, "
        + f"selection on {b.select} ({SPLIT_NAMES.get(b.select, b.select)}) by {b.metric}"
        + (f" (flags given override {', '.join(overridden)})" if overridden else "")
    )


RUN_LOCK = ".lock"  # in the run folder: held by the one process training or scoring it
IN_USE_EXIT = 75  # run.py's exit status for a run folder in use (os.EX_TEMPFAIL): a sweep skips it, not a failure


class InUse(RunError):
    """Another process holds the run folder (``RUN_LOCK``): run.py stops with one line, exit ``IN_USE_EXIT``."""


@contextlib.contextmanager
def run_folder_lock(save):
    """Held while this process trains or scores the run in ``save``: a second process on the same
    configuration (another sweep, a second run.sh) stops with one line instead of writing the same
    checkpoints and logs. An fcntl lock goes with its process, so a killed run leaves none held."""
    from filelock import FileLock, Timeout

    save.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(save / RUN_LOCK))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise InUse(
            f"{save} is in use: another process (a sweep or run.sh with this configuration) is training "
            "or scoring it; wait for it to end, or stop it first"
        ) from None
    try:
        yield
    finally:
        lock.release()


def execute(p):
    """Train (or resume) and score the planned run; results.json marks it finished."""
    new = not p.folder.exists()
    with run_folder_lock(p.folder):
        return execute_locked(p, new)


def execute_locked(p, new):
    save = p.folder
    if p.request.restart and not new:
        print(f"--restart: removing {save}", flush=True)
        for child in save.iterdir():  # all but the lock this process holds
            if child.name != RUN_LOCK:
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        new = True  # a refused restart leaves nothing behind either
    if (save / "results.json").is_file():
        done = json.loads((save / "results.json").read_text())
        print(f"cached: this configuration finished on {done.get('finished', '?')}; not training it again")
        print(f"  (results {save / 'results.json'}; --restart trains it again)")
        if done.get("diverged"):
            print(diverged_line(done["diverged"], done["lr"]))
        else:
            show_scores(done["results"], done["metric"])
        return 0
    trained = trained_before(p)
    (save / "config.json").write_text(json.dumps(p.config, indent=1) + "\n")
    failure = None
    try:
        if not trained:
            train(p)
    except RunError as e:  # fairseq's FloatingPointError is a divergence, any other failure stays one
        failure = e
    if new and isinstance(failure, Refused):  # fairseq-train refused what run.sh could not check (the data)
        remove_run_folder(save, Path(p.request.work_dir))
        raise failure
    found = divergence(save / "train.log")
    if found is None and failure is not None:
        raise failure
    if found is not None:
        (save / "crash.pt").unlink(missing_ok=True)  # fairseq's copy of the diverged state: nothing to resume
        write_record(p, {}, diverged=found)
        print(diverged_line(found, p.config["lr"]), file=sys.stderr)
        return 0
    results = score(p)
    write_record(p, results)
    return 0


def remove_run_folder(save, work_dir):
    """Remove a run folder made for a refused run, and the parents it leaves empty, up to ``work_dir``."""
    shutil.rmtree(save)
    for parent in save.parents:
        if parent == work_dir or not parent.is_relative_to(work_dir) or any(parent.iterdir()):
            break
        parent.rmdir()


FLOATING_POINT_ERROR = re.compile(r"^FloatingPointError: (.+)$", re.M)


def divergence(train_log):
    """``{"update", "reason"}`` where the run diverged, read from fairseq-train's log, or None: the first
    training or validation loss logged as NaN or inf, else fairseq's ``FloatingPointError`` (NaN/Inf
    gradients in fp32, or fp16's loss scale at its minimum: fairseq's normal skipped fp16 updates log no
    loss and are not divergence), at the update after the last one logged."""
    from fairseq_idpg.logs import read_log

    text = Path(train_log).read_text(encoding="utf-8", errors="replace") if Path(train_log).is_file() else ""
    last = 0
    for entry in read_log(text):
        loss, updates = entry.stats.get("loss"), entry.stats.get("num_updates")
        if isinstance(loss, float) and not math.isfinite(loss):
            return {"update": int(updates if isinstance(updates, (int, float)) else last + 1),
                    "reason": f"{entry.tag} loss {loss}"}  # fmt: skip
        last = int(updates) if isinstance(updates, (int, float)) else last
    error = FLOATING_POINT_ERROR.findall(text)
    return {"update": last + 1, "reason": error[-1].strip()} if error else None


def diverged_line(diverged, lr):
    return (
        f"diverged at update {diverged['update']} (lr {lr:g}): {diverged['reason']}; "
        "results.json records it without a score (--restart trains it again)"
    )


def trained_before(p):
    """Whether an interrupted run of this configuration had finished training (else it resumes)."""
    save, updates = p.folder, p.config["updates"]
    if not (save / "checkpoint_last.pt").is_file():
        return False
    done_updates, resume = checkpoint_updates(save / "checkpoint_last.pt")
    if done_updates >= updates:
        print(f"training finished earlier ({done_updates} updates in {resume}); scoring it", flush=True)
    else:
        print(f"resuming from {resume} at update {done_updates} of {updates}", flush=True)
    before = json.loads((save / "config.json").read_text()).get("layout") if (save / "config.json").is_file() else None
    if before and before != p.config["layout"]:
        print(f"note: device layout {before} -> {p.config['layout']}; the same effective batch, other batch shards")
    return done_updates >= updates


def train(p):
    """fairseq-train, its output in train.log and on the terminal with the time left."""
    save = p.folder
    with open(save / "train.log", "a", encoding="utf-8") as f:
        f.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} scripts/run.sh {shlex.join(p.argv)}\n")
    cmd = p.train
    if p.request.nproc == 1:
        # the launcher would only print and exec this fairseq-train command: run it from here, the same
        # process and output, one interpreter start (about 4 s) fewer
        from fairseq_idpg.launch import resolve

        _, cmd = resolve(p.train[p.train.index("fairseq_idpg.launch") + 1 :])  # the launcher's arguments
        print("+ " + shlex.join(p.train), flush=True)
        with open(save / "train.log", "a", encoding="utf-8") as f:
            f.write("+ " + shlex.join(cmd) + "\n")
    seconds, _ = tee(cmd, save / "train.log", progress=TrainingEta(p.config["updates"]))
    p.timings["train"] = round(seconds, 1)
    # checkpoint_<epoch>_<updates>.pt (mid-epoch saves, for resuming) repeat checkpoint_last.pt now
    for interval in save.glob("checkpoint_*_*.pt"):
        if re.fullmatch(r"checkpoint_\d+_\d+\.pt", interval.name):
            interval.unlink()


def score(p):
    """fairseq-validate's scores of checkpoint_best.pt on every dev (and test) split: {split: {metric: value}}."""
    from fairseq_idpg.logs import validate_scores

    save, select = p.folder, p.config["select_on"]
    # fairseq-validate of this interpreter's environment; the backbone where it is now (the
    # checkpoint names the path it was trained with, which may have moved since)
    validate = [
        console_script("fairseq-validate"), p.data, "--user-dir", REPO / "fairseq_idpg",
        "--path", save / "checkpoint_best.pt",
        "--valid-subset", ",".join(p.evals), "--batch-size", p.batch_size, "--num-workers", 0,
        "--log-format", "json", "--log-interval", 10**9,  # one json line per subset, in order
    ]  # fmt: skip
    if p.method.frozen_backbone:
        validate += ["--model-overrides", repr({"backbone": str(p.model_dir / "model.pt")})]
    if p.request.max_tokens is not None:
        validate += ["--max-tokens", p.request.max_tokens]
    if not _cuda():
        validate.append("--cpu")
    seconds, out = tee(validate, save / "validate.log", show=lambda line: False, keep=True)
    p.timings["validate"] = round(seconds, 1)
    try:
        results = validate_scores(out, p.evals)
    except ValueError as e:
        raise RunError(f"{e} (see {save / 'validate.log'})") from None
    if select not in results:
        raise RunError(f"fairseq-validate printed no score for {select} (see {save / 'validate.log'})")
    return results


def write_record(p, results, diverged=None):
    """Print the scores and write results.json: the scores, the configuration, the commit, the timings. A
    diverged run (``diverged``: where and why) is a result without scores: ``score`` None, ``results`` {}."""
    request, config, save, timings = p.request, p.config, p.folder, p.timings
    updates, batch, lr, metric = config["updates"], config["batch"], config["lr"], config["metric"]
    print(f"\n== {p.task} | model {request.model} | method {request.method} | {updates} updates, batch {batch}, "
          f"lr {lr:g}")  # fmt: skip
    show_scores(results, metric)
    timings["total"] = round(time.time() - p.start, 1)
    print("times: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    print(f"run folder: {save}")
    record = {
        "task": p.task,
        "model": request.model,
        "method": request.method,
        "metric": metric,
        "select_on": config["select_on"],
        "score": None if diverged else results[config["select_on"]].get(metric),
        **({"diverged": diverged} if diverged else {}),
        "results": results,
        "seed": request.seed,
        "lr": lr,
        "updates": updates,
        "total_batch": batch,
        "config": config,
        "run": save.name,
        "git": git_state(),
        "timings": timings,
        "device": device_name(),  # what the timings (and CUDA's own random streams) were measured on
        # the dev metrics fairseq-train logged at each validation (its --log-format json lines)
        "curve": learning_curve((save / "train.log").read_text(encoding="utf-8", errors="replace")),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": shlex.join(["scripts/run.sh", *p.argv]),
    }
    (save / "results.json").write_text(json.dumps(record, indent=1) + "\n")


def _cuda():
    import torch

    return torch.cuda.is_available()


def device_name():
    """Where fairseq-train ran: the first visible CUDA device's name (as fairseq picks it), else "cpu"."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    sys.exit(main())
