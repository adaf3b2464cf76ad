"""The checkout's layout: where raw data, models, BPE files, prepared data and runs are by default.

The one module that knows the checkout (``REPO``) and what lies beside it (``../shared``); every other
part of the run takes these paths as arguments.
"""

import os
from pathlib import Path

from fairseq_idpg.errors import RunError
from fairseq_idpg.preprocessing.formats import LMBFF, TASKS

REPO = Path(__file__).resolve().parents[1]
# LM-BFF's tasks, whose raw folder is $LMBFF_DIR/<task> (GLUE's: $GLUE_DIR/<TASK>)
LMBFF_TASKS = {name: name.lower() for name, spec in TASKS.items() if spec.files == LMBFF}
SHARED = REPO.parent / "shared"
SHARED_DATA = SHARED / "data"
DATA_DIR = REPO / "data"  # scripts/download.sh glue / lmbff / glove write here
SAMPLE_DIR = DATA_DIR / "sample"  # made-up data of a main job that found no task data and could not download it
MODELS_DIR = REPO / "models"  # scripts/download.sh and build_standin.sh write here
STANDIN_DIR = MODELS_DIR / "minilm-l6-fairseq"
GPT2_BPE_DIRS = (SHARED / "roberta_bpe", MODELS_DIR / "gpt2_bpe")  # the second: scripts/download.sh bpe
GLOVE_FILE = DATA_DIR / "glove" / "glove.6B.300d.txt"  # where scripts/download.sh glove puts it


def bpe_places(bpe):
    """Where the checkout keeps the files of a BPE kind: ``wordpiece``: the model folders' vocab.txt; ``gpt2``:
    ``GPT2_BPE_DIRS`` and the model folders with an encoder.json. None: not a kind the checkout keeps."""
    if bpe == "wordpiece":
        return sorted(MODELS_DIR.glob("*/vocab.txt"))
    if bpe == "gpt2":
        return [*GPT2_BPE_DIRS, *sorted(p.parent for p in MODELS_DIR.glob("*/encoder.json"))]
    return None


def raw_places(task):
    """Where the raw folder of ``task`` is looked for, in order (each an (origin, path)): ``$GLUE_DIR/<TASK>``
    (``$LMBFF_DIR/<task>`` for LM-BFF's tasks) when set, the checkout's ``data/`` (where scripts/download.sh
    puts it), ``../shared/data`` beside the checkout."""
    env, kind, name = ("LMBFF_DIR", "lmbff", LMBFF_TASKS[task]) if task in LMBFF_TASKS else ("GLUE_DIR", "glue", task)
    places = [(f"${env}", Path(os.environ[env]) / name)] if os.environ.get(env) else []
    return places + [("scripts/download.sh", DATA_DIR / kind / name), ("../shared/data", SHARED_DATA / kind / name)]


def download_command(task):
    """The scripts/download.sh command that puts ``task``'s raw folder in the checkout's ``data/``."""
    return "scripts/download.sh lmbff" if task in LMBFF_TASKS else f"scripts/download.sh glue --tasks {task}"


def raw_dir(task, raw=None):
    """The raw folder of ``task``: ``raw`` when given, else the first of ``raw_places`` that exists; a RunError
    naming every place looked in when none does."""
    if raw:
        if not Path(raw).is_dir():
            raise RunError(f"raw data for {task} not found: --raw {raw} is not a folder")
        return Path(raw)
    places = raw_places(task)
    found = next((path for _, path in places if path.is_dir()), None)
    if found is None:
        looked = ", ".join(f"{path} ({origin})" for origin, path in places)
        raise RunError(
            f"raw data for {task} not found; looked in {looked} (run {download_command(task)}, "
            f"give --raw DIR or set ${'LMBFF_DIR' if task in LMBFF_TASKS else 'GLUE_DIR'})"
        )
    return found


def model_dir(model):
    if model == "standin":
        return STANDIN_DIR
    if model in ("roberta.base", "roberta.large"):
        return MODELS_DIR / model
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
        bpe_dir = next((d for d in GPT2_BPE_DIRS if d.is_dir()), GPT2_BPE_DIRS[-1])
    return ["--bpe", "gpt2", "--bpe-dir", Path(bpe_dir)]


def bpe_encoding(bpe):
    """prepare_data.py's BPE flags (``bpe_args``) as the keywords of its ``bpe_files`` and ``provenance``."""
    return {"bpe": bpe[1], "bpe_dir" if bpe[1] == "gpt2" else "vocab": str(bpe[3])}


def data_folder(work, name, task, few_shot=None, dev_from_train=None, data_seed=1, split_dev=False):
    """``WORK/data-bin/<model>/<TASK>``; sampled data gets its own folder (``RTE.few-shot100.seed3``,
    ``RTE.dev500.seed3``, ``RTE.split-dev.seed3``)."""
    base = Path(work) / "data-bin" / name
    if few_shot is not None:
        return base / f"{task}.few-shot{few_shot}.seed{data_seed}"
    if dev_from_train is not None:
        return base / f"{task}.dev{dev_from_train}.seed{data_seed}"
    if split_dev:
        return base / f"{task}.split-dev.seed{data_seed}"
    return base / task


def folder_lock(folder):
    """A lock beside ``folder``: two runs started at once on a fresh machine (a sweep's first slots, test
    workers) make it once (the stand-in, a download), the second finding it made."""
    from filelock import FileLock

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(folder.parent / f".{folder.name}.lock"))


standin_lock = folder_lock  # the stand-in's folder: built once
