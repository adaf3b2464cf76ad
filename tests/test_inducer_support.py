"""Helpers shared by the tests of inducer-tuning and the adapter-family baselines
(test_inducer.py, test_lora.py, test_adapters.py, test_prefix.py). No tests here."""
import json
import subprocess
from pathlib import Path

import pytest
import torch
from fairseq.data import Dictionary

from fairseq_idpg.conversion.tiny import write_tiny_roberta
from fairseq_idpg.models.roberta_adapters import RobertaAdaptersModel, build_with_flags

REPO = Path(__file__).resolve().parents[1]
TOKENS = torch.tensor([[0, 5, 6, 7, 8, 2], [0, 9, 10, 2, 1, 1]])  # one padded row
TINY_SIZES = dict(encoder_layers=2, encoder_embed_dim=32, encoder_attention_heads=4, encoder_ffn_embed_dim=64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random 2 x 32 fairseq RoBERTa folder and its dictionary (as the task builds it)."""
    folder = Path(write_tiny_roberta(tmp_path_factory.mktemp("tiny") / "tiny"))
    dictionary = Dictionary.load(str(folder / "dict.txt"))
    dictionary.add_symbol("<mask>")
    return folder, dictionary


def build(tiny, model_cls=RobertaAdaptersModel, **flags):
    """``model_cls`` on the tiny backbone, built as fairseq-train does, with a 2-class head."""
    folder, dictionary = tiny
    model = build_with_flags(model_cls, dictionary, backbone=str(folder / "model.pt"), **{**TINY_SIZES, **flags})
    model.register_classification_head("head", num_classes=2)
    return model


def logits(model, tokens=TOKENS):
    return model(tokens, classification_head_name="head")[0]


def run_main_job(work_dir, method, task="RTE"):
    """``scripts/run.sh`` (prepare -> fairseq-train -> fairseq-validate), 5 updates on the offline
    stand-in (all-MiniLM-L6-v2 converted to fairseq RoBERTa); returns its save folder and results."""
    cmd = ["bash", str(REPO / "scripts" / "run.sh"), task, "--method", method, "--max-update", "5",
           "--total-batch", "8", "--validate-interval-updates", "5", "--work-dir", str(work_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    save = Path(work_dir) / "checkpoints" / "standin" / task / method
    return save, json.loads((save / "results.json").read_text())
