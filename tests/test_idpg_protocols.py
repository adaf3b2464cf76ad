"""IDPG training protocols (scripts/idpg/): the released schedules, the commands they run, MNLI
doubled by swapping the sentences, and the stage-1 backbone export of supplementary training."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fairseq.data import data_utils
from test_idpg_cache import TRAIN_ROWS, rte  # noqa: F401  (fixture)
from test_idpg_model import backbones  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts" / "idpg"))
import protocols  # noqa: E402


def dry_run(script, *args):
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "idpg" / script), "--dry-run", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [line[2:] for line in out.stdout.splitlines() if line.startswith("+ ")]


def test_released_schedules():
    # batch 16 and 50 epochs, or batch 32 and 10 epochs for the large tasks (IDPG Table 4)
    assert protocols.full_schedule("RTE", 2490) == (16, 50, 50 * 156)
    assert protocols.full_schedule("SST-2", 67349) == (32, 10, 10 * 2105)
    assert protocols.full_schedule("QQP", 363846) == (32, 10, 10 * 11371)


def test_full_and_few_shot_commands():
    full = dry_run("full.sh", "RTE", "--lrs", "5e-3,1e-4", "--seeds", "1,2", "--", "--idpg-hidden", "32")
    assert len(full) == 4 and all(
        "--method m-idpg-phm" in c and "--total-batch 16 --max-update 7800 --max-epoch 50" in c for c in full
    )
    assert [c.split("--lr ")[1].split()[0] for c in full] == ["0.005", "0.005", "0.0001", "0.0001"]
    assert all(c.endswith("--idpg-hidden 32") for c in full)
    assert len({c.split("--work-dir ")[1].split()[0] for c in full}) == 4  # one folder per run
    few = dry_run("few_shot.sh", "SST-2", "--k", "100,1000", "--seeds", "3")
    runs = [c for c in few if "run.sh" in c]
    # run.sh samples (and records in task.json) K train examples and the dev set with the seed
    assert [c.split("--few-shot ")[1].split()[:3] for c in runs] == [
        ["100", "--data-seed", "3"],
        ["1000", "--data-seed", "3"],
    ]
    assert all("--lr 0.0005" in c and "--total-batch 16" in c and "--max-epoch 50" in c for c in runs)
    assert ["--max-update 350" in runs[0], "--max-update 3150" in runs[1]] == [True, True]
    scored = [c for c in few if c.startswith("fairseq-validate")]
    assert all("--valid-subset test " in c for c in scored)  # scored on the official dev set
    work = REPO / "checkpoints" / "idpg-protocols" / "few-shot"
    assert [c.split()[1] for c in scored] == [
        str(work / f"SST-2-K{k}-seed3" / "data-bin" / "standin" / f"SST-2.few-shot{k}.seed3") for k in (100, 1000)
    ]


def test_results_of_a_run_found_by_its_configuration(tmp_path, monkeypatch):
    """run.sh's folder of each configuration holds config.json: the protocol reads the run it asked for."""
    opts = argparse.Namespace(model="standin", method="m-idpg-phm", dry_run=False, work_dir=str(tmp_path))
    runner = protocols.Runner(opts, [])
    monkeypatch.setattr(runner, "call", lambda cmd: None)
    root = tmp_path / "checkpoints" / "standin" / "RTE" / "m-idpg-phm"
    for name, lr, seed, score in (("lr5e-3.seed1.aaaa0000", 5e-3, 1, 60.0), ("lr1e-4.seed2.bbbb0000", 1e-4, 2, 55.5)):
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text(json.dumps({"lr": lr, "seed": seed}))
        (root / name / "results.json").write_text(json.dumps({"metric": "accuracy", "score": score}))
    results, folder = runner.main_job("RTE", tmp_path, 1e-4, 2, 16, 100, 50)
    assert folder == root / "lr1e-4.seed2.bbbb0000" and results["score"] == 55.5
    with pytest.raises(protocols.RunError, match="no results.json of RTE m-idpg-phm lr 0.001 seed 1"):
        runner.main_job("RTE", tmp_path, 1e-3, 1, 16, 100, 50)


def test_supplementary_commands():
    cmds = dry_run("supplementary.sh", "MRPC", "--double", "--lrs", "1e-3", "--seeds", "1")
    stage1 = next(c for c in cmds if "run.sh MNLI" in c)
    for flag in (
        "--idpg-train-backbone",
        "--prompt-position 0",
        "--lr 1e-05",
        "--total-batch 32",
        "--lr-scheduler polynomial_decay",
        "--max-update 245440",
        "--warmup-updates 14726",
    ):
        assert flag in stage1
    assert any(c.startswith("double_pairs(") for c in cmds)
    stage2 = next(c for c in cmds if "run.sh MRPC" in c)
    assert (
        "--model " + str(REPO / "checkpoints" / "idpg-protocols" / "supplementary" / "standin-mnli-doubled-s-idpg-phm")
        in stage2
    )


def rows(data, column, split="train"):
    ds = data_utils.load_indexed_dataset(str(data / column / split), None)
    return [ds[i].tolist() for i in range(len(ds))]


def test_doubling_appends_the_swapped_copy(rte, tmp_path):  # noqa: F811
    out = tmp_path / "doubled"
    protocols.double_pairs(rte["a"], out)
    first, second = rows(rte["a"], "input0"), rows(rte["a"], "input1")
    assert rows(out, "input0") == first + second and rows(out, "input1") == second + first
    assert rows(out, "label") == rows(rte["a"], "label") * 2
    assert rows(out, "input0", "valid") == rows(rte["a"], "input0", "valid")
    info = json.loads((out / "task.json").read_text())
    assert info["splits"]["train"] == 2 * TRAIN_ROWS and info["doubled_by_swapping"]


def test_export_backbone_of_a_stage_one_checkpoint(backbones, tmp_path):  # noqa: F811
    base = torch.load(backbones[0].model_file, weights_only=False)
    trained = {k: v + 1 for k, v in base["model"].items()}
    trained["generator.biases.first"] = torch.zeros(3)
    torch.save({"model": trained}, tmp_path / "stage1.pt")
    protocols.export_backbone(tmp_path / "stage1.pt", backbones[0].folder, tmp_path / "out")
    exported = torch.load(tmp_path / "out" / "model.pt", weights_only=False)
    assert exported["model"].keys() == base["model"].keys()
    name = "encoder.sentence_encoder.layers.0.fc1.weight"
    assert torch.equal(exported["model"][name], base["model"][name] + 1)
    assert exported["cfg"]["model"].encoder_layers == base["cfg"]["model"].encoder_layers
    assert (tmp_path / "out" / "dict.txt").read_text() == (backbones[0].folder / "dict.txt").read_text()
    torch.save({"model": {"generator.biases.first": torch.zeros(3)}}, tmp_path / "compact.pt")
    with pytest.raises(SystemExit, match="was stage 1 run with --idpg-train-backbone"):
        protocols.export_backbone(tmp_path / "compact.pt", backbones[0].folder, tmp_path / "out2")
    assert np.isfinite(exported["model"][name].numpy()).all()
