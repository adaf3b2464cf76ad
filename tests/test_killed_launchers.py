"""A launcher killed with ``kill -9`` (run.sh, or a sweep running the run in a local slot) takes its trainer
with it, and the same command resumes the run from the checkpoint it names: one trainer, every point of the
learning curve kept, and the same record as a run never interrupted (CPU training is deterministic, and
fairseq seeds each update by its number). The run folder's lock is held by whoever writes the folder: the
trainer inherits it from run.sh."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from run_support import alive, children, finish, start, trained, write_slice

from fairseq_idpg import run as main_job
from fairseq_idpg.layout import bpe_args, data_folder
from fairseq_idpg.run.execution import RUN_LOCK
from fairseq_idpg.run.prepared import prepare_if_needed

REPO = Path(__file__).resolve().parents[1]
# 20 updates of 8 on 64 SST-2 sentences (one epoch = 8 updates), validated and saved at 10 and 20 (and at each
# epoch's end): a kill after 10 leaves 10 to resume, from the middle of the second epoch
UPDATES, HALF = 20, 10
LONGER = ["--max-update", str(UPDATES), "--validate-interval-updates", str(HALF)]


def lock_is_free(folder):
    """Whether another process could take ``folder``'s run lock now (it tries, without waiting)."""
    probe = (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)"
    )
    return subprocess.run([sys.executable, "-c", probe, str(folder / RUN_LOCK)], capture_output=True).returncode == 0


LAUNCHER = """
import sys
from pathlib import Path
from fairseq_idpg.run.execution import run_folder_lock
from fairseq_idpg.run.processes import tee
folder = Path(sys.argv[1])
# a trainer slow to end: it ignores the SIGTERM its launcher's death sends
child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
child += "print('started', flush=True); time.sleep(4)"
with run_folder_lock(folder) as lock:
    tee([sys.executable, "-c", child], folder / "train.log", hold=lock)
"""


def test_a_trainer_that_outlives_its_killed_launcher_keeps_the_run_folder_locked(tmp_path):
    """The lock is held by whoever writes the folder: run.sh's command inherits it, so while a trainer
    outlives its launcher (here one that ignores SIGTERM) a rerun finds the folder in use; once it ends,
    the folder is free."""
    folder = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(folder)], stdout=subprocess.DEVNULL, cwd=REPO)
    deadline = time.time() + 120
    while not ((folder / "train.log").exists() and "started" in (folder / "train.log").read_text()):
        assert time.time() < deadline and launcher.poll() is None
        time.sleep(0.05)
    (trainer,) = children(launcher.pid)
    launcher.kill()
    launcher.wait()
    assert alive(trainer) and not lock_is_free(folder)  # the launcher is gone; its trainer holds the lock
    while alive(trainer):
        time.sleep(0.1)
    assert lock_is_free(folder)


def kill_after_first_checkpoint(proc, folder_glob, work, update=HALF, runs=1):
    """Wait for the checkpoint at ``update`` of ``runs`` runs, kill -9 ``proc`` alone (not its group), and
    check that every process under it is gone within 10 s. Returns their pids."""
    deadline, family = time.time() + 600, []
    saved = re.compile(rf"Saved checkpoint \S+ \(epoch \d+ @ {update} updates")
    while proc.poll() is None and time.time() < deadline:
        logs = list(work.glob(folder_glob + "/train.log"))
        if sum(bool(saved.search(log.read_text())) for log in logs) >= runs:
            family = descendants(proc.pid)
            break
        time.sleep(0.2)
    assert family, f"no checkpoint at update {update} (exit {proc.poll()})"
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        gone_by = time.time() + 10
        while any(map(alive, family)) and time.time() < gone_by:
            time.sleep(0.1)
        assert not any(map(alive, family)), [Path(f"/proc/{p}/cmdline").read_text() for p in family]
    finally:
        for p in filter(alive, family):
            os.kill(p, signal.SIGKILL)
    return family


