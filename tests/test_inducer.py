"""Inducer-tuning (inducer-tuning sections 4.3-4.5, Tables 3 and 5): equivalences with attention
computed explicitly, padding, gradients, precision, memory, presets, counts and build-time errors. The methods
come from the registry (``blocks_support``); a compact checkpoint's resume: tests/test_block_generic.py."""

import copy
import math
import re

import pytest
import torch
from blocks_support import block_methods, logits, methods_with, run_main_job
from checkpoint_support import assert_compact_and_resumable, assert_hub_agrees_with_validation
from conftest import SHARED, STANDIN, build_tiny
from fairseq.modules.multihead_attention import MultiheadAttention

from fairseq_idpg.counts.blocks import baseline_rows, inducer_rows
from fairseq_idpg.modules.attention.augmented_self_attention import AugmentedSelfAttention
from fairseq_idpg.modules.attention.inducer import Inducer

D, H = 16, 4
DH = D // H


def attention_pair(output="gated", extend_value=True, key_rank=3, mask_lambda=True, seed=0, dtype=torch.float64):
    """A fairseq self-attention (reference) and a copy converted to inducer-tuning."""
    torch.manual_seed(seed)
    reference = MultiheadAttention(D, H, dropout=0.0, self_attention=True).to(dtype)
    attention = copy.deepcopy(reference)
    inducer = Inducer(
        D, H, key_rank, 2, extend_value=extend_value, output=output, mask_lambda=mask_lambda, lambda_dropout=0.0
    )
    with torch.no_grad():
        for p in inducer.parameters():  # far from the 0.01 init, so every term matters
            p.normal_(0, 0.5)
    AugmentedSelfAttention.convert(attention, 0).attach("attention_output", "inducer", inducer.to(dtype))
    return reference, attention


def inputs(dtype=torch.float64, seed=1, lengths=(6, 4, 5)):
    torch.manual_seed(seed)
    T, B = max(lengths), len(lengths)
    x = torch.randn(T, B, D, dtype=dtype)
    pad = torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]  # [B, T], True at padding
    return x, pad


def heads(t):
    """[T, d] -> [H, T, d_h]."""
    return t.view(t.size(0), H, DH).transpose(0, 1)


def explicit_gated(attention, x, pad):
    """Per query i and head h: softmax attention over keys [k~_i; K] with values [v~_i; V]."""
    ind, out = attention.inducer, torch.zeros_like(x)
    W_o = attention.out_proj.weight  # [d, d]: column block h maps head h's d_h values
    for b in range(x.size(1)):
        valid = ~pad[b]
        xb = x[:, b]
        q, k, v = heads(attention.q_proj(xb)), heads(attention.k_proj(xb)[valid]), heads(attention.v_proj(xb)[valid])
        for i in range(x.size(0)):
            total = attention.out_proj.bias.clone()
            for h in range(H):
                qi = q[h, i]
                k_ind = qi + torch.tanh(qi @ ind.key_A[h] + ind.key_a[h]) @ ind.key_B[h] + ind.key_b[h]
                keys = torch.cat([k_ind[None], k[h]])  # [1 + S, d_h]
                w = torch.softmax(keys @ qi / math.sqrt(DH), dim=0)
                z = torch.tanh(qi @ ind.value_A[h] + ind.value_a[h])
                W_oh = W_o[:, h * DH : (h + 1) * DH]
                if ind.extend_value:  # values in the output space: [z B_v[h]; V_h W_o^h]
                    values = torch.cat([(z @ ind.value_B[h])[None], v[h] @ W_oh.T])
                    total = total + w @ values
                else:
                    values = torch.cat([(z @ ind.value_B[h] + ind.value_b[h])[None], v[h]])
                    total = total + W_oh @ (w @ values)
            out[i, b] = total + (ind.value_b if ind.extend_value else 0)
    return out


