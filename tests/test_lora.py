"""LoRA (Hu et al. 2021; inducer-tuning section 4.5): the update itself, B = 0 leaves the backbone
unchanged, merging into W gives the same logits, only the LoRA tensors train. The methods come from the
registry (``blocks_support.methods_with``); what every block gets: tests/test_block_generic.py."""

import math
import re

import pytest
import torch
import torch.nn as nn
from blocks_support import logits, methods_with
from conftest import build_tiny

from fairseq_idpg.blocks.lora import merge_lora
from fairseq_idpg.modules.attention.lora import LoRA


def test_update_is_scaled_low_rank_product():
    torch.manual_seed(0)
    lora = LoRA(12, 10, rank=3, alpha=32.0, dropout=0.0).double()
    assert lora.B.abs().sum() == 0 and lora.A.abs().sum() > 0  # loralib init: B = 0, A kaiming-uniform
    assert lora.A.abs().max() <= 1 / math.sqrt(12)  # kaiming-uniform(a = sqrt 5) bound = 1/sqrt(fan_in)
    with torch.no_grad():
        lora.B.normal_()
    x = torch.randn(4, 7, 12, dtype=torch.float64)
    expected = (32.0 / 3) * x @ lora.A.T @ lora.B.T
    assert torch.allclose(lora(x), expected, atol=1e-12)
    assert torch.allclose(x @ lora.delta_weight().T, expected, atol=1e-12)
    assert sum(p.numel() for p in lora.parameters()) == 12 * 3 + 3 * 10
    with pytest.raises(ValueError, match="LoRA rank must be >= 1, got 0"):
        LoRA(12, 10, rank=0)


def test_dropout_acts_on_the_input_in_training_only():
    torch.manual_seed(0)
    lora = LoRA(8, 8, rank=2, dropout=0.5)
    with torch.no_grad():
        lora.B.normal_()
    x = torch.randn(64, 8)
    lora.eval()
    assert torch.equal(lora(x), lora(x))
    lora.train()
    assert not torch.allclose(lora(x), lora.eval()(x))


def plain_logits(tiny, head):
    """Logits of the frozen backbone through fairseq's own attention (no block installed)."""
    model = build_tiny(
        tiny, "roberta_blocks", bitfit=True
    ).eval()  # BitFit only unfreezes biases: the forward is fairseq's
    model.classification_heads.load_state_dict(head.state_dict())
    return logits(model)


def test_lora_with_b_zero_leaves_the_backbone_and_lora_changes_it(tiny):
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="lora").eval()
    reference = plain_logits(tiny, model.classification_heads)
    assert torch.allclose(logits(model), reference, atol=1e-6)
    trainable = {
        n for n, p in model.named_parameters() if p.requires_grad and not n.startswith("classification_heads.")
    }
    assert trainable == {
        f"encoder.sentence_encoder.layers.{i}.self_attn.lora_{t}.{m}" for i in (0, 1) for t in "qv" for m in "AB"
    }
    with torch.no_grad():
        model.encoder.sentence_encoder.layers[1].self_attn.lora_v.B.normal_()
    assert not torch.allclose(logits(model), reference, atol=1e-4)


# LoRA on W_q: the merge below checks W_q
@pytest.mark.parametrize("preset", methods_with("lora", where=lambda blocks: "q" in blocks["lora"].targets()))
def test_merging_lora_into_w_gives_the_same_logits(tiny, preset):
    model = build_tiny(tiny, "roberta_blocks", blocks_preset=preset).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name and name.endswith(".B"):
                p.normal_(0, 0.5)
    before = logits(model)
    q_weight = model.encoder.sentence_encoder.layers[0].self_attn.q_proj.weight.clone()
    merge_lora(model)
    attention = model.encoder.sentence_encoder.layers[0].self_attn
    assert attention.lora_q is None and not torch.equal(attention.q_proj.weight, q_weight)
    assert torch.allclose(logits(model), before, atol=1e-5)


@pytest.mark.parametrize("preset", methods_with("lora"))  # --lora-rank 0 / -1: tests/test_block_generic.py
def test_bad_lora_settings_fail_at_build_time(tiny, preset):
    with pytest.raises(ValueError, match=re.escape("--lora-targets must be q, v or q,v, got 'k'")):
        build_tiny(tiny, "roberta_blocks", blocks_preset=preset, lora_targets="k")
    with pytest.raises(ValueError, match=re.escape("--lora-targets must be q, v or q,v, got 'q,k'")):
        build_tiny(tiny, "roberta_blocks", blocks_preset=preset, lora_targets="q,k")


def test_nothing_to_train_fails_at_build_time(tiny):
    with pytest.raises(ValueError, match=re.escape("nothing to train: give --blocks-preset")):
        build_tiny(tiny, "roberta_blocks")


def test_frozen_projection_gets_no_gradient(tiny):
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="lora").train()
    logits(model).sum().backward()
    attention = model.encoder.sentence_encoder.layers[0].self_attn
    assert attention.q_proj.weight.grad is None and isinstance(attention.q_proj, nn.Linear)
    assert attention.lora_q.A.grad is not None and attention.lora_q.B.grad.abs().sum() > 0


def test_scaling_as_the_adds_alpha_keeps_the_logits_and_gradients(tiny, monkeypatch):
    """The slot adds the update with the scaling as ``torch.add``'s alpha (one launch, not a multiply and an
    add): fp32 logits and LoRA gradients equal those of y + (alpha / r) B A x within 1e-6 (one rounding less)."""
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="lora").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name and name.endswith(".B"):
                p.normal_(0, 0.5)
    tokens = torch.tensor([[0, 5, 6, 7, 8, 2], [0, 9, 10, 2, 1, 1]])

    def logits_and_grads():
        model.zero_grad(set_to_none=True)
        out = model(tokens, classification_head_name="head")[0]
        out.sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if ".lora_" in n}

    fused, fused_grads = logits_and_grads()
    monkeypatch.setattr(LoRA, "project", lambda lora, x, y: y + lora(x))
    separate, separate_grads = logits_and_grads()
    assert torch.allclose(fused, separate, atol=1e-6, rtol=0)
    for name, grad in separate_grads.items():
        assert torch.allclose(fused_grads[name], grad, atol=1e-6, rtol=1e-5), name
