"""Bad inputs (issue 11): one line ``PROG: error: MESSAGE``, exit status 2, nothing left behind, for
prepare_data.py, fairseq-train, fairseq-validate, scripts/run.sh and the hub (which raises ConfigError).

A table per entry point. The cases run in this process (each entry point's ``main``/``cli_main`` with
its argv), on the tiny backbone of conftest.py and 8-row SST-2 data; one real process per console
script proves what a user sees. fairseq-train's cases cost ~2.5 s each (fairseq composes its hydra
config), so the table keeps one case per check.
"""

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from checkpoint_support import forget_best_score

REPO = Path(__file__).resolve().parents[1]
DIMS = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64"]
DIMS += ["--encoder-attention-heads", "4"]
WORDS = ["good", "bad", "fine", "awful", "nice", "dull", "great", "poor"]


def load_script(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name.replace(".", "_"), REPO / "scripts" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sst2(raw, train=None, dev=None):
    rows = "".join(f"{w} film .\t{i % 2}\n" for i, w in enumerate(WORDS))
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "train.tsv").write_text("sentence\tlabel\n" + rows if train is None else train)
    (raw / "dev.tsv").write_text("sentence\tlabel\n" + rows if dev is None else dev)
    return raw


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny):
    """Prepared 8-row SST-2 on the tiny backbone's vocabulary, and one run trained on it (1 update)."""
    from fairseq_cli import train

    work = tmp_path_factory.mktemp("bad_inputs")
    data = work / "bin"
    prepare = ["SST-2", "--raw", str(sst2(work / "raw")), "--out", str(data), "--bpe", "wordpiece"]
    assert load_script("prepare_data.py").main(prepare + ["--vocab", str(tiny.folder / "vocab.txt")]) == 0
    w = types.SimpleNamespace(work=work, data=data, tiny=tiny, save=work / "trained")
    forget_best_score()
    code, err = call(train.cli_main, "fairseq-train", train_argv(w, "prompt-tuning-5", w.save))
    forget_best_score()  # for the trainings of later tests in this process
    assert code == 0 and (w.save / "checkpoint_best.pt").is_file(), err
    return w


def train_argv(w, method, save, data=None):
    from fairseq_idpg.methods import get_method

    return [str(data or w.data), "--user-dir", str(REPO / "fairseq_idpg"), *get_method(method).train_args(), *DIMS] + [
        "--backbone", str(w.tiny.model_file), "--criterion", "sentence_prediction_metrics",
        "--init-token", "0", "--separator-token", "2", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "4",
        "--max-update", "1", "--save-dir", str(save), "--cpu", "--num-workers", "0", "--no-epoch-checkpoints",
        "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric", "--log-format", "none",
    ]  # fmt: skip


def call(main, prog, argv):
    """(exit status, stderr) of ``main()`` run as ``prog argv`` in this process."""
    import contextlib
    import io

    err, old = io.StringIO(), sys.argv
    sys.argv = [prog, *map(str, argv)]
    try:
        with contextlib.redirect_stderr(err):
            code = main() or 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = old
    return code, err.getvalue()


def one_line(err, prog, expected):
    # prepare's row-count warnings; fairseq's import-time log lines (in a new process)
    lines = [line for line in err.strip().splitlines() if not line.startswith("warning: ") and " | INFO | " not in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"{prog}: error: ") and expected in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------------------------------- prepare_data.py
PREPARE = {
    "header-only train": (lambda t: ["SST-2", "--raw", sst2(t / "raw", train="sentence\tlabel\n")], "no examples"),
    "empty dev": (lambda t: ["SST-2", "--raw", sst2(t / "raw", dev="")], "dev.tsv"),
    "workers 0": (lambda t: ["SST-2", "--raw", sst2(t / "raw"), "--workers", "0"], "--workers must be >= 1, got 0"),
    "workers -2": (lambda t: ["SST-2", "--raw", sst2(t / "raw"), "--workers", "-2"], "--workers must be >= 1, got -2"),
    "no raw folder": (lambda t: ["SST-2", "--raw", t / "nowhere"], "nowhere: no such folder"),
    "unknown task": (lambda t: ["SST3", "--raw", sst2(t / "raw")], "unknown task 'SST3'"),
    "few-shot 0": (lambda t: ["SST-2", "--raw", sst2(t / "raw"), "--few-shot", "0"], "K must be at least 1"),
    "dev-from-train 8": (lambda t: ["SST-2", "--raw", sst2(t / "raw"), "--dev-from-train", "8"], "between 1 and 7"),
    "no vocab": (lambda t: ["SST-2", "--raw", sst2(t / "raw"), "--vocab", t / "no-vocab.txt"], "--vocab"),
    # argparse's own errors: the line alone, not after the usage
    "workers not a number": (lambda t: ["SST-2", "--raw", sst2(t / "raw"), "--workers", "x"], "invalid int value"),
    "bpe not a choice": (lambda t: ["SST-2", "--raw", sst2(t / "raw"), "--bpe", "spm"], "invalid choice: 'spm'"),
}