@pytest.mark.parametrize("extend_value", [True, False])
def test_gated_option_equals_explicit_attention_over_inducer_and_keys(extend_value):
    _, attention = attention_pair(output="gated", extend_value=extend_value)
    x, pad = inputs()
    out, _ = attention(x, x, x, key_padding_mask=pad)
    assert torch.allclose(out, explicit_gated(attention, x, pad), atol=1e-10)


def test_residual_option_is_ordinary_attention_plus_lambda_delta_with_gradients():
    reference, attention = attention_pair(output="residual")
    x, pad = inputs()
    ind = attention.inducer

    x1 = x.clone().requires_grad_()
    out, _ = attention(x1, x1, x1, key_padding_mask=pad)

    x2 = x.clone().requires_grad_()
    base, _ = reference(x2, x2, x2, key_padding_mask=pad, need_weights=False)  # fairseq's own attention
    T, B = x.shape[:2]
    q = (attention.q_proj(x2)).view(T, B, H, DH).permute(1, 2, 0, 3)
    k = (attention.k_proj(x2)).view(T, B, H, DH).permute(1, 2, 0, 3)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(DH)).masked_fill(pad[:, None, None, :], float("-inf"))
    k_ind = (
        q
        + torch.einsum(
            "bhtr,hrd->bhtd", torch.tanh(torch.einsum("bhtd,hdr->bhtr", q, ind.key_A) + ind.key_a[:, None]), ind.key_B
        )
        + ind.key_b[:, None]
    )
    lam = torch.sigmoid((q * k_ind).sum(-1) / math.sqrt(DH) - torch.logsumexp(scores, dim=-1))  # Eq. 7
    z = torch.tanh(torch.einsum("bhtd,hdr->bhtr", q, ind.value_A) + ind.value_a[:, None])
    delta = torch.einsum("bht,bhtr,hrd->tbd", lam, z, ind.value_B) + ind.value_b
    expected = base + delta
    assert torch.allclose(out, expected, atol=1e-10)

    # the logsumexp read off the softmax (max S - log max P) has logsumexp's gradient
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    assert torch.allclose(x1.grad, x2.grad, atol=1e-10)


@pytest.mark.parametrize("output", ["residual", "gated"])
def test_keys_and_values_of_padded_positions_change_no_output(output):
    _, attention = attention_pair(output=output)
    _, unmasked = attention_pair(output=output, mask_lambda=False)
    x, pad = inputs()
    other = x.clone()
    other[pad.T] = torch.randn(int(pad.sum()), D, dtype=x.dtype) * 10  # new keys/values at padding
    real = ~pad.T  # [T, B] the outputs that matter
    a, _ = attention(x, x, x, key_padding_mask=pad)
    b, _ = attention(other, other, other, key_padding_mask=pad)
    assert torch.allclose(a[real], b[real], atol=1e-12)
    # the released code's lambda keeps padded keys in its normaliser: the same change leaks in
    a, _ = unmasked(x, x, x, key_padding_mask=pad)
    b, _ = unmasked(other, other, other, key_padding_mask=pad)
    assert not torch.allclose(a[real], b[real], atol=1e-3)


def test_low_precision_matches_float32():
    _, attention = attention_pair(output="residual", dtype=torch.float32)
    x, pad = inputs(dtype=torch.float32)
    full, _ = attention(x, x, x, key_padding_mask=pad)
    for dtype, tol in ((torch.bfloat16, 0.1), (torch.float16, 0.02)):
        low = copy.deepcopy(attention).to(dtype)
        xl = x.to(dtype).requires_grad_()
        out, _ = low(xl, xl, xl, key_padding_mask=pad)
        out.float().sum().backward()
        assert out.dtype == dtype and torch.isfinite(xl.grad).all()
        assert (out.float() - full).abs().max() < tol * full.abs().max()


