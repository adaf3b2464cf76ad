"""Our LoReFT against pyreft's (stanfordnlp/pyreft 0.1.0 on the package index), on one batch.

The fixture tests/data/loreft_reference/outputs.pt holds pyreft's side's outputs (every layer's output hidden states
on the real tokens, logits, loss, the gradients of R, W, b and the head, in our names) on a tiny random RoBERTa
(2 layers x 16) with our trained values, for the loreft record (r 1 at the first token) and r 2 at the first and
last real tokens, and pyreft's trained count at the paper's GLUE setting on roberta.large; written once by
scripts/loreft_reference_check.py --save-fixture (provenance.json there). The tests recompute our side without
pyreft."""

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import loreft_reference_check as check  # noqa: E402

FIXTURE = REPO / "tests" / "data" / "loreft_reference" / "outputs.pt"
TOLERANCE = 1e-6  # float32 rounding at these sizes (the largest measured: 3.6e-7, a hidden state)


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    data = torch.load(FIXTURE, weights_only=False)
    assert data["config"] == check.FIXTURE, "the script's tiny model changed: write the fixture again"
    backbone = check.tiny_backbone(tmp_path_factory.mktemp("tiny"))
    assert check.backbone_sum(backbone[0]) == pytest.approx(data["backbone_sum"], rel=1e-12), "tiny backbone changed"
    return data, backbone


@pytest.mark.parametrize("case", check.CASES)
def test_ours_equals_pyrefts_states_logits_and_gradients(fixture, case):
    data, backbone = fixture
    ours = check.build_ours(backbone, case)
    check.load_values(ours, data[case]["values"])
    theirs = data[case]["outputs"]
    rows = check.differences(check.run_ours(ours, data["tokens"], data["labels"]), theirs)
    layers = check.FIXTURE["layers"]
    assert sum(key.startswith("hidden/") for key, _, _ in rows) == layers
    assert sum(key.endswith(".loreft.R") for key, _, _ in rows) == layers  # R's gradient, on the matrix
    assert len(rows) == 2 + layers + 4 + 3 * layers  # logits, loss, states, the head's 4 tensors, R, W, b per layer
    worst = {key: diff for key, diff, scale in rows if diff > TOLERANCE * max(scale, 1.0)}
    assert not worst, worst
    assert ours.num_trainable_parameters() == data[case]["their_count"]


def test_the_comparison_can_fail(fixture):
    """With no position chosen (the intervention off) the states and logits differ from pyreft's."""
    data, backbone = fixture
    ours = check.build_ours(backbone, "record")
    check.load_values(ours, data["record"]["values"])
    with torch.no_grad():
        for layer in ours.encoder.sentence_encoder.layers:
            layer.loreft.first = 0  # no position chosen
    rows = dict(
        (key, diff)
        for key, diff, _ in check.differences(
            check.run_ours(ours, data["tokens"], data["labels"]), data["record"]["outputs"]
        )
    )
    assert rows["hidden/0"] > 1e-2 and rows["logits"] > 1e-3


def test_pyrefts_count_at_roberta_large_is_ours(fixture):
    from fairseq_idpg.counts.blocks import count

    data, _ = fixture
    assert data["their_large_count"] == count("loreft", "roberta-large") == 49_176