@pytest.mark.parametrize("case", PREPARE)
def test_prepare(tmp_path, tiny, case):
    make, expected = PREPARE[case]
    argv = make(tmp_path)
    argv += ["--out", tmp_path / "out" / "bin", "--bpe", "wordpiece"]
    argv += [] if "--vocab" in argv else ["--vocab", tiny.folder / "vocab.txt"]
    code, err = call(load_script("prepare_data.py").main, "prepare_data.py", argv)
    assert code == 2
    one_line(err, "prepare_data.py", expected)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------- fairseq-train
def no_labels(w, t):
    shutil.copytree(w.data, t / "bin")
    shutil.rmtree(t / "bin" / "label")
    return t / "bin"


def text_file(t):
    (t / "notes.txt").write_text("not a checkpoint\n")
    return t / "notes.txt"


def plain_dict(t):
    torch.save({"weight": torch.zeros(2)}, t / "plain.pt")
    return t / "plain.pt"


def truncated(w, t):
    (t / "cut.pt").write_bytes(w.tiny.model_file.read_bytes()[:4096])
    return t / "cut.pt"


def empty_split(w, t):
    """A copy of the data whose binarized dev split holds no rows."""
    from fairseq.data.indexed_dataset import MMapIndexedDatasetBuilder

    shutil.copytree(w.data, t / "bin")
    for column in ("input0", "label"):
        files = t / "bin" / column / "valid"
        MMapIndexedDatasetBuilder(f"{files}.bin").finalize(f"{files}.idx")
    return t / "bin"


def trained_copy(w, t):
    """A save folder holding the trained run's checkpoints (fairseq-train resumes from its checkpoint_last.pt)."""
    shutil.copytree(w.save, t / "resume")
    return t / "resume"


PHM_N_5 = (
    "fairseq-train: error: --idpg-phm-n 5 must divide the generator input size 32 (roberta), --idpg-hidden 16 "
    "and t*d = 5*32 = 160; valid here: 1, 2, 4, 8, 16"
)
# case: (method, extra flags (w, tmp) -> list, data (w, tmp) -> folder or None, expected part of the line)
TRAIN = {
    "prompt length 0": (
        "prompt-tuning-5",
        lambda w, t: ["--prompt-length", "0"],
        None,
        "--prompt-length 0: the prompt",
    ),
    "PHM n 5": ("m-idpg-phm", lambda w, t: ["--idpg-phm-n", "5"], None, PHM_N_5),
    "position 2 single": ("prompt-tuning-5", lambda w, t: ["--prompt-position", "2"], None, "needs sentence pairs"),
    "DPT rank 0": ("dpt", lambda w, t: ["--dpt-bottleneck", "0"], None, "--dpt-bottleneck 0 must be in [1, 31]"),
    "LoRA rank 0": ("lora", lambda w, t: ["--lora-rank", "0"], None, "--lora-rank must be >= 1"),
    "heads 5": (
        "lora",
        lambda w, t: ["--encoder-attention-heads", "5"],
        None,
        "--encoder-attention-heads 5 must divide",
    ),
    "backbone missing": ("lora", lambda w, t: ["--backbone", t / "gone.pt"], None, "gone.pt: no such file"),
    "backbone text": ("lora", lambda w, t: ["--backbone", text_file(t)], None, "notes.txt: not a fairseq checkpoint"),
    "lr 0": ("lora", lambda w, t: ["--lr", "0"], None, "--lr must be > 0 (the learning rate), got 0"),
    "head lr -1": (
        "dpt",
        lambda w, t: ["--optimizer", "adam_head_lr", "--head-lr", "-1"],
        None,
        "--head-lr must be > 0 (the classification head's learning rate), got -1.0",
    ),
    "num-classes 3": ("lora", lambda w, t: ["--num-classes", "3"], None, "--num-classes 3: the data in"),
    "no data folder": ("lora", lambda w, t: [], lambda w, t: t / "nowhere", "nowhere: no such folder"),
    "no label/": ("lora", lambda w, t: [], no_labels, "lacks label/dict.txt"),
    "no valid split": ("lora", lambda w, t: ["--valid-subset", "dev"], None, "dataset not found: "),
    # load failures (issue 23)
    "empty valid split": ("lora", lambda w, t: [], empty_split, "valid.bin/.idx: no rows"),
    "resume on another backbone": (
        "prompt-tuning-5",
        lambda w, t: ["--backbone", other_backbone(w, t), "--save-dir", trained_copy(w, t)],
        None,
        "checkpoint was trained on another backbone",
    ),
}


