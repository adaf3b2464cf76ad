"""Sweeps at their edges, through the commands users run (scripts/sweep.sh, scripts/run.sh): a dry run before the
data is prepared prints no run folder name other than the one the run then gets (``<hash>`` until the data exists,
said in one line); a fused sweep whose disk fills up shows each run's one-line cause on the console, the line the
same run shows alone, and keeps the checkpoints saved before; a read-only copy of a finished sweep's work folder
shows a run's result through run.sh and writes nothing. Stand-in runs of 4 updates on 48 rows of SST-2."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO
from preloaded_support import preloaded
from test_sweep import write_spec
from test_sweep_fused import sst2_lines  # noqa: F401 (the fixture: SST-2's first 48 train and 16 dev rows)

SWEEP_SH, RUN_SH = REPO / "scripts" / "sweep.sh", REPO / "scripts" / "run.sh"
ROOT = os.geteuid() == 0  # root writes into read-only folders: its run.sh runs without that power (setpriv)
SPEC = """
name: edges
model: standin
tasks: [SST-2]
methods: [prompt-tuning-5]
lrs: recipe
seeds: [1, 2]
max_update: 4
args: [--validate-interval-updates, 2, --total-batch, 8]
"""
# run.sh's command line of the spec's runs (but --seed and --work-dir)
RUN = ["SST-2", "--method", "prompt-tuning-5", "--max-update", "4", "--validate-interval-updates", "2"]
RUN += ["--total-batch", "8"]
NAMES = {seed: f"SST-2.prompt-tuning-5.lr-recipe.seed{seed}" for seed in (1, 2)}  # the sweep's names of its runs
HASH_NOTE = "(<hash> is known once the model file and the prepared data exist)"

# the disk fills up at the first write of a file whose name begins with $FULL_DISK_AT: 4 kB written, then ENOSPC
# (as tests/test_faults_training.py's, in every process of the sweep: its sitecustomize)
FULL_DISK = """
import os