def descendants(pid):
    found = children(pid)
    return found + [d for c in found for d in descendants(c)]


def assert_resumed_as_named(rerun_out, train_log):
    """The rerun announced the update it resumes from, and fairseq-train loaded that one; one trainer."""
    named = re.findall(rf"resuming from \S+ at update (\d+) of {UPDATES}", rerun_out)
    assert named and int(named[-1]) >= HALF, rerun_out[-3000:]
    last_start = train_log.rsplit("scripts/run.sh", 1)[1]  # what the rerun's trainer logged
    loaded = re.findall(r"Loaded checkpoint \S+ \(epoch \d+ @ (\d+) updates\)", last_start)
    assert loaded == [named[-1]], loaded
    assert len(re.findall(r"^\+ \S*fairseq-train ", rerun_out, re.M)) == 1


def assert_same_run(folder, reference, updates=UPDATES, points=(HALF, UPDATES)):
    """The resumed run's record and trained tensors equal the uninterrupted run's, curve point for point."""
    ours, theirs = (json.loads((f / "results.json").read_text()) for f in (folder, reference))
    assert ours["results"] == theirs["results"]
    assert ours["curve"] == theirs["curve"] and {c["updates"] for c in ours["curve"]} >= set(points)
    tensors, state = trained(folder)
    assert state["optimizer_history"][-1]["num_updates"] == updates
    expected, _ = trained(reference)
    assert tensors.keys() == expected.keys() and all(torch.equal(tensors[k], expected[k]) for k in tensors)


@pytest.fixture(scope="module")
def sst2_raw(shared_data, standin_model, tmp_path_factory):
    """The SST-2 slice (64 train, 16 dev rows) and a work folder where it is prepared for the stand-in."""
    root = tmp_path_factory.mktemp("sst2-prepared")
    raw = write_slice(root / "glue" / "SST-2", shared_data / "glue" / "SST-2", {"train.tsv": 64, "dev.tsv": 16})
    prepare_if_needed("SST-2", raw, data_folder(root, "standin", "SST-2"), bpe_args(standin_model, model="standin"))
    return raw, root


def prepared(work, sst2_raw):
    """``work`` with the slice's prepared data, which run.sh and the sweep use as it is (the same provenance: the
    raw files, the BPE), so that each run here starts at its training; returns the raw folder."""
    raw, root = sst2_raw
    shutil.copytree(root / "data-bin", work / "data-bin")
    return raw


@pytest.fixture(scope="module")
def sst2(sst2_raw, tmp_path_factory):
    """The SST-2 slice and the run folder of an uninterrupted run of LONGER."""
    root = tmp_path_factory.mktemp("uninterrupted")
    raw = prepared(root, sst2_raw)
    finish(start(root, raw, *LONGER, log=root / "run.out"), root / "run.out")
    (folder,) = main_job.find_runs(root, "standin", "SST-2", "lora")
    return raw, folder


@pytest.mark.slow
@pytest.mark.xdist_group("killed-reference")  # one worker: the uninterrupted run trains once
def test_a_killed_run_sh_takes_its_trainer_with_it_and_the_rerun_resumes_exactly(sst2, sst2_raw, tmp_path):
    raw, reference = sst2
    prepared(tmp_path, sst2_raw)
    proc = start(tmp_path, raw, *LONGER, log=tmp_path / "killed.out")
    kill_after_first_checkpoint(proc, "checkpoints/standin/SST-2/lora/*", tmp_path)
    out = finish(start(tmp_path, raw, *LONGER, log=tmp_path / "resumed.out"), tmp_path / "resumed.out")
    (folder,) = main_job.find_runs(tmp_path, "standin", "SST-2", "lora")
    assert folder.name == reference.name  # the same configuration
    assert_resumed_as_named(out, (folder / "train.log").read_text())
    assert_same_run(folder, reference)


