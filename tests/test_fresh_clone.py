"""A newcomer's first hour on a fresh clone: the data lookup finds what scripts/download.sh puts in the
checkout's data/ and names every place it looked; a failed download leaves no folder behind; fairseq-validate
runs without a batch flag; and, slow, README's main job on a clean copy with no ../shared beside it and no
$GLUE_DIR (offline: the download fails and the job trains on its made-up sample, saying so), then README's
fairseq-validate command as written on what it trained."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_download import dl, zip_bytes  # scripts/download.py, loaded once

from fairseq_idpg import layout
from fairseq_idpg.errors import RunError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """The layout of a checkout at tmp_path/repo with nothing beside it and no $GLUE_DIR / $LMBFF_DIR."""
    repo = tmp_path / "repo"
    monkeypatch.delenv("GLUE_DIR", raising=False)
    monkeypatch.delenv("LMBFF_DIR", raising=False)
    monkeypatch.setattr(layout, "DATA_DIR", repo / "data")
    monkeypatch.setattr(layout, "SHARED_DATA", tmp_path / "shared" / "data")
    monkeypatch.setattr(dl, "REPO", repo)
    return repo


def test_the_lookup_finds_what_download_sh_glue_wrote(checkout, monkeypatch):
    sst2 = "sentence\tlabel\na fine film .\t1\n"
    monkeypatch.setattr(
        dl, "fetch", lambda url, f: f.write(zip_bytes({"SST-2/train.tsv": sst2, "SST-2/dev.tsv": sst2}))
    )
    assert dl.main(["glue", "--tasks", "SST-2"]) == 0  # no --out: the checkout's data/
    assert layout.raw_dir("SST-2") == checkout / "data" / "glue" / "SST-2"
    assert (layout.raw_dir("SST-2") / "train.tsv").read_text() == sst2


def test_the_lookup_order_and_its_error_name_every_place(checkout, tmp_path, monkeypatch):
    with pytest.raises(RunError) as e:
        layout.raw_dir("RTE")
    message = str(e.value)
    for place in (checkout / "data" / "glue" / "RTE", tmp_path / "shared" / "data" / "glue" / "RTE"):
        assert str(place) in message
    assert "scripts/download.sh glue --tasks RTE" in message
    with pytest.raises(RunError, match=r"lmbff/cr .*scripts/download.sh lmbff"):
        layout.raw_dir("CR")
    (tmp_path / "shared" / "data" / "glue" / "RTE").mkdir(parents=True)
    assert layout.raw_dir("RTE") == tmp_path / "shared" / "data" / "glue" / "RTE"
    (checkout / "data" / "glue" / "RTE").mkdir(parents=True)  # the download wins over ../shared
    assert layout.raw_dir("RTE") == checkout / "data" / "glue" / "RTE"
    monkeypatch.setenv("GLUE_DIR", str(tmp_path / "mine"))  # $GLUE_DIR first, when it has the task
    assert layout.raw_dir("RTE") == checkout / "data" / "glue" / "RTE"
    (tmp_path / "mine" / "RTE").mkdir(parents=True)
    assert layout.raw_dir("RTE") == tmp_path / "mine" / "RTE"
    with pytest.raises(RunError, match="--raw /nowhere is not a folder"):
        layout.raw_dir("RTE", "/nowhere")


def offline(url, f):
    raise OSError("<urlopen error [Errno -2] Name or service not known>")


@pytest.mark.parametrize("what", [["roberta", "large"], ["glue", "--tasks", "SST-2", "RTE"], ["bpe"]])
def test_a_failed_download_leaves_no_folder_it_made(tmp_path, monkeypatch, what):
    monkeypatch.setattr(dl, "fetch", offline)
    out = tmp_path / "new" / "deeper"
    assert dl.main([*what, "--out", str(out)]) == 1
    assert list(tmp_path.iterdir()) == []  # neither --out nor the folder above it, both made by the download
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "mine").write_text("x")
    assert dl.main([*what, "--out", str(kept)]) == 1
    assert sorted(p.name for p in kept.iterdir()) == ["mine"]  # what was there stays


def test_a_failed_download_keeps_the_tasks_it_completed(tmp_path, monkeypatch):
    def sst2_only(url, f):
        if "SST-2" not in url:
            offline(url, f)
        f.write(zip_bytes({"SST-2/train.tsv": "sentence\tlabel\n", "SST-2/dev.tsv": "sentence\tlabel\n"}))

    monkeypatch.setattr(dl, "fetch", sst2_only)
    assert dl.main(["glue", "--tasks", "SST-2", "RTE", "--out", str(tmp_path / "d")]) == 1
    assert [p.name for p in (tmp_path / "d" / "glue").iterdir()] == ["SST-2"]


def test_fairseq_validate_gets_a_batch_size_only_when_none_is_given():
    from fairseq import options

    from fairseq_idpg.tasks.peft_sentence_prediction import EVAL_BATCH_SIZE, default_eval_batch_size

    def default(parser, argv):
        default_eval_batch_size(parser, argv)
        return parser.get_default("batch_size")

    assert default(options.get_validation_parser(), ["DATA", "--path", "x.pt"]) == EVAL_BATCH_SIZE
    for given in (["--batch-size", "4"], ["--max-tokens=4096"], ["--max-sentences", "8"]):
        assert default(options.get_validation_parser(), ["DATA", *given]) is None, given
    assert default(options.get_training_parser(), ["DATA"]) is None  # training's batch is the recipe's


def copy_checkout(root):
    """A fresh clone's files at ``root`` (what git tracks, no data, no runs) with the stand-in that
    scripts/install.sh builds, copied (building it again takes a minute)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    shutil.copytree(layout.STANDIN_DIR, root / "models" / "minilm-l6-fairseq", copy_function=shutil.copy2)


