"""IDPG supplementary training, stage 1 (examples/idpg/supplementary.py): the commands it runs, MNLI
doubled by swapping the sentences, and the export of the stage-1 backbone as a model folder."""

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
sys.path.insert(0, str(REPO / "examples" / "idpg"))
import supplementary  # noqa: E402


def dry_run(*args):
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "idpg" / "supplementary.py"), "--dry-run", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [line[2:] for line in out.stdout.splitlines() if line.startswith("+ ")], out.stdout


def test_supplementary_stage_one_commands():
    cmds, out = dry_run("--double", "--seed", "3", "--", "--idpg-hidden", "32")
    stage1 = next(c for c in cmds if "run.sh MNLI" in c)
    for flag in (
        "--idpg-train-backbone",
        "--prompt-position 0",
        "--lr 1e-05",
        "--seed 3",
        "--total-batch 32",
        "--lr-scheduler polynomial_decay",
        "--max-update 245440",  # 10 epochs of the doubled MNLI (2 x 392,702) at batch 32
        "--warmup-updates 14726",
    ):
        assert flag in stage1
    assert stage1.endswith("--idpg-hidden 32")
    # the doubled set trains in a work folder of its own; plain MNLI stays where run.sh finds it
    doubled = REPO / "checkpoints" / "mnli-doubled"
    assert f"--work-dir {doubled} " in stage1
    plain = REPO / "data-bin" / "standin" / "MNLI"
    assert f"double_pairs({plain}, {doubled / 'data-bin' / 'standin' / 'MNLI'})" in cmds
    exported = REPO / "models" / "standin-mnli-doubled-s-idpg-phm"
    assert any(c.startswith("export_backbone(") and c.endswith(f", {exported})") for c in cmds)
    assert f"scripts/sweep.sh examples/idpg/supplementary.yaml --model {exported}" in out


def rows(data, column, split="train"):
    ds = data_utils.load_indexed_dataset(str(data / column / split), None)
    return [ds[i].tolist() for i in range(len(ds))]


def test_doubling_appends_the_swapped_copy(rte, tmp_path):  # noqa: F811
    out = tmp_path / "doubled"
    supplementary.double_pairs(rte["a"], out)
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
    supplementary.export_backbone(tmp_path / "stage1.pt", backbones[0].folder, tmp_path / "out")
    exported = torch.load(tmp_path / "out" / "model.pt", weights_only=False)
    assert exported["model"].keys() == base["model"].keys()
    name = "encoder.sentence_encoder.layers.0.fc1.weight"
    assert torch.equal(exported["model"][name], base["model"][name] + 1)
    assert exported["cfg"]["model"].encoder_layers == base["cfg"]["model"].encoder_layers
    assert (tmp_path / "out" / "dict.txt").read_text() == (backbones[0].folder / "dict.txt").read_text()
    torch.save({"model": {"generator.biases.first": torch.zeros(3)}}, tmp_path / "compact.pt")
    with pytest.raises(SystemExit, match="was stage 1 run with --idpg-train-backbone"):
        supplementary.export_backbone(tmp_path / "compact.pt", backbones[0].folder, tmp_path / "out2")
    assert np.isfinite(exported["model"][name].numpy()).all()