def saved_tensor_elements(module, x, pad, **kwargs):
    """Elements of the [.., T, T] tensors autograd keeps for backward during one forward."""
    T = x.size(0)
    total = []

    def pack(t):
        if t.dim() >= 2 and tuple(t.shape[-2:]) == (T, T):
            total.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x, x, x, key_padding_mask=pad, **kwargs)
    return sum(total)


def test_no_extra_t_by_t_tensors_beyond_ordinary_attention():
    reference, attention = attention_pair(output="residual", dtype=torch.float32)
    reference.train(), attention.train()
    reference.dropout_module.p = attention.dropout_module.p = 0.1
    x, pad = inputs(dtype=torch.float32, lengths=(7, 5, 6))
    x.requires_grad_()
    ordinary = saved_tensor_elements(reference, x, pad, need_weights=True)  # fairseq's explicit softmax path
    ours = saved_tensor_elements(attention, x, pad)
    assert 0 < ours <= ordinary


# ---------------------------------------------------------------------- the model
def test_zero_value_term_gives_the_frozen_backbone_and_the_inducer_path_runs(tiny):
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="inducer").eval()
    plain = build_tiny(tiny, "roberta_blocks", bitfit=True).eval()  # fairseq's own layers, same backbone
    plain.classification_heads.load_state_dict(model.classification_heads.state_dict())
    reference, ours = logits(plain), logits(model)
    assert not torch.allclose(ours, reference, atol=1e-6)  # the inducer runs (eval mode too)
    with torch.no_grad():
        for layer in model.encoder.sentence_encoder.layers:
            layer.self_attn.inducer.value_B.zero_()
            layer.self_attn.inducer.value_b.zero_()
    assert torch.allclose(logits(model), reference, atol=1e-6)  # residual form: Attn + lambda * 0


def test_presets_build_the_table5_blocks_and_only_they_train(tiny):
    mam = build_tiny(tiny, "roberta_blocks", blocks_preset="mam-inducer")
    layer = mam.encoder.sentence_encoder.layers[0]
    assert (layer.self_attn.inducer.key_rank, layer.self_attn.inducer.value_rank) == (2, 2)
    assert layer.self_attn.lora_q.rank == 4 and getattr(layer.self_attn, "lora_v", None) is None
    assert layer.parallel_adapter.down.out_features == 12 and layer.parallel_adapter.scale == 2.0
    trainable = {n for n, p in mam.named_parameters() if p.requires_grad and not n.startswith("classification_heads.")}
    assert trainable and all(any(s in n for s in (".inducer.", ".lora_q.", ".parallel_adapter.")) for n in trainable)
    assert mam.num_trainable_parameters() == 2 * (
        (2 * 32 * 2 + 4 * 2 + 32) + (32 * 2 + 4 * 2 + 4 * 2 * 32 + 32) + 2 * 32 * 4 + (2 * 32 * 12 + 12 + 32)
    )

    # flags beat the preset
    explicit = build_tiny(tiny, "roberta_blocks", blocks_preset="inducer-lora", lora_rank=8, inducer_output="gated")
    attention = explicit.encoder.sentence_encoder.layers[1].self_attn
    assert attention.lora_q.rank == 8 and attention.inducer.output == "gated" and attention.inducer.key_rank == 2
    adaptive = build_tiny(tiny, "roberta_blocks", blocks_preset="inducer-adaptive")
    adaptive = adaptive.encoder.sentence_encoder.layers[0].self_attn.inducer
    assert (adaptive.key_rank, adaptive.extend_value) == (0, False) and not hasattr(adaptive, "key_A")


def test_counts_match_the_paper():
    rows = inducer_rows()
    assert len(rows) == 6
    for method, ours, paper in rows + baseline_rows():  # + Houlsby, Compacter, prefix, LoRA, MAM, BitFit
        assert ours == paper, method


