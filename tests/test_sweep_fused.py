"""``scripts/sweep.sh SPEC --fuse K``: runs that differ only in seed train together on one backbone, and their
records, scores, learning curves, trained tensors and table are those of the same runs trained one at a time,
through the sweep, for IDPG (M-IDPG-PHM, a generator) and a block (LoRA), each with its own flags (stand-in, a small
slice of the real SST-2 files: short sentences; dropout off, 3 updates each). That each family's runs (prompt
tuning, M-IDPG-PHM, LoRA, prefix tuning, BitFit and every other record that shares a backbone) end trained together
as they end alone is tests/test_fused_train.py's test_fused_members_end_as_they_end_alone (one test per record, on a
tiny backbone); here, that a sweep groups them, and records, caches and tabulates each member as its lone run.

The fused sweep trains 4 runs in 2 groups of 2; the lone sweep trains one run of each group, the first member
for one method and the second for the other (ALONE): a lone run costs four interpreter starts (the main job, its
launcher, fairseq-train, fairseq-validate), which is most of this test's time, not the 3 updates."""

import json
import os
import shutil
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import REPO
from test_sweep import write_spec

from fairseq_idpg import sweep

SPEC = """
name: fused
description: runs trained together against the same runs alone, dropout off
model: standin
tasks: [SST-2]
methods:
  - {method: m-idpg-phm, args: [--idpg-dropout, 0]}
  - {method: lora, args: [--lora-dropout, 0]}
lrs: recipe
seeds: [1, 2]
max_update: 3
args: [--validate-interval-updates, 3, --total-batch, 8, --dropout, 0, --attention-dropout, 0]
"""
# the lone sweep: the same runs, one seed of each method (both members' places in a group of 2 checked)
ALONE = SPEC.replace("[--idpg-dropout, 0]}", "[--idpg-dropout, 0], seeds: [2]}")
ALONE = ALONE.replace("[--lora-dropout, 0]}", "[--lora-dropout, 0], seeds: [1]}")
METHODS = ("m-idpg-phm", "lora")
UPDATES = 3
# a fused run's trained tensors against its lone run's: float rounding (the K runs' rows go through the backbone
# as one batch, so its matmuls sum in another order). Adam divides each grad by its own size: where a grad cancels
# to near its eps, the rounding's relative error reaches the step (M-IDPG-PHM's A, lr 5e-3: one element of 4,096
# 6.6e-6 apart after 3 updates from the authors' N(0, 0.02^2) start), so ATOL is 2e-3 of one step at lr 5e-3
RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def sst2_lines(shared_data, tmp_path_factory):
    """A ``$GLUE_DIR`` of SST-2's first 48 train rows (6 batches of 8) and first 16 dev rows."""
    root = tmp_path_factory.mktemp("sst2-lines")
    (root / "SST-2").mkdir()
    for name, rows in (("train.tsv", 48), ("dev.tsv", 16)):
        lines = (shared_data / "glue" / "SST-2" / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (root / "SST-2" / name).write_text("".join(lines[: rows + 1]), encoding="utf-8")
    return root


def sweep_sh(spec, work, env, *flags):
    cmd = ["bash", str(REPO / "scripts" / "sweep.sh"), str(spec), "--work-dir", str(work), "--jobs", "2", *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=REPO, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def records(work):
    found = (json.loads(p.read_text()) for p in (work / "sweeps" / "fused" / "records").rglob("*.json"))
    return {r["run"]: r for r in found}


def without_folders(config):
    """A run's configuration but the work folder its data was prepared in (the two sweeps' differ)."""
    return {**config, "data": {k: v for k, v in config["data"].items() if k != "folder"}}


def initial_tensors(checkpoint):
    """(the trained tensors as the run started: its model built as fairseq-train builds it, from the run's own
    configuration and seed; its peak lr)."""
    from fairseq import checkpoint_utils, tasks, utils

    cfg = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))["cfg"]
    np.random.seed(cfg.common.seed)  # fairseq_cli.train.main's order: seeds, the task, then the model
    utils.set_torch_seed(cfg.common.seed)
    model = tasks.setup_task(cfg.task).build_model(cfg.model)
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, cfg.optimizer.lr[0]