@pytest.mark.parametrize("case", TRAIN)
def test_train(world, tmp_path, case):
    from fairseq_cli import train

    method, extra, data, expected = TRAIN[case]
    save = tmp_path / "save"
    argv = train_argv(world, method, save, data and data(world, tmp_path)) + extra(world, tmp_path)
    code, err = call(train.cli_main, "fairseq-train", argv)
    assert code == 2
    one_line(err, "fairseq-train", expected)
    assert not save.exists()


# ---------------------------------------------------------------------------------------- fairseq-validate
VALIDATE = {
    "no --path": (lambda w, t: [], "--path is required"),
    "path missing": (lambda w, t: ["--path", t / "gone.pt"], "gone.pt: no such file (expected a checkpoint file"),
    "path folder": (lambda w, t: ["--path", w.save], "trained: a folder (expected a checkpoint file"),
    "path text": (lambda w, t: ["--path", text_file(t)], "notes.txt: not a fairseq checkpoint"),
    "no test split": (lambda w, t: ["--path", w.save / "checkpoint_best.pt", "--valid-subset", "test"], "test.bin"),
    "backbone moved": (
        lambda w, t: [
            "--path",
            w.save / "checkpoint_best.pt",
            "--model-overrides",
            repr({"backbone": str(t / "x.pt")}),
        ],
        "--backbone",
    ),
}


@pytest.mark.parametrize("case", VALIDATE)
def test_validate(world, tmp_path, case):
    from fairseq_cli import validate

    make, expected = VALIDATE[case]
    argv = [world.data, "--user-dir", REPO / "fairseq_idpg", "--cpu", "--batch-size", "4", *make(world, tmp_path)]
    code, err = call(validate.cli_main, "fairseq-validate", argv)
    assert code == 2
    one_line(err, "fairseq-validate", expected)


# ---------------------------------------------------------------------------------------- the hub
HUB = {
    "backbone missing": (lambda w, t: {"backbone": str(t / "gone.pt")}, "gone.pt: no such file"),
    "backbone text": (lambda w, t: {"backbone": str(text_file(t))}, "notes.txt: not a fairseq checkpoint"),
    "backbone folder": (lambda w, t: {"backbone": str(w.tiny.folder)}, "is a folder, not a fairseq checkpoint"),
    "backbone dict": (lambda w, t: {"backbone": str(plain_dict(t))}, "no 'model' weights"),
    "backbone cut": (lambda w, t: {"backbone": str(truncated(w, t))}, "cut.pt: not a fairseq checkpoint"),
    "other backbone": (lambda w, t: {"backbone": str(other_backbone(w, t))}, "trained on another backbone"),
    "no labels": (lambda w, t: {"data_name_or_path": str(no_labels(w, t))}, "lacks label/dict.txt"),
}


def other_backbone(w, t):
    state = torch.load(w.tiny.model_file, map_location="cpu", weights_only=False)
    state["model"]["encoder.sentence_encoder.layers.0.fc1.weight"].mul_(1.5)
    torch.save(state, t / "other.pt")
    return t / "other.pt"