# (record, flags, message), each record from the registry: every record of the block (or of the model) the flag
# belongs to (the size options at 0 and below: tests/test_block_generic.py, for every block)
INVALID = [
    *((preset, flags, message) for preset in methods_with("inducer") for flags, message in (
        (dict(inducer_key_rank=1), "--inducer-key-rank must be 0 (k~ = q) or >= 2, got 1"),
        (dict(inducer_lambda_dropout=1.0), "--inducer-lambda-dropout must be in [0, 1), got 1.0"),
        (dict(inducer_output="both"), "--inducer-output must be one of residual, gated, got 'both'"),
        (dict(encoder_attention_heads=5), "--encoder-attention-heads 5 must divide --encoder-embed-dim 32"),
    )),
    ("nope", {}, f"--blocks-preset must be one of {', '.join(block_methods())}, got 'nope'"),
]  # fmt: skip


@pytest.mark.parametrize("preset,flags,message", INVALID, ids=[f"{p}: {m}" for p, _, m in INVALID])
def test_invalid_settings_fail_at_build_time(tiny, preset, flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build_tiny(tiny, "roberta_blocks", blocks_preset=preset, **flags)


@pytest.mark.slow
def test_mam_inducer_trains_and_validates_end_to_end(tmp_path, glue_slices, standin_model):
    from fairseq_idpg.layout import data_folder
    from fairseq_idpg.preprocessing import prepare

    # RTE's slice prepared in this process where run.sh prepares it: its task.json records the same files, so
    # run.sh uses it (one prepare_data.py start fewer)
    data, vocab = data_folder(tmp_path, "standin", "RTE"), STANDIN / "vocab.txt"
    prepare("RTE", str(glue_slices / "RTE"), str(data), bpe="wordpiece", vocab=str(vocab), workers=1)
    save, results = run_main_job(tmp_path, "mam-inducer", glue_slices / "RTE")
    assert_compact_and_resumable(save, updates=5)  # inducer + LoRA + adapter + head + fingerprint
    state = torch.load(save / "checkpoint_best.pt", map_location="cpu", weights_only=False)["model"]
    assert any(".self_attn.inducer.value_B" in k for k in state) and any(".parallel_adapter." in k for k in state)
    # the hub, from the raw dev sentences, reproduces the prepared tokens and what fairseq-validate's model predicts
    assert_hub_agrees_with_validation(save, "RTE", SHARED / "data" / "glue" / "RTE")
    assert 0.0 < results["results"]["valid"]["accuracy"] < 100.0  # a score, as a number


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_inducer_scores_and_lambda_promote_inside_their_kernels_as_the_casts_did(dtype):
    """s and lse are promoted to float32 inside the multiply and the subtraction, not by casts of their own: the
    values of the explicit casts exactly, in every dtype."""
    from fairseq_idpg.modules.attention.inducer import Inducer

    torch.manual_seed(0)
    inducer = Inducer(16, 4, key_rank=2, value_rank=2, lambda_dropout=0.0).to(dtype).eval()
    q = torch.randn(2, 4, 5, 4, dtype=dtype)
    scores = torch.randn(2, 4, 5, 7, dtype=dtype)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    h = torch.tanh(torch.einsum("bhtd,hdr->bhtr", q, inducer.key_A) + inducer.key_a[:, None])
    k = q + torch.einsum("bhtr,hrd->bhtd", h, inducer.key_B) + inducer.key_b[:, None]
    with torch.no_grad():
        assert torch.equal(inducer.inducer_scores(q, 0.5), (q.float() * k.float()).sum(-1) * 0.5)
        _, delta = inducer.attend(q, torch.zeros_like(q), scores, scores, probs, None, 0.5)
        lse = scores.max(dim=-1).values.float() - torch.log(probs.max(dim=-1).values)
        lam = torch.sigmoid(inducer.inducer_scores(q, 0.5) - lse).to(dtype)
        assert torch.equal(delta, inducer.extended_delta(inducer.value_hidden(q), lam))