def assert_trained(name, trained, checkpoint):
    """Every trained tensor moved from its start by more than the tolerance (so the fused run's equality with
    its lone run is not that of two untrained models), and by at most what Adam moves it in UPDATES updates
    (so the start rebuilt here is the run's: another draw of the random start would differ by more)."""
    start, lr = initial_tensors(checkpoint)
    assert start and start.keys() <= trained.keys(), name
    for key, before in start.items():
        moved = (trained[key] - before).abs().max().item()
        assert moved <= 2 * UPDATES * lr, f"{name} {key}: moved {moved:.3g}, more than Adam can (lr {lr})"
        assert not torch.allclose(trained[key], before, rtol=RTOL, atol=ATOL), f"{name} {key}: not trained"


@pytest.fixture(scope="module")
def sweeps(sst2_lines, tmp_path_factory):
    root = tmp_path_factory.mktemp("fused-sweep")
    spec, lone = write_spec(root, SPEC), write_spec(root, ALONE, "alone.yaml")
    env = {**os.environ, "GLUE_DIR": str(sst2_lines)}
    alone = sweep_sh(lone, root / "alone", env)
    fused = sweep_sh(spec, root / "fused", env, "--fuse", "2")
    again = sweep_sh(spec, root / "fused", env, "--fuse", "2")
    dry = sweep_sh(spec, root / "planned", env, "--fuse", "2", "--dry-run")
    return {"root": root, "spec": spec, "lone": lone, "alone": alone, "fused": fused, "again": again, "dry": dry}


@pytest.mark.slow
@pytest.mark.xdist_group("sweep-fused")
def test_a_fused_sweep_records_what_the_runs_record_alone(sweeps):
    root = sweeps["root"]
    alone, fused = records(root / "alone"), records(root / "fused")
    assert len(fused) == 2 * len(METHODS) and {r["method"] for r in fused.values()} == set(METHODS)
    assert len(alone) == len(METHODS) and set(alone) <= set(fused)  # the same folder names: the same run hashes
    assert {r["method"] for r in alone.values()} == set(METHODS) and {r["seed"] for r in alone.values()} == {1, 2}
    for method in METHODS:
        assert f"start SST-2.{method}.lr-recipe.seed1 + 1 fused" in sweeps["fused"]
    for name, want in alone.items():
        got = fused[name]
        assert got["results"] == want["results"] and got["score"] == want["score"], name
        assert got["curve"] == want["curve"], name
        assert without_folders(got["config"]) == without_folders(want["config"]) and "fused_with" not in want
        assert got["fused_with"] == [n for n in fused if n != name and fused[n]["method"] == got["method"]]
        saved = {w: next((root / w / "checkpoints").rglob(f"{name}/checkpoint_last.pt")) for w in ("alone", "fused")}
        a, b = (torch.load(saved[w], map_location="cpu", weights_only=False)["model"] for w in ("fused", "alone"))
        assert a.keys() == b.keys()
        for key, value in b.items():
            where = f"{name} {key}"
            torch.testing.assert_close(a[key], value, rtol=RTOL, atol=ATOL, msg=lambda said, w=where: f"{w}: {said}")
        assert_trained(f"{got['method']} {name}", b, saved["alone"])


@pytest.mark.slow
@pytest.mark.xdist_group("sweep-fused")
def test_a_fused_sweep_again_is_cached_and_its_dry_run_shows_the_groups(sweeps):
    assert "4/4 done (4 cached)" in sweeps["again"] and "start " not in sweeps["again"]
    assert "fused: 4 run(s) in 2 group(s) of up to 2 on one backbone each, 0 alone" in sweeps["dry"]