SPEC = """
name: killed
model: standin
tasks: [SST-2]
methods: [lora]
lrs: [2.0e-4]
seeds: [1]
max_update: UPDATES
args: [--total-batch, 8, --validate-interval-updates, HALF]
""".replace("UPDATES", str(UPDATES)).replace("HALF", str(HALF))


@pytest.mark.slow
@pytest.mark.xdist_group("killed-reference")  # one worker: the uninterrupted run trains once
def test_a_killed_sweep_takes_its_slots_run_and_trainer_with_it_and_the_rerun_resumes(sst2, sst2_raw, tmp_path):
    raw, reference = sst2
    prepared(tmp_path, sst2_raw)
    spec = tmp_path / "killed.yaml"
    spec.write_text(SPEC)
    cmd = [sys.executable, "-m", "fairseq_idpg.sweep", str(spec), "--work-dir", str(tmp_path)]
    # the reference run's thread count (the suite's share of the cores): bit-equal sums need the same
    cmd += ["--threads", os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))]
    env = {**os.environ, "GLUE_DIR": str(raw.parent)}

    def sweep(log):
        return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=REPO, env=env)

    family = kill_after_first_checkpoint(sweep(tmp_path / "killed.out"), "checkpoints/standin/SST-2/lora/*", tmp_path)
    assert len(family) >= 2  # the slot's run.py and its fairseq-train
    finish(sweep(tmp_path / "resumed.out"), tmp_path / "resumed.out")
    (folder,) = main_job.find_runs(tmp_path, "standin", "SST-2", "lora")  # run.sh's flags spelled otherwise
    (slot_log,) = (tmp_path / "sweeps" / "killed" / "logs").glob("*.log")
    rerun = re.split(r"^# \d{4}-", slot_log.read_text(), flags=re.M)[-1]  # the slot log of the second sweep
    assert_resumed_as_named(rerun, (folder / "train.log").read_text())
    assert_same_run(folder, reference)


# two LoRA runs trained together (--fuse 2), then the same two runs again as the uninterrupted reference: the
# label makes them other runs (their own folders) with the same training (--keep-interval-updates only keeps
# more checkpoint files)
FUSED = """
name: killed-fused
model: standin
tasks: [SST-2]
methods:
  - lora
  - {label: lora-again, method: lora, args: [--keep-interval-updates, 9]}
lrs: [2.0e-4, 1.0e-4]
seeds: [1]
max_update: UPDATES
args: [--total-batch, 8, --validate-interval-updates, HALF]
""".replace("UPDATES", str(UPDATES)).replace("HALF", str(HALF))


def fused_sweep(raw, work, text=FUSED):
    """``sweep(log)``: starts a local sweep of ``text`` (--fuse 2, one slot) in ``work``, its output in ``log``."""
    spec = work / "killed-fused.yaml"
    spec.write_text(text)
    cmd = [sys.executable, "-m", "fairseq_idpg.sweep", str(spec), "--work-dir", str(work), "--fuse", "2"]
    cmd += ["--jobs", "1", "--threads", "1"]
    env = {**os.environ, "GLUE_DIR": str(raw.parent)}

    def sweep(log):
        return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=REPO, env=env)

    return sweep


