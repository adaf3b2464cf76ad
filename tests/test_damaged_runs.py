"""Damaged run files and the machine's faults end in one line: a half-written results.json or config.json in
a run folder (run.sh refuses it, exit 2, writing nothing; a sweep skips that run, says so and records the
others), ``--work-dir`` a file or a read-only folder (refused before anything is written), and a read-only
copy of a finished run (its cached result, no lock taken). Finished runs are written by hand from a plan
(tests/records_support.py): nothing trains."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from records_support import write_finished_run

from fairseq_idpg import run as main_job
from fairseq_idpg import sweep
from fairseq_idpg.run import cli

REPO = Path(__file__).resolve().parents[1]
RUN_SH = REPO / "scripts" / "run.sh"
ROOT = os.geteuid() == 0  # root writes into read-only folders: those cases are simulated (cli.writable)
SPEC = "name: s\nmodel: standin\ntasks: [RTE]\nmethods: [prompt-tuning-5]\nlrs: recipe\nseeds: [1, 2]\nmax_update: 4\n"


def argv_of(work, seed=1):
    return ["RTE", "--method", "prompt-tuning-5", "--max-update", "4", "--seed", str(seed), "--work-dir", str(work)]


@pytest.fixture(scope="module")
def prepared_work(glue_slices, standin_model, tmp_path_factory):
    """A work folder with RTE's slice prepared (the planning's one slow step), made once: each test copies it."""
    work = tmp_path_factory.mktemp("damaged") / "work"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GLUE_DIR", str(glue_slices))
        main_job.plan(main_job.parse_args(argv_of(work)), log=main_job.quiet)  # prepares the data
    return work


@pytest.fixture
def finished(prepared_work, glue_slices, tmp_path, monkeypatch):
    """Two finished runs (seeds 1 and 2) of a work folder with prepared data (a copy of ``prepared_work``):
    {seed: run folder}."""
    monkeypatch.setenv("GLUE_DIR", str(glue_slices))
    work = tmp_path / "work"
    shutil.copytree(prepared_work, work)
    folders = {}
    for seed in (1, 2):
        p = main_job.plan(main_job.parse_args(argv_of(work, seed)), log=main_job.quiet)  # finds the data prepared
        folders[seed] = write_finished_run(p.folder, p.config, task="RTE", method="prompt-tuning-5", dev=60.0 + seed)
    return work, folders


def snapshot(root):
    """Every path under ``root`` with its size and modification time: what a refused command must leave."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(Path(root).rglob("*"))}


def json_error(text):
    try:
        json.loads(text)
    except ValueError as e:
        return str(e)
    raise AssertionError("valid JSON")


