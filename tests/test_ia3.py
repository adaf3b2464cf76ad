"""(IA)^3 (Liu et al. 2022; fairseq_idpg/blocks/ia3.py): l_k, l_v and l_ff start at ones (the frozen model),
rescale the keys, values and the FFN's inner activations (equal to folding them into W_k, W_v and fc2,
as PEFT's merge does), and are the only tensors that train; the count of PEFT's IA3 on roberta-base."""

import torch
from blocks_support import logits
from conftest import build_tiny

from fairseq_idpg.counts.blocks import baseline_rows


def plain(tiny, model):
    """The same backbone through fairseq's own layers (BitFit only unfreezes biases), with ``model``'s head."""
    reference = build_tiny(tiny, "roberta_blocks", bitfit=True).eval()
    reference.classification_heads.load_state_dict(model.classification_heads.state_dict())
    return reference


def test_ones_leave_the_frozen_model_and_only_the_vectors_train(tiny):
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="ia3").eval()
    assert torch.allclose(logits(model), logits(plain(tiny, model)), atol=1e-6)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad and not n.startswith("classification_")}
    layers = "encoder.sentence_encoder.layers"
    assert trainable == {
        name for i in (0, 1) for name in (f"{layers}.{i}.self_attn.ia3_k.l", f"{layers}.{i}.self_attn.ia3_v.l")
    } | {f"{layers}.{i}.ia3_ff.l" for i in (0, 1)}
    assert model.num_trainable_parameters() == 2 * (32 + 32 + 64)  # L (d + d + d_ffn)
    assert all(torch.equal(p, torch.ones_like(p)) for n, p in model.named_parameters() if ".ia3_" in n)


def test_scaling_equals_the_vectors_folded_into_the_frozen_weights(tiny):
    """l_k * (W_k x + b_k) = (diag(l_k) W_k) x + l_k b_k, likewise l_v; fc2(l_ff * h) = (fc2.W diag(l_ff)) h + b."""
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="ia3").eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".ia3_" in n:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
    folded = plain(tiny, model)
    assert not torch.allclose(logits(model), logits(folded), atol=1e-4)
    with torch.no_grad():
        for ours, theirs in zip(
            model.encoder.sentence_encoder.layers, folded.encoder.sentence_encoder.layers, strict=False
        ):
            for proj, scale in (
                (theirs.self_attn.k_proj, ours.self_attn.ia3_k.l),
                (theirs.self_attn.v_proj, ours.self_attn.ia3_v.l),
            ):
                proj.weight.mul_(scale[:, None])
                proj.bias.mul_(scale)
            theirs.fc2.weight.mul_(ours.ia3_ff.l[None, :])
    assert torch.allclose(logits(model), logits(folded), atol=1e-5)


def test_count_is_peft_ia3_on_roberta_base():
    rows = {method: (ours, paper) for method, ours, paper in baseline_rows()}
    assert rows["(IA)^3 k, v, ff (base)"] == (55_296, 55_296)
    assert rows["(IA)^3 k, v, ff (large)"] == (147_456, 147_456)