@pytest.mark.parametrize("case", HUB)
def test_hub(world, tmp_path, case):
    from fairseq.models.roberta import RobertaModel

    from fairseq_idpg.errors import ConfigError

    make, expected = HUB[case]
    options = {"data_name_or_path": str(world.data), **make(world, tmp_path)}
    with pytest.raises(ConfigError) as raised:
        RobertaModel.from_pretrained(
            str(world.save), "checkpoint_best.pt", user_dir=str(REPO / "fairseq_idpg"), bpe="wordpiece",
            wordpiece_vocab=str(world.tiny.folder / "vocab.txt"), **options,
        )  # fmt: skip
    assert expected in str(raised.value) and "\n" not in str(raised.value)


# ---------------------------------------------------------------------------------------- scripts/run.sh
RUN = {
    "nproc 0": (["--nproc", "0"], "--nproc must be > 0, got 0"),
    "nproc -1": (["--nproc", "-1"], "--nproc must be > 0, got -1"),
    "lr 0": (["--lr", "0"], "--lr must be > 0, got 0.0"),
    "max-update 0": (["--max-update", "0"], "--max-update must be > 0, got 0"),
    "epochs -1": (["--epochs", "-1"], "--epochs must be > 0, got -1.0"),
    "total-batch 0": (["--total-batch", "0"], "--total-batch must be > 0, got 0"),
    "unknown method": (["--method", "nope"], "unknown --method 'nope'"),
    "batch layout": (["--total-batch", "32", "--nproc", "3"], "--total-batch 32 is not a multiple"),
    "nproc not a number": (["--nproc", "x"], "argument --nproc: invalid int value: 'x'"),
    "lr not a number": (["--lr", "fast"], "argument --lr: invalid float value: 'fast'"),
}


@pytest.mark.parametrize("case", RUN)
def test_run(tmp_path, case):
    from fairseq_idpg import run

    argv, expected = RUN[case]
    code, err = call(lambda: run.main(["SST-2", *argv, "--work-dir", str(tmp_path / "work")]), "run.sh", [])
    assert code == 2
    one_line(err, "run.sh", expected)
    assert not (tmp_path / "work").exists()


# ---------------------------------------------------------------------------------------- scripts/train.sh
LAUNCH = {
    "nproc 0": (["--nproc", "0", "--total-batch", "8", "--", "data"], "--nproc must be >= 1, got 0"),
    "total-batch 0": (["--total-batch", "0", "--", "data"], "--total-batch must be >= 1, got 0"),
    "no total-batch": (["--", "data"], "the following arguments are required: --total-batch"),
    "no fairseq-train args": (["--total-batch", "8"], "give the fairseq-train arguments after --"),
    "launcher's flag": (["--total-batch", "8", "--", "data", "--update-freq", "2"], "--update-freq is set by the"),
    "batch layout": (["--total-batch", "8", "--nproc", "3", "--", "data"], "--total-batch 8 is not a multiple"),
    "nproc not a number": (["--nproc", "x", "--total-batch", "8", "--", "data"], "invalid int value: 'x'"),
}


@pytest.mark.parametrize("case", LAUNCH)
def test_launch(case):
    from fairseq_idpg import launch

    argv, expected = LAUNCH[case]
    code, err = call(lambda: launch.main(argv), "scripts/train.sh", [])
    assert code == 2
    one_line(err, "scripts/train.sh", expected)


# ---------------------------------------------------------------------------------------- run.sh: checked first
def not_a_checkpoint(w, t, make=text_file):
    """A model folder (dict.txt, vocab.txt) whose model.pt is not a fairseq checkpoint."""
    folder = t / "notes-model"
    shutil.copytree(w.tiny.folder, folder)
    make(t).replace(folder / "model.pt")
    return folder


def absent_model():
    """roberta.base, which no test downloads (models/roberta.base/ absent)."""
    if (REPO / "models" / "roberta.base").exists():
        pytest.skip("models/roberta.base exists here")
    return "roberta.base"


def no_glove():
    """No flags: M-IDPG-PHM-GloVe then reads data/glove/glove.6B.300d.txt, which no test downloads."""
    if (REPO / "data" / "glove" / "glove.6B.300d.txt").exists():
        pytest.skip("data/glove/glove.6B.300d.txt exists here")
    return []


