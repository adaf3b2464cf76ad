"""Helpers of the tests of the blocks family (``--arch roberta_blocks``: test_inducer.py, test_lora.py,
test_prefix.py, test_adapters.py). No tests here; the tiny backbone and builder are conftest's."""

import json
import subprocess
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TOKENS = torch.tensor([[0, 5, 6, 7, 8, 2], [0, 9, 10, 2, 1, 1]])  # one padded row


def logits(model, tokens=TOKENS):
    return model(tokens, classification_head_name="head")[0]


def run_main_job(work_dir, method, task="RTE"):
    """``scripts/run.sh`` (prepare -> fairseq-train -> fairseq-validate), 5 updates on the offline
    stand-in (all-MiniLM-L6-v2 converted to fairseq RoBERTa); returns the run's folder
    (``checkpoints/standin/<task>/<method>/lr<lr>.seed1.<hash>``) and its results.json."""
    from fairseq_idpg.run import find_runs

    cmd = [
        "bash",
        str(REPO / "scripts" / "run.sh"),
        task,
        "--method",
        method,
        "--max-update",
        "5",
        "--total-batch",
        "8",
        "--validate-interval-updates",
        "5",
        "--work-dir",
        str(work_dir),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (save,) = find_runs(work_dir, "standin", task, method)
    return save, json.loads((save / "results.json").read_text())
