"""``scripts/sweep.sh SPEC --fuse K``: runs that differ only in seed train together on one backbone, and their
records, scores, learning curves, trained tensors and table are those of the same sweep run one run at a time
(stand-in, slices of the real RTE files, dropout off, 4 updates each)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from test_sweep import write_spec

SPEC = """
name: fused
description: runs trained together against the same runs alone, dropout off
model: standin
tasks: [RTE]
methods: [prompt-tuning-5, {method: lora, args: [--lora-dropout, 0]}]
lrs: recipe
seeds: [1, 2]
max_update: 4
args: [--validate-interval-updates, 4, --total-batch, 8, --dropout, 0, --attention-dropout, 0]
"""


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


@pytest.fixture(scope="module")
def sweeps(glue_slices, tmp_path_factory):
    root = tmp_path_factory.mktemp("fused-sweep")
    spec = write_spec(root, SPEC)
    env = {**os.environ, "GLUE_DIR": str(glue_slices)}
    alone = sweep_sh(spec, root / "alone", env)
    fused = sweep_sh(spec, root / "fused", env, "--fuse", "2")
    again = sweep_sh(spec, root / "fused", env, "--fuse", "2")
    dry = sweep_sh(spec, root / "planned", env, "--fuse", "2", "--dry-run")
    return {"root": root, "spec": spec, "alone": alone, "fused": fused, "again": again, "dry": dry}


@pytest.mark.slow
@pytest.mark.xdist_group("sweep-fused")
def test_a_fused_sweep_records_what_the_runs_record_alone(sweeps):
    root = sweeps["root"]
    alone, fused = records(root / "alone"), records(root / "fused")
    assert sorted(alone) == sorted(fused) and len(fused) == 4  # the same folder names: the same run hashes
    assert "start RTE.prompt-tuning-5.lr-recipe.seed1 + 1 fused" in sweeps["fused"]
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
            torch.testing.assert_close(a[key], value, rtol=1e-4, atol=5e-6, msg=f"{name} {key}")


@pytest.mark.slow
@pytest.mark.xdist_group("sweep-fused")
def test_a_fused_sweep_again_is_cached_and_its_dry_run_shows_the_groups(sweeps):
    assert "4/4 done (4 cached)" in sweeps["again"] and "start " not in sweeps["again"]
    assert "fused: 4 run(s) in 2 group(s) of up to 2 on one backbone each, 0 alone" in sweeps["dry"]


@pytest.mark.slow
@pytest.mark.xdist_group("sweep-fused")
def test_the_fused_records_rebuild_the_same_table(sweeps, tmp_path):
    root = sweeps["root"]
    tables = {}
    for which in ("alone", "fused"):
        out = tmp_path / which
        cmd = [sys.executable, "-m", "fairseq_idpg.results", str(root / which / "sweeps" / "fused" / "records")]
        cmd += ["--spec", str(sweeps["spec"]), "--out-dir", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
        assert done.returncode == 0, done.stderr[-3000:]
        tables[which] = (out / "table.csv").read_text()
    assert tables["fused"] == tables["alone"]