# case: (run.sh flags after SST-2 on the tiny backbone and 8-row raw data: (world, tmp) -> list, expected)
RUN_CHECKED = {
    "PHM n 5": (lambda w, t: ["--method", "m-idpg-phm", "--idpg-phm-n", "5"], "--idpg-phm-n 5 must divide the gen"),
    "PHM n 5 dry run": (lambda w, t: ["--method", "m-idpg-phm", "--idpg-phm-n", "5", "--dry-run"], "--idpg-phm-n 5"),
    "misspelt flag": (lambda w, t: ["--max-updates", "4"], "unrecognized arguments: --max-updates 4"),
    "prompt length 0": (lambda w, t: ["--method", "prompt-tuning-5", "--prompt-length", "0"], "--prompt-length 0"),
    "DPT rank 0": (lambda w, t: ["--method", "dpt", "--dpt-bottleneck", "0"], "--dpt-bottleneck 0 must be in"),
    "LoRA rank 0": (lambda w, t: ["--method", "lora", "--lora-rank", "0"], "--lora-rank must be >= 1"),
    "bad choice": (lambda w, t: ["--lr-scheduler", "nope"], "argument --lr-scheduler: invalid choice: 'nope'"),
    "max-epoch -1": (lambda w, t: ["--max-epoch", "-1"], "--max-epoch must be >= 0, got -1"),
    "launcher's flag": (lambda w, t: ["--distributed-world-size", "2"], "--distributed-world-size is set by the"),
    "model not a checkpoint": (lambda w, t: ["--model", not_a_checkpoint(w, t)], "not a fairseq checkpoint (torch"),
    "model cut": (lambda w, t: ["--model", not_a_checkpoint(w, t, lambda t: truncated(w, t))], "not a fairseq checkp"),
    "model and raw missing": (lambda w, t: ["--model", absent_model(), "--raw", t / "nowhere"], "nowhere"),
    "GloVe vectors missing": (lambda w, t: ["--method", "m-idpg-phm-glove", *no_glove()], "needs GloVe vectors"),
    "prepare refuses, said once": (
        lambda w, t: ["--raw", sst2(t / "header-only", train="sentence\tlabel\n")],
        "train.tsv: no examples",
    ),
}


def run_tiny(w, t, argv):
    """(exit status, stderr) of ``run.sh SST-2`` on the tiny backbone and the 8-row raw data in ``t/work``."""
    from fairseq_idpg import run

    argv = ["SST-2", "--model", str(w.tiny.folder), "--raw", str(sst2(t / "raw")), *map(str, argv)]
    return call(lambda: run.main([*argv, "--work-dir", str(t / "work")]), "run.sh", [])


@pytest.mark.parametrize("case", RUN_CHECKED)
def test_run_checks_everything_before_writing(world, tmp_path, case):
    """The whole configuration (the fairseq-train command run.sh makes: fairseq's parser, the model built on the
    meta device) and every file are checked before data is prepared or a run folder made: nothing is left."""
    make, expected = RUN_CHECKED[case]
    code, err = run_tiny(world, tmp_path, make(world, tmp_path))
    assert code == 2
    line = one_line(err, "run.sh", expected)
    if case == "model and raw missing":
        assert "roberta.base/model.pt" in line  # both, in one line
    assert not (tmp_path / "work").exists()


# case: (run.sh flags after SST-2 --dry-run, the missing files the warning names)
DRY_RUN = {
    "model missing": (lambda w, t: ["--model", absent_model()], ["models/roberta.base/model.pt"]),
    "raw missing": (lambda w, t: ["--model", w.tiny.folder, "--raw", t / "nowhere"], ["nowhere"]),
    "raw files missing": (lambda w, t: ["--model", w.tiny.folder, "--raw", t], ["raw files or BPE files"]),
    "model and raw missing": (
        lambda w, t: ["--model", absent_model(), "--raw", t / "nowhere"],
        ["models/roberta.base/model.pt", "nowhere"],
    ),
    "GloVe vectors missing": (
        lambda w, t: ["--model", w.tiny.folder, "--method", "m-idpg-phm-glove", *no_glove()],
        ["needs GloVe vectors"],
    ),
}


@pytest.mark.parametrize("case", DRY_RUN)
def test_dry_run_names_what_is_missing(world, tmp_path, case):
    """A dry run prints the plan, then one warning naming every missing model file and raw folder (exit 0)."""
    from fairseq_idpg import run

    make, missing = DRY_RUN[case]
    argv = ["SST-2", *map(str, make(world, tmp_path)), "--dry-run", "--work-dir", str(tmp_path / "work")]
    code, err = call(lambda: run.main(argv), "run.sh", [])
    assert code == 0
    warning = [line for line in err.splitlines() if " | INFO | " not in line]
    assert len(warning) == 1 and warning[0].startswith("run.sh: warning: not ready to run: "), err
    assert all(name in warning[0] for name in missing), warning
    assert not (tmp_path / "work").exists()