@pytest.mark.slow
@pytest.mark.xdist_group("sweep-fused")
def test_the_fused_records_rebuild_the_same_table(sweeps, tmp_path):
    from fairseq_idpg.results.__main__ import main as results

    root = sweeps["root"]
    # the lone runs' records, and the same runs' records from the fused sweep (the other seeds left out)
    alone = root / "alone" / "sweeps" / "fused" / "records"
    fused = tmp_path / "records"
    for record in alone.rglob("*.json"):
        twin = root / "fused" / "sweeps" / "fused" / "records" / record.relative_to(alone)
        (fused / record.relative_to(alone)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(twin, fused / record.relative_to(alone))
    tables = {}
    for which, records_dir in (("alone", alone), ("fused", fused)):
        out = tmp_path / which
        argv = [str(records_dir), "--spec", str(sweeps["lone"]), "--format", "csv", "--out-dir", str(out)]
        assert results(argv) == 0  # as python -m fairseq_idpg.results
        tables[which] = (out / "table.csv").read_text()
    assert tables["fused"] == tables["alone"]
    assert all(f",{method}," in tables["fused"] for method in METHODS)


# ---------------------------------------------------------------------------------------- progress (fast)
def train_line(update, wall):
    return (f'2026-01-01 00:00:00 | INFO | train_inner | {{"epoch": 1, "loss": "0.9", "num_updates": "{update}", '
            f'"lr": "0.001", "wall": "{wall}"}}\n')  # fmt: skip


def test_the_progress_line_shows_a_fused_groups_members_running_and_counts_each_finished(tmp_path, monkeypatch,
                                                                                        capsys):  # fmt: skip
    """While a group trains, each member is a running run with its update (from its own train.log) and eta; at
    its end, each member a finished run of its share of the slot's time: the eta of the runs left counts a group
    of 2 that took 3 minutes as 2 runs of 1m30s, not 2 of 3 minutes. The group's process is stood in for."""
    spec = write_spec(tmp_path, "name: s\ntasks: [RTE]\nmethods: [lora]\nlrs: recipe\nseeds: [1, 2, 3, 4]\n")
    runs = sweep.load_spec(spec).runs
    plans = []
    for run in runs:
        folder = tmp_path / "runs" / run.name
        folder.mkdir(parents=True)
        plans.append((run, SimpleNamespace(folder=folder, config={"updates": 300}, finished=False)))
    now = [1000.0]
    progress = sweep.SweepProgress("s", total=4, cached=0, slots=1, clock=lambda: now[0], every=60)

    def group(self, run, argv, free):  # the group's process: its members' train.logs, then their results
        assert argv[2] == "fairseq_idpg.run.group" and argv.count("--member") == 2
        members = [p for _, p in plans[:2]]
        for p, update in zip(members, (100, 90), strict=True):
            (p.folder / "train.log").write_text(train_line(update, 50))
        now[0] += 60
        progress.heartbeat()  # first look: fairseq's wall clock over the updates
        for p, update in zip(members, (160, 150), strict=True):
            (p.folder / "train.log").write_text(train_line(100, 50) + train_line(update, 80))
        now[0] += 60
        progress.heartbeat()  # second look: the pace seen since the first
        for p in members:
            (p.folder / "results.json").write_text(json.dumps({"results": {}, "metric": "accuracy"}))
            p.finished = True
        now[0] += 60
        return 0, 180.0, tmp_path / "group.log"

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(sweep.LocalExecutor, "run_one", group)
    monkeypatch.setattr(sweep, "fused_units", lambda pending, k: [pending])  # (fusion_key needs real plans)
    opts = SimpleNamespace(jobs=1, runs_per_gpu=1, threads=1, fuse=2, model="standin", work_dir=str(tmp_path))
    failures = sweep.Failures(tmp_path / "failures.json")
    capsys.readouterr()
    sweep.run_local(plans[:2], opts, tmp_path / "sweeps" / "s", progress, failures, tmp_path / "records")
    lines = capsys.readouterr().out.splitlines()
    first, second = plans[0][0].name, plans[1][0].name
    assert lines[1] == f"[sweep s] 0/4 done (0 cached), 2 running, 0 failed, 2 left, eta ?  start {first} + 1 fused"
    assert lines[2:5] == [
        # 100 updates in fairseq's 50 s: 200 left x 0.5 s
        f"  running {first}: update 100 of 300, eta 1m40s (1m00s so far, fused with 1)",
        f"  running {second}: update 90 of 300, eta 1m57s (1m00s so far, fused with 1)",  # 210 x 50 / 90
        # a run's share of the slot: (60 s so far + 100 s or 117 s left) / 2, mean 84 s, x (2 left + 2 running / 2)
        "[sweep s] 0/4 done (0 cached), 2 running, 0 failed, 2 left, eta 4m12s",
    ]
    assert lines[5:8] == [
        # 60 updates in the 60 s since the first look: 140 left x 1 s
        f"  running {first}: update 160 of 300, eta 2m20s (2m00s so far, fused with 1)",
        f"  running {second}: update 150 of 300, eta 2m30s (2m00s so far, fused with 1)",
        "[sweep s] 0/4 done (0 cached), 2 running, 0 failed, 2 left, eta 6m38s",  # (120 + 140 or 150) / 2 x 3
    ]
    # each member a finished run of 90 s: 2 left x 90 s over 1 slot
    assert lines[8:10] == [
        f"[sweep s] 1/4 done (0 cached), 1 running, 0 failed, 2 left, eta 3m45s  done {first} (3m00s)",
        f"[sweep s] 2/4 done (0 cached), 0 running, 0 failed, 2 left, eta 3m00s  done {second} (3m00s)",
    ]
    assert sorted(p.name for p in (tmp_path / "records").rglob("*.json")) == [f"{first}.json", f"{second}.json"]