@pytest.mark.slow
def test_a_killed_fused_sweep_takes_its_group_with_it_and_every_member_resumes(sst2_raw, tmp_path):
    """kill -9 of a sweep training a group (one process for two runs) once both saved update HALF: the same
    command resumes each member from its own checkpoint and ends with the record and trained tensors of the
    same runs trained together without interruption (the sweep's second group)."""
    sweep = fused_sweep(prepared(tmp_path, sst2_raw), tmp_path)
    killed = sweep(tmp_path / "killed.out")
    family = kill_after_first_checkpoint(killed, "checkpoints/standin/SST-2/lora/*", tmp_path, update=HALF, runs=2)
    assert len(family) == 1, family  # the slot's group, which trains its members itself: one process from the sweep
    out = finish(sweep(tmp_path / "resumed.out"), tmp_path / "resumed.out")
    assert "[sweep killed-fused] 4/4 done" in out, out[-3000:]
    runs = list((tmp_path / "checkpoints" / "standin" / "SST-2" / "lora").iterdir())  # the label names no folder
    logs = {f: (f / "train.log").read_text() for f in runs}
    killed = [f for f in runs if logs[f].count("# trained together with: ") == 2]  # the killed start and the rerun's
    again = [f for f in runs if logs[f].count("# trained together with: ") == 1]
    assert len(runs) == 4 and len(killed) == len(again) == 2, {f.name: logs[f].count("# trained") for f in runs}
    for folder in killed:
        loaded = re.findall(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ (\d+) updates\)", logs[folder])
        assert loaded == [str(HALF)], (folder.name, loaded)
        (reference,) = (f for f in again if f.name.rsplit(".", 1)[0] == folder.name.rsplit(".", 1)[0])
        assert json.loads((folder / "results.json").read_text())["fused_with"]
        assert_same_run(folder, reference)


@pytest.mark.slow
def test_a_fused_sweep_stops_its_group_within_10_s_of_a_sigterm_and_the_rerun_resumes_every_member(sst2_raw, tmp_path):
    """SIGTERM to a sweep training a group (as a scheduler or ``kill`` sends it), once both members saved update
    HALF: the sweep and every process under it end within 10 s (the group's members are threads of its one process,
    stopped where they are, no member's fairseq-validate started), exit 130; the same command resumes each member
    from its own checkpoint_last.pt at update HALF and records both runs. (One group: the uninterrupted reference
    group, and the equality of each resumed member with it, are the kill -9 test's above.)"""
    one_group = FUSED.replace("  - {label: lora-again, method: lora, args: [--keep-interval-updates, 9]}\n", "")
    assert one_group != FUSED
    sweep = fused_sweep(prepared(tmp_path, sst2_raw), tmp_path, one_group)
    stopped = sweep(tmp_path / "stopped.out")
    saved = re.compile(rf"Saved checkpoint \S+ \(epoch \d+ @ {HALF} updates")
    deadline, family = time.time() + 600, []
    while stopped.poll() is None and time.time() < deadline:
        logs = list(tmp_path.glob("checkpoints/standin/SST-2/lora/*/train.log"))
        if sum(bool(saved.search(log.read_text())) for log in logs) >= 2:
            family = descendants(stopped.pid)
            break
        time.sleep(0.2)
    assert family, f"no group saved update {HALF} (exit {stopped.poll()})"
    try:
        sent = time.time()
        stopped.send_signal(signal.SIGTERM)
        code = stopped.wait(timeout=30)
        while any(map(alive, family)) and time.time() < sent + 30:
            time.sleep(0.1)
        took = time.time() - sent
    finally:
        for p in filter(alive, family):
            os.kill(p, signal.SIGKILL)
    assert code == 130 and took <= 10, (code, took, (tmp_path / "stopped.out").read_text()[-3000:])
    said = "".join(log.read_text() for log in (tmp_path / "sweeps" / "killed-fused" / "logs").glob("*.log"))
    assert "run.sh: error: interrupted" in said and "fairseq-validate" not in said, said[-3000:]  # the group's line
    out = finish(sweep(tmp_path / "resumed.out"), tmp_path / "resumed.out")
    assert "[sweep killed-fused] 2/2 done" in out, out[-3000:]
    runs = list((tmp_path / "checkpoints" / "standin" / "SST-2" / "lora").iterdir())
    stopped_runs = [f for f in runs if (f / "train.log").read_text().count("# trained together with: ") == 2]
    assert len(stopped_runs) == 2, [f.name for f in runs]
    for folder in stopped_runs:
        log = (folder / "train.log").read_text()
        loaded = re.findall(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ (\d+) updates\)", log)
        assert loaded == [str(HALF)], (folder.name, loaded)
        assert json.loads((folder / "results.json").read_text())["fused_with"]