def said(err):
    """The refusal: stderr's last line, the only one of run.sh's own (the lines before it are the data's
    warnings), with no traceback."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err and [line for line in lines if line.startswith("run.sh:")] == lines[-1:], err
    return lines[-1]


def refusal(path, why):
    return (
        f"run.sh: error: {path} is damaged ({why}): move it away and the same command resumes the run from its "
        "checkpoints (or scores them again), or --restart trains it again"
    )


def test_run_sh_on_a_half_written_results_json_is_one_line_and_writes_nothing(finished):
    work, folders = finished
    results = folders[1] / "results.json"
    results.write_text(results.read_text()[:40])
    before = snapshot(work)
    done = subprocess.run(["bash", str(RUN_SH), *argv_of(work)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert said(done.stderr) == refusal(results, f"not valid JSON: {json_error(results.read_text())}")
    assert snapshot(work) == before and not (folders[1] / ".lock").exists()


@pytest.mark.parametrize(
    "name, text, why",
    [
        ("config.json", '{"task": "RT', None),  # an interrupted run's, half-written
        ("config.json", "[1, 2]\n", "a JSON list, not a mapping"),
        ("results.json", '"done"\n', "a JSON str, not a mapping"),
        ("results.json", '{"task": "RTE"}\n', 'no "results", "metric"'),
    ],
)
def test_a_damaged_run_file_is_one_line_and_writes_nothing(finished, capsys, name, text, why):
    work, folders = finished
    path = folders[1] / name
    path.write_text(text)
    if name == "config.json":
        (folders[1] / "results.json").unlink()  # an interrupted run
    before = snapshot(work)
    assert main_job.main(argv_of(work)) == 2
    why = why or f"not valid JSON: {json_error(text)}"
    assert said(capsys.readouterr().err) == refusal(path, why)
    assert snapshot(work) == before


def test_a_sweep_skips_a_run_with_a_damaged_record_and_records_the_others(finished, tmp_path, capsys):
    work, folders = finished
    results = folders[1] / "results.json"
    results.write_text(results.read_text()[:40])
    spec, records = tmp_path / "spec.yaml", tmp_path / "records"
    spec.write_text(SPEC)
    argv = [str(spec), "--work-dir", str(work), "--records", str(records)]
    assert sweep.main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "[damaged] RTE    prompt-tuning-5" in out and "[finished] RTE    prompt-tuning-5" in out
    assert "2 runs, 1 finished, 1 damaged (skipped), 0 to run" in out
    assert sweep.main(argv) == 1  # not everything finished
    out = capsys.readouterr().out.splitlines()
    why = f"not valid JSON: {json_error(results.read_text())}"
    name = "RTE.prompt-tuning-5.lr-recipe.seed1"
    assert f"skipped {name}: {results} is damaged ({why}); move it away and run the sweep again" in out
    assert "[sweep s] 1/2 done (1 cached), 0 running, 0 failed, 1 damaged, 0 left, eta ?" in out
    assert out[-1] == (
        "1 run(s) skipped for a damaged results.json or config.json (named above): "
        "move each file away and run this sweep again"
    )
    (recorded,) = records.rglob("*.json")
    assert recorded.name == f"{folders[2].name}.json" and json.loads(recorded.read_text())["score"] == 62.0
    assert not (folders[1] / ".lock").exists()


def test_work_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "a-file"
    path.write_text("mine\n")
    assert main_job.main([*argv_of(path)[:-2], "--work-dir", str(path)]) == 2
    assert said(capsys.readouterr().err) == (
        f"run.sh: error: --work-dir {path} is a file, not a folder; give a folder (it is made when missing)"
    )
    assert path.read_text() == "mine\n" and sorted(tmp_path.iterdir()) == [path]


@pytest.fixture
def read_only(monkeypatch):
    """Make folders read-only (and, for root, whom permissions do not stop, seen as such by run.sh)."""
    made = []

    def make(*folders):
        for folder in folders:
            made.append((folder, folder.stat().st_mode))
            folder.chmod(0o555)
        if ROOT:
            monkeypatch.setattr(cli, "writable", lambda folder: not any(Path(folder) == f for f, _ in made))

    yield make
    for folder, mode in reversed(made):
        folder.chmod(mode)


def test_a_read_only_work_folder_is_one_line_before_anything_is_written(
    glue_slices, tmp_path, capsys, read_only, monkeypatch
):
    monkeypatch.setenv("GLUE_DIR", str(glue_slices))
    work = tmp_path / "work"
    work.mkdir()
    read_only(work)
    assert main_job.main(argv_of(work)) == 2
    assert said(capsys.readouterr().err) == (
        f"run.sh: error: --work-dir {work} is read-only ({work} cannot be written); give a folder you can write"
    )
    assert list(work.iterdir()) == []


def test_a_read_only_copy_of_a_finished_run_shows_its_result(finished, capsys, read_only):
    work, folders = finished
    read_only(*[p for p in sorted(work.rglob("*"), reverse=True) if p.is_dir()], work)
    before = snapshot(work)
    assert main_job.main(argv_of(work)) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "error" not in captured.err
    assert "cached: this configuration finished on 2026-01-01 00:00:00; not training it again" in captured.out
    assert "valid: accuracy 61.0, loss 0.5   (paper metric: accuracy)" in captured.out
    assert snapshot(work) == before and not (folders[1] / ".lock").exists()  # no lock to read a result
