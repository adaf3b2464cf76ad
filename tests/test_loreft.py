"""LoReFT (Wu et al. 2024; fairseq_idpg/blocks/loreft.py): R keeps orthonormal rows through its parametrisation
(at the start, after updates, in half precision), an R set from outside is held exactly, the intervention
touches only the chosen positions (first / last real tokens, either padding side) and only R's subspace, its
flags fail in one line naming the flag, and its count is ReFT Table 4's 0.014% of RoBERTa-large."""

import pytest
import torch
from blocks_support import logits
from conftest import build_tiny

from fairseq_idpg.blocks.loreft import LoReFT
from fairseq_idpg.counts.blocks import baseline_rows
from fairseq_idpg.errors import ConfigError

# RoBERTa-large's parameters as Hugging Face's RobertaModel holds them (the denominator of ReFT's percentages):
# embeddings (50,265 words, 514 positions, 1 type, LayerNorm), 24 layers, the pooler
D, FFN, LAYERS = 1024, 4096, 24
LAYER = 4 * (D * D + D) + (D * FFN + FFN) + (FFN * D + D) + 2 * 2 * D
ROBERTA_LARGE = (50_265 + 514 + 1) * D + 2 * D + LAYERS * LAYER + (D * D + D)


def gram_error(R):
    return (R.float() @ R.float().T - torch.eye(R.shape[0])).abs().max().item()


def test_count_is_reft_table_4s():
    rows = {label: (ours, formula) for label, ours, formula in baseline_rows()}
    assert rows["LoReFT r=1, all layers, f1 (large)"] == (49_176, 49_176)
    assert rows["LoReFT r=1, all layers, f1 (base)"] == (18_444, 18_444)
    assert ROBERTA_LARGE == 355_359_744
    assert round(100 * 49_176 / ROBERTA_LARGE, 3) == 0.014  # ReFT Table 4, RoBERTa-large


def test_rows_stay_orthonormal_through_updates_and_an_assigned_R_is_exact():
    torch.manual_seed(0)
    block = LoReFT(16, 3)
    assert block.R.shape == (3, 16) and gram_error(block.R) < 1e-6
    optimizer = torch.optim.Adam(block.parameters(), lr=0.1)
    h = torch.randn(5, 2, 16)
    for _ in range(5):
        optimizer.zero_grad()
        block.edit(h).pow(2).sum().backward()
        optimizer.step()
    assert gram_error(block.R) < 1e-5
    target = torch.linalg.qr(torch.randn(16, 3)).Q.T
    block.rotation.weight = target  # through right_inverse: the reflectors of exactly this R
    assert (block.R - target).abs().max().item() < 1e-6


def test_the_edit_lives_in_rs_subspace_and_reaches_w_h_plus_b_there():
    """R Phi(h) = W h + b, and Phi(h) - h lies in the row space of R (ReFT Eq. 2)."""
    torch.manual_seed(1)
    block = LoReFT(16, 2).eval()
    h = torch.randn(4, 3, 16)
    out = block.edit(h)
    R, W, b = block.R, block.source.weight, block.source.bias
    assert torch.allclose(out @ R.T, h @ W.T + b, atol=1e-5)
    delta = out - h
    assert torch.allclose(delta @ R.T @ R, delta, atol=1e-5)
    assert (delta.abs().max() > 1e-2).item()


@pytest.mark.parametrize(
    "first,last,padded_left,expected",
    [
        (1, 0, False, [[1, 0, 0, 0, 0], [1, 0, 0, 0, 0]]),
        (0, 1, False, [[0, 0, 0, 0, 1], [0, 0, 1, 0, 0]]),
        (1, 1, False, [[1, 0, 0, 0, 1], [1, 0, 1, 0, 0]]),
        (2, 1, True, [[1, 1, 0, 0, 1], [0, 0, 1, 1, 1]]),
    ],
)
def test_only_the_chosen_positions_change(first, last, padded_left, expected):
    torch.manual_seed(2)
    block = LoReFT(8, 1, first=first, last=last).eval()
    h = torch.randn(5, 2, 8)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])  # row 1: 3 real tokens
    if padded_left:
        pad = pad.flip(1)
    changed = (block(h, pad) - h).abs().amax(-1).T > 1e-6  # [B, T]
    assert changed.long().tolist() == expected


def test_half_precision_keeps_rs_rows_orthonormal_and_the_states_dtype():
    block = LoReFT(16, 2)
    for dtype in (torch.float16, torch.bfloat16):
        half = LoReFT(16, 2).to(dtype)
        half.load_state_dict(block.state_dict())
        assert half.R.dtype == dtype and gram_error(half.R) < 1e-2
        out = half(torch.randn(3, 2, 16, dtype=dtype), None)
        assert out.dtype == dtype and torch.isfinite(out).all()


def test_loreft_on_the_tiny_model_moves_the_logits_and_saves_only_its_tensors(tiny):
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="loreft").eval()
    plain = build_tiny(tiny, "roberta_blocks", bitfit=True).eval()
    plain.classification_heads.load_state_dict(model.classification_heads.state_dict())
    assert not torch.allclose(logits(model), logits(plain), atol=1e-4)  # nn.Linear's W, b: not the identity
    trained = {n for n, p in model.named_parameters() if p.requires_grad and not n.startswith("classification_")}
    per_layer = ("rotation.parametrizations.weight.original", "source.weight", "source.bias")
    assert trained == {f"encoder.sentence_encoder.layers.{i}.loreft.{t}" for i in (0, 1) for t in per_layer}
    assert model.num_trainable_parameters() == 2 * (2 * tiny.dim + 1)


@pytest.mark.parametrize(
    "option,value,flag",
    [
        ("loreft_positions", "x1", "--loreft-positions"),
        ("loreft_positions", "f0", "--loreft-positions"),
        ("loreft_layers", "0;9", "--loreft-layers"),
        ("loreft_layers", "first", "--loreft-layers"),
        ("loreft_dropout", 1.0, "--loreft-dropout"),
        ("loreft_rank", 10_000, "--loreft-rank"),
    ],
)
def test_bad_options_fail_in_one_line_naming_the_flag(tiny, option, value, flag):
    with pytest.raises(ConfigError) as error:
        build_tiny(tiny, "roberta_blocks", blocks_preset="loreft", **{option: value})
    message = str(error.value)
    assert flag in message and "\n" not in message


def test_chosen_layers_only(tiny):
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="loreft", loreft_layers="1")
    layers = model.encoder.sentence_encoder.layers
    assert getattr(layers[0], "loreft", None) is None and isinstance(layers[1].loreft, LoReFT)


def test_overlapping_first_and_last_positions_are_edited_once():
    """f2+l2 on a row of 3 real tokens: token 1 is both a first and a last one; Phi is applied to it once."""
    torch.manual_seed(3)
    block = LoReFT(8, 2, first=2, last=2).eval()
    h = torch.randn(5, 2, 8)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    chosen = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool).T[..., None]
    assert torch.allclose(block(h, pad), torch.where(chosen, block.edit(h), h), atol=1e-6)