if os.environ.get("FULL_DISK_AT"):
    import errno

    import torch

    save = torch.save

    def full(obj, f, *args, **kwargs):
        name = os.path.basename(str(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", ""))
        if not name.startswith(os.environ["FULL_DISK_AT"]):
            return save(obj, f, *args, **kwargs)
        if hasattr(f, "write"):
            f.write(b"x" * 4096)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    torch.save = full
"""


def sh(script, *args, env, timeout=900):
    cmd = ["bash", str(script), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


def planned(script, *args, env):
    """``sh``'s result of a dry run, in a fork of an interpreter that imported the package once
    (tests/preloaded_support.py: what the command alone prints, tests/test_docs_commands.py checks), not in a fresh
    interpreter that spends ~4 s importing torch and fairseq first; a process of its own where it cannot fork."""
    argv = ["bash", str(script), *map(str, args)]
    return preloaded.run(argv, cwd=REPO, env=env) or sh(script, *args, env=env)


def snapshot(root):
    """Every path under ``root`` with its size and modification time: what a command that only reads leaves."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(Path(root).rglob("*"))}


def run_folders(work):
    return sorted((Path(work) / "checkpoints" / "standin" / "SST-2" / "prompt-tuning-5").glob("lr*"))


# ---------------------------------------------------------------------------------------- a dry run before the data
@pytest.fixture(scope="module")
def swept(sst2_lines, standin_model, tmp_path_factory):  # noqa: F811
    """The sweep's and run.sh's dry runs in an empty work folder, then the sweep (its two runs trained together,
    --fuse 2: one process, the names and records of the runs alone, as tests/test_sweep_fused.py checks), then its
    dry run again."""
    root = tmp_path_factory.mktemp("edges")
    spec, work = write_spec(root, SPEC), root / "work"
    env = {**os.environ, "GLUE_DIR": str(sst2_lines)}
    first = planned(SWEEP_SH, spec, "--work-dir", work, "--dry-run", env=env)
    run_sh = planned(RUN_SH, *RUN, "--seed", "2", "--work-dir", work, "--dry-run", env=env)
    written = sorted(root.rglob("*"))
    done = sh(SWEEP_SH, spec, "--work-dir", work, "--fuse", "2", env=env, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    again = planned(SWEEP_SH, spec, "--work-dir", work, "--dry-run", env=env)
    return SimpleNamespace(root=root, spec=spec, work=work, env=env, first=first, run_sh=run_sh, written=written,
                           done=done, again=again)  # fmt: skip


@pytest.mark.slow
@pytest.mark.xdist_group("sweep-edges")  # one worker: the sweep runs once
def test_a_dry_run_before_the_data_is_prepared_prints_no_name_the_runs_do_not_get(swept):
    """The hash covers the prepared rows (48 here, not SST-2's official 67,349), which a dry run does not prepare:
    it prints ``<hash>`` where the name is not known yet, and one line saying when it is."""
    from fairseq_idpg.preprocessing import get_task
    from fairseq_idpg.run import config_hash

    for out in (swept.first, swept.run_sh):
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert swept.written == [swept.spec]  # neither dry run wrote anything
    planned = re.findall(r" -> (\S+)$", swept.first.stdout, re.M)
    folder = swept.work / "checkpoints" / "standin" / "SST-2" / "prompt-tuning-5"
    assert planned == [str(folder / "lr5e-3.seed1.<hash>"), str(folder / "lr5e-3.seed2.<hash>")]
    assert HASH_NOTE in swept.first.stdout.splitlines()
    assert f"run folder: {folder / 'lr5e-3.seed2.<hash>'}" in swept.run_sh.stdout.splitlines()
    assert "  " + HASH_NOTE in swept.run_sh.stdout.splitlines()

    made = run_folders(swept.work)  # the names the runs got
    assert [f.name.rsplit(".", 1)[0] for f in made] == ["lr5e-3.seed1", "lr5e-3.seed2"]
    for f in made:
        config = json.loads((f / "config.json").read_text())
        assert f.name.rsplit(".", 1)[1] == config_hash(config) and config["data"]["train_examples"] == 48
        guessed = {**config, "data": {**config["data"], "train_examples": get_task("SST-2").sizes[0]}}
        assert config_hash(guessed) != config_hash(config)  # the official size's name would have been wrong

    # once the data exists, the dry run names every run as it is
    assert re.findall(r" -> (\S+)$", swept.again.stdout, re.M) == [str(f) for f in made]
    assert HASH_NOTE not in swept.again.stdout and "2 runs, 2 finished, 0 to run" in swept.again.stdout


# ---------------------------------------------------------------------------------------- a read-only copy
def read_only(folder):
    """``folder`` and everything in it read-only; returns what restores it."""
    paths = [folder, *Path(folder).rglob("*")]
    modes = [(p, p.stat().st_mode) for p in paths if not p.is_symlink()]
    for p, _ in sorted(modes, key=lambda m: len(m[0].parts), reverse=True):
        p.chmod(0o555 if p.is_dir() else 0o444)

    def restore():
        for p, mode in sorted(modes, key=lambda m: len(m[0].parts)):
            p.chmod(mode)

    return restore


@pytest.mark.slow
@pytest.mark.xdist_group("sweep-edges")  # one worker: the sweep runs once
def test_a_read_only_copy_of_a_finished_sweeps_folder_shows_a_runs_result(swept, tmp_path, monkeypatch, capsys):
    """A sweep's work folder (data-bin/, checkpoints/, sweeps/<name>/ with its logs and records) copied and made
    read-only: run.sh with a run's task, method, seed and lr there prints the run's result, exit 0, writing nothing.
    Root, whom permissions do not stop, runs run.sh without that power (setpriv drops CAP_DAC_OVERRIDE); where it
    cannot, run.sh runs in this process, told that the copy cannot be written (as tests/test_damaged_runs.py)."""
    power = ["setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]
    if ROOT and (not shutil.which("setpriv") or subprocess.run([*power, "true"], capture_output=True).returncode):
        simulated_read_only_copy(swept, tmp_path, monkeypatch, capsys)
        return
    copy = tmp_path / "copy"
    shutil.copytree(swept.work, copy, symlinks=True)
    (record,) = (copy / "sweeps" / "edges" / "records").rglob("lr5e-3.seed2.*.json")
    score = json.loads(record.read_text())["results"]["valid"]["accuracy"]
    cmd = [*(power if ROOT else []), "bash", str(RUN_SH), *RUN, "--seed", "2", "--lr", "5e-3", "--work-dir", str(copy)]
    restore = read_only(copy)
    try:
        before = snapshot(copy)
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=swept.env, timeout=600)
        after = snapshot(copy)
        check = subprocess.run([*(power if ROOT else []), "touch", str(copy / "x")], capture_output=True)
    finally:
        restore()
    assert check.returncode != 0  # the copy was read-only to run.sh
    assert out.returncode == 0 and "error" not in out.stderr, out.stdout[-3000:] + out.stderr[-3000:]
    assert "cached: this configuration finished on" in out.stdout
    assert re.search(rf"^valid: .*accuracy {score}\b", out.stdout, re.M), out.stdout
    assert after == before


def simulated_read_only_copy(swept, tmp_path, monkeypatch, capsys):
    """The read-only copy's test for root where permissions cannot be made to stop it: what run.sh reads of the
    copy (its ``writable``) says it cannot be written."""
    from fairseq_idpg import run as main_job
    from fairseq_idpg.run import cli

    copy = tmp_path / "copy"
    shutil.copytree(swept.work, copy, symlinks=True)
    monkeypatch.setenv("GLUE_DIR", swept.env["GLUE_DIR"])
    monkeypatch.setattr(cli, "writable", lambda folder: not Path(folder).absolute().is_relative_to(copy))
    before = snapshot(copy)
    assert main_job.main([*RUN, "--seed", "2", "--lr", "5e-3", "--work-dir", str(copy)]) == 0
    out = capsys.readouterr()
    assert "cached: this configuration finished on" in out.out and "error" not in out.err
    assert snapshot(copy) == before


# ---------------------------------------------------------------------------------------- a full disk
@pytest.mark.slow
def test_a_fused_sweep_on_a_full_disk_shows_each_runs_cause(sst2_lines, standin_model, tmp_path):  # noqa: F811
    """Two runs trained together save at update 2, then the disk is full when they save update 4: the console says
    each run's cause in one line (the file, the room), as the same run alone says it; the checkpoints of update 2
    stay, nothing half-written is left, and the run alone again resumes from them (and fails the same way)."""
    from fairseq_idpg_compat import checkpoint_num_updates

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(FULL_DISK)
    path = os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "GLUE_DIR": str(sst2_lines), "PYTHONPATH": path, "FULL_DISK_AT": ".checkpoint_1_4.pt"}
    spec, work = write_spec(tmp_path, SPEC), tmp_path / "work"
    fused = sh(SWEEP_SH, spec, "--work-dir", work, "--fuse", "2", env=env, timeout=1500)
    assert fused.returncode == 1, fused.stdout[-3000:] + fused.stderr[-3000:]
    assert "Traceback" not in fused.stdout + fused.stderr

    folders = dict(zip((1, 2), run_folders(work), strict=True))
    logs = work / "sweeps" / "edges" / "logs"
    group_log = logs / f"{NAMES[1]}.log"  # a group's output is in its first run's log

    def cause(seed):
        return (
            f"{folders[seed] / 'checkpoint_1_4.pt'}: could not be written (No space left on device); free some "
            "space, or give --save-dir a folder with room (the same command then resumes); the checkpoints saved "
            "before are as they were"
        )

    lines = fused.stdout.splitlines()
    failures = json.loads((work / "sweeps" / "edges" / "failures.json").read_text())
    for seed, name in NAMES.items():
        assert sum(line.endswith(f"  FAILED {name} (exit 1; {group_log}): {cause(seed)}") for line in lines) == 1
        assert f"  {name}: exit 1, log {group_log}: {cause(seed)}" in lines  # the closing list
        assert failures[name]["cause"] == cause(seed)
    for folder in folders.values():  # nothing lost: update 2's checkpoints, intact; nothing half-written
        assert sorted(p.name for p in folder.glob("*.pt")) == ["checkpoint_1_2.pt", "checkpoint_best.pt",
                                                              "checkpoint_last.pt"]  # fmt: skip
        assert checkpoint_num_updates(folder / "checkpoint_last.pt") == 2
        assert not (folder / "results.json").exists()
    assert not [p for p in work.rglob("*") if ".tmp" in p.name]

    alone = sh(SWEEP_SH, spec, "--work-dir", work, "--seeds", "1", env=env, timeout=900)  # the same run alone
    assert alone.returncode == 1, alone.stdout[-3000:] + alone.stderr[-3000:]
    log = logs / f"{NAMES[1]}.log"
    assert f"  {NAMES[1]}: exit 2, log {log}: {cause(1)}" in alone.stdout.splitlines()
    run_sh_said = log.read_text().strip().splitlines()[-1]
    assert run_sh_said == f"run.sh: error: {cause(1)}"  # what run.sh says of it alone: the fused sweep's line
    assert f"resuming from {folders[1] / 'checkpoint_last.pt'} at update 2 of 4" in log.read_text()
    assert checkpoint_num_updates(folders[1] / "checkpoint_last.pt") == 2