def test_refused_by_fairseq_train_leaves_no_run_folder(world, tmp_path):
    """What only fairseq-train can check (the prepared data against --num-classes) is said once, by run.sh,
    and the run folder made for it is removed (the prepared data stays: it is right)."""
    from fairseq_idpg.layout import data_folder, model_name

    # the data run.sh would prepare from the same rows: reused (its task.json records the same raw files)
    shutil.copytree(world.data, data_folder(tmp_path / "work", model_name(str(world.tiny.folder)), "SST-2"))
    code, err = run_tiny(world, tmp_path, ["--method", "lora", "--max-update", "1", "--num-classes", "3"])
    assert code == 2
    one_line(err, "run.sh", "--num-classes 3: the data in")
    assert not (tmp_path / "work" / "checkpoints").exists() and (tmp_path / "work" / "data-bin").is_dir()


# ---------------------------------------------------------------------------------------- scripts/sweep.sh
def sweep_spec(t, args=None):
    text = "name: s\ntasks: [SST-2]\nmethods: [m-idpg-phm]\nlrs: [1.0e-3]\nseeds: [1]\nmax_update: 1\n"
    (t / "spec.yaml").write_text(text + (f"args: {args}\n" if args else ""))
    return t / "spec.yaml"


SWEEP = {
    "method flag": (lambda w, t: [sweep_spec(t, "[--idpg-phm-n, '5']"), "--model", w.tiny.folder], "--idpg-phm-n 5"),
    "misspelt flag": (lambda w, t: [sweep_spec(t, "[--max-updates, '4']"), "--model", w.tiny.folder], "--max-updates"),
}


@pytest.mark.parametrize("case", SWEEP)
def test_sweep_checks_before_writing(world, tmp_path, case):
    from fairseq_idpg import sweep

    make, expected = SWEEP[case]
    argv = [*map(str, make(world, tmp_path)), "--work-dir", str(tmp_path / "work")]
    code, err = call(lambda: sweep.main(argv), "sweep", [])
    assert code == 2
    one_line(err, "sweep", expected)
    assert not (tmp_path / "work").exists()


def test_sweep_dry_run_names_what_is_missing(tmp_path, capsys):
    from fairseq_idpg import sweep

    argv = [str(sweep_spec(tmp_path)), "--model", absent_model(), "--work-dir", str(tmp_path / "work"), "--dry-run"]
    code, err = call(lambda: sweep.main(argv), "sweep", [])
    assert code == 0
    warning = [line for line in err.splitlines() if " | INFO | " not in line]
    assert len(warning) == 1 and "not ready to run: --model roberta.base: " in warning[0], err
    assert not (tmp_path / "work").exists()