def in_clone(root, command, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("GLUE_DIR", "LMBFF_DIR")}
    env["PYTHONPATH"] = str(root)  # the clone's fairseq_idpg, not the installed checkout's
    return subprocess.run(command, shell=True, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # about 90 s: run.sh's preparation, 5 updates of fairseq-train, two fairseq-validate
def test_the_main_job_on_a_fresh_offline_clone_without_shared_data(tmp_path, standin_model):
    root = tmp_path / "clone" / "repo"  # nothing beside it: no ../shared
    root.mkdir(parents=True)
    copy_checkout(root)
    dry = in_clone(root, "scripts/run.sh SST-2 --method m-idpg-phm --dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert f"no SST-2 raw folder in {root}/data/glue/SST-2, {tmp_path}/clone/shared/data/glue/SST-2" in dry.stdout
    assert "not ready to run" not in dry.stderr
    # README's main command, with a smaller budget: 5 updates, not 300
    run = in_clone(root, "scripts/run.sh SST-2 --method m-idpg-phm --max-update 5")
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "scripts/download.py glue --tasks SST-2" in run.stdout  # the real download was tried first
    assert re.search(r"warning: no SST-2 data and no download \(offline\?\): training on made-up sample", run.stderr)
    assert "scripts/download.sh glue --tasks SST-2" in run.stderr
    assert not (root / "data" / "glue" / "SST-2").exists()
    (folder,) = (root / "checkpoints" / "standin" / "SST-2" / "m-idpg-phm").iterdir()
    assert '"accuracy"' in (folder / "results.json").read_text()
    # said again beside the score, and recorded: a table never mistakes it for SST-2's
    assert "note: trained and scored on made-up sample data" in run.stdout
    assert json.loads((folder / "results.json").read_text())["made_up_sample"] == str(root / "data/sample/glue/SST-2")
    # README's scoring command as written (DATA and the run folder substituted), no batch flag
    score = f"fairseq-validate data-bin/standin/SST-2 --user-dir fairseq_idpg --path {folder}/checkpoint_best.pt"
    valid = in_clone(root, score)
    assert valid.returncode == 0, (valid.stdout + valid.stderr)[-3000:]
    assert re.search(r"valid on 'valid' subset .*accuracy", valid.stdout + valid.stderr)


def test_no_data_and_no_download_is_the_sample_on_the_standin_and_an_error_otherwise(checkout, monkeypatch, capsys):
    import importlib

    from fairseq_idpg.preprocessing import get_task

    prepared = importlib.import_module("fairseq_idpg.run.prepared")  # the package exports a function of its name
    monkeypatch.setattr(prepared, "SAMPLE_DIR", checkout / "data" / "sample")
    tried = []

    def offline_download(cmd, log):
        tried.append([str(c) for c in cmd][2:])
        raise RunError("command failed with exit code 1: download.py")

    monkeypatch.setattr(prepared, "call", offline_download)
    try:
        layout.raw_dir("RTE")
    except RunError as e:
        not_found = e
    with pytest.raises(RunError, match=r"raw data for RTE not found; looked in .*; the download failed"):
        prepared.fetch_raw("RTE", "roberta.large", not_found)
    assert not (checkout / "data" / "sample").exists()  # a real model never trains on made-up data
    sample = prepared.fetch_raw("RTE", "standin", not_found)
    assert tried == [["glue", "--tasks", "RTE"]] * 2
    assert sample == checkout / "data" / "sample" / "glue" / "RTE"
    assert [len(get_task("RTE").read(sample / name)) for name in ("train.tsv", "dev.tsv")] == [400, 100]
    assert "training on made-up sample data" in capsys.readouterr().err
    before = (sample / "train.tsv").read_bytes()
    assert prepared.fetch_raw("RTE", "standin", not_found) == sample  # made once, the same bytes
    assert (sample / "train.tsv").read_bytes() == before