# ---------------------------------------------------------------------------------------- real processes
def test_console_scripts_print_one_line(world, tmp_path):
    """What a user sees from each console script: one line on stderr, exit status 2, no traceback."""
    bindir = Path(sys.executable).parent
    save = tmp_path / "save"
    processes = {
        "fairseq-train": [bindir / "fairseq-train", *train_argv(world, "m-idpg-phm", save), "--idpg-phm-n", "5"],
        "fairseq-validate": [bindir / "fairseq-validate", world.data, "--path", tmp_path / "gone.pt"],
        "fairseq-train, no --arch": [bindir / "fairseq-train", "--user-dir", REPO / "fairseq_idpg", world.data],
        "prepare_data.py": [sys.executable, REPO / "scripts" / "prepare_data.py", "SST-2", "--raw", tmp_path / "no"]
        + ["--out", tmp_path / "bin", "--workers", "0"],
        "run.sh": ["bash", REPO / "scripts" / "run.sh", "SST-2", "--nproc", "0", "--work-dir", tmp_path / "work"],
    }
    started = {prog: subprocess.Popen(list(map(str, cmd)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for prog, cmd in processes.items()}  # fmt: skip
    for prog, proc in started.items():
        err = proc.communicate(timeout=120)[1]
        assert proc.returncode == 2, (prog, err)
        expected = "the following arguments are required: --arch/-a" if "no --arch" in prog else ""
        one_line(err, prog.split(",")[0], expected)
    assert not save.exists() and not (tmp_path / "bin").exists() and not (tmp_path / "work").exists()


def test_a_workers_error_is_said_once(world, tmp_path):
    """What a user sees when fairseq-train refuses the run inside the launcher's 2 CPU workers under torchrun (an
    empty split: each worker writes its line to torchrun's error file, the launcher says it once), and when
    sweep.sh refuses a misspelt flag before anything is written: one line on stderr, exit status 2, nothing left."""
    empty = empty_split(world, tmp_path)
    train = train_argv(world, "lora", tmp_path / "save", empty)
    del train[train.index("--batch-size") : train.index("--batch-size") + 2]  # the launcher's
    train_sh, tiny = REPO / "scripts" / "train.sh", world.tiny.folder
    processes = {  # 1 worker is fairseq-train itself (test_console_scripts_print_one_line; test_launch.py)
        "train.sh, 2 workers": ("fairseq-train", ["bash", train_sh, "--nproc", "2", "--total-batch", "8", "--"]
                                + train),
        "sweep.sh": ("sweep", ["bash", REPO / "scripts" / "sweep.sh", sweep_spec(tmp_path, "[--max-updates, '4']")]
                     + ["--model", tiny, "--work-dir", tmp_path / "work"]),
    }  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # else torchrun starts N workers with a 4-line notice about it
    started = {
        case: (prog, subprocess.Popen(list(map(str, cmd)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, env=env))
        for case, (prog, cmd) in processes.items()
    }  # fmt: skip
    for case, (prog, proc) in started.items():
        err = proc.communicate(timeout=300)[1]
        assert proc.returncode == 2, (case, err)
        one_line(err, prog, "no rows" if prog == "fairseq-train" else "unrecognized arguments: --max-updates 4")
    assert not (tmp_path / "save").exists() and not (tmp_path / "work").exists()


def test_other_exceptions_keep_their_traceback():
    """A bug (any exception but ConfigError) passes the one-line wrapper of the console scripts untouched:
    a ValueError of torch's own checks, and one that the project's own code raises without meaning a user's
    mistake (a block registered twice), stay plain ValueErrors with their traceback."""
    from fairseq_idpg.blocks import register_block
    from fairseq_idpg.errors import ConfigError
    from fairseq_idpg_compat import _one_line

    def bug():
        raise KeyError("a bug")

    def wrapped_bug():  # as fairseq wraps a failed load: a bare Exception around it
        try:
            bug()
        except KeyError:
            raise Exception("Cannot load model parameters") from None

    with pytest.raises(KeyError, match="a bug"):
        _one_line("fairseq-train", bug)
    with pytest.raises(Exception, match="Cannot load model parameters"):
        _one_line("fairseq-train", wrapped_bug)
    with pytest.raises(ValueError) as raised:
        _one_line("fairseq-train", lambda: torch.nn.Dropout(p=2.0))  # torch's own check
    assert not isinstance(raised.value, ConfigError)
    with pytest.raises(ValueError, match="registered twice") as raised:
        _one_line("fairseq-train", lambda: register_block("lora", "again", slots=("q",))(type("Again", (), {})))
    assert not isinstance(raised.value, ConfigError) and raised.traceback[-1].path.name == "__init__.py"


def test_every_entry_points_error_is_a_config_error():
    """One hierarchy: a caller catches any user's mistake as ConfigError (errors.py lists them)."""
    from fairseq_idpg.conversion.errors import ConversionError, VerificationError
    from fairseq_idpg.errors import ConfigError
    from fairseq_idpg.preprocessing import PrepareError
    from fairseq_idpg.results.published import PublishedError
    from fairseq_idpg.results.records import RecordsError
    from fairseq_idpg.run import RunError
    from fairseq_idpg.sweep import SweepError

    mistakes = (PrepareError, RunError, SweepError, RecordsError, PublishedError, ConversionError)
    assert all(issubclass(kind, ConfigError) for kind in mistakes)
    assert not issubclass(VerificationError, ConfigError)  # a converter's bug, not the input's
    errors_doc = (REPO / "fairseq_idpg" / "errors.py").read_text()
    assert all(f"``{kind.__name__}``" in errors_doc for kind in mistakes)
