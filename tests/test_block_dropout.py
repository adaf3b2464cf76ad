"""Training-mode dropout of the blocks of ``--arch roberta_blocks``: on in train mode, off in eval mode, and
where each block's docstring puts it:

| block                                    | dropout                          | where                                |
|------------------------------------------|----------------------------------|--------------------------------------|
| LoRA (Hu et al. 2021; inducer-tuning     | --lora-dropout (0.1)             | its input: (alpha / r) Dropout(x)    |
| section 4.5)                             |                                  | A^T B^T, not its output              |
| inducer (inducer-tuning, released code)  | --inducer-lambda-dropout (0.1)   | lambda, not the value term / output  |
| parallel FFN adapter (He et al. 2021)    | the backbone's --dropout (0.1)   | W_up Dropout(ReLU(W_down x + b_d))   |
| Houlsby adapter, Compacter, prefixes     | none of their own                | the sublayer's dropout acts before   |
|                                          |                                  | the sequential adapters              |

Train-mode outputs are compared with the hand-built layer of test_block_placement.py, which draws its masks
with ``F.dropout`` in the modules' order after the same ``torch.manual_seed``; the variants with a dropout
moved elsewhere must not match.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from blocks_support import logits, method_blocks, methods_with
from conftest import build_tiny
from fairseq.modules.fairseq_dropout import FairseqDropout
from test_block_placement import (
    ADAPTER_PRESETS,
    ATOL,
    OTHER_PRESETS,
    batch,
    max_diff,
    no_drop,
    one_thread,  # noqa: F401  (autouse: one intra-op thread for these tiny tensors)
    randomise_blocks,
    reference_adapter,
    reference_attention,
    reference_layer,
    reference_lora,
    train_drop,
)

SEED = 1234
ALL_PRESETS = ADAPTER_PRESETS + OTHER_PRESETS
# the blocks that carry a dropout of their own (the table above: LoRA, lambda, the parallel FFN adapter), and the
# methods that use one
BLOCKS_WITH_DROPOUT = {"lora", "inducer", "ffn_adapter", "loreft"}
WITH_DROPOUT = {name for name in ALL_PRESETS if set(method_blocks(name)) & BLOCKS_WITH_DROPOUT}


def fresh(tiny, preset):
    return randomise_blocks(build_tiny(tiny, "roberta_blocks", blocks_preset=preset))


def seeded(fn, *args, **kwargs):
    torch.manual_seed(SEED)
    return fn(*args, **kwargs)


def sdpa_draws_like_f_dropout():
    """Whether torch's fused attention (fairseq's and ours without an inducer) drops the attention probabilities
    with the mask ``F.dropout`` draws after the same seed (its math path on the CPU does)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 2, 5, 4, generator=g).unbind(0)
    keep = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]
    with torch.random.fork_rng(devices=[]):
        fused = seeded(F.scaled_dot_product_attention, q, k, v, attn_mask=keep, dropout_p=0.5)
        probs = torch.softmax((q @ k.transpose(-1, -2) / 2).masked_fill(~keep, float("-inf")), dim=-1)
        explicit = seeded(F.dropout, probs, 0.5, True) @ v
    return torch.allclose(fused, explicit, atol=1e-6)


# ---------------------------------------------------------------------- LoRA: the input
def test_lora_dropout_is_on_its_input(tiny):
    attn = fresh(tiny, "lora").encoder.sentence_encoder.layers[0].self_attn
    x, _ = batch(tiny.dim)
    for lora in (attn.lora_q, attn.lora_v):
        assert lora.dropout.p == 0.1
        lora.train()
        with torch.no_grad():
            out = seeded(lora, x)
            assert not torch.allclose(lora(x), lora(x))  # active in train mode
            assert torch.allclose(out, seeded(reference_lora, lora, x, train_drop, ()), atol=ATOL)
            on_output = seeded(reference_lora, lora, x, train_drop, {"lora-dropout-on-output"})
            assert max_diff(out, on_output) > 100 * ATOL  # same masks (same shapes), other place
            lora.eval()
            assert torch.equal(lora(x), lora(x))  # off in eval mode
            assert torch.allclose(lora(x), reference_lora(lora, x, no_drop, ()), atol=ATOL)


# ---------------------------------------------------------------------- inducer: lambda
@pytest.mark.parametrize("preset", methods_with("inducer"))
def test_inducer_dropout_is_on_lambda(tiny, preset):
    attn = fresh(tiny, preset).encoder.sentence_encoder.layers[0].self_attn
    ind = attn.inducer
    assert ind.lambda_dropout == 0.1
    attn.dropout_module.p = 0.0  # the backbone's attention dropout off: lambda's is then the only one
    x, pad = batch(tiny.dim)
    with torch.no_grad():
        attn.train()
        out = seeded(attn, x, x, x, key_padding_mask=pad)[0]
        assert not torch.allclose(attn(x, x, x, key_padding_mask=pad)[0], out)
        assert torch.allclose(out, seeded(reference_attention, attn, x, pad, train_drop), atol=ATOL)
        moved = seeded(reference_attention, attn, x, pad, train_drop, {"lambda-dropout-on-output"})
        assert max_diff(out, moved) > 100 * ATOL
        # the gate alone: lambda = Dropout(sigmoid(s - lse))
        s, lse = torch.randn(2, 3, 4, 5).unbind(0)
        assert torch.equal(seeded(ind.gate, s, lse, torch.float32), seeded(F.dropout, torch.sigmoid(s - lse), 0.1))
        attn.eval()
        out = attn(x, x, x, key_padding_mask=pad)[0]
        assert torch.equal(out, attn(x, x, x, key_padding_mask=pad)[0])
        assert torch.allclose(out, reference_attention(attn, x, pad), atol=ATOL)
        assert torch.equal(ind.gate(s, lse, torch.float32), torch.sigmoid(s - lse))


# ---------------------------------------------------------------------- parallel FFN adapter: its hidden layer
@pytest.mark.parametrize("preset", methods_with("ffn_adapter"))
def test_parallel_adapter_dropout_is_on_its_hidden_layer(tiny, preset):
    model = fresh(tiny, preset)
    adapter = model.encoder.sentence_encoder.layers[0].parallel_adapter
    assert adapter.dropout.p == model.args.dropout == 0.1
    x, _ = batch(tiny.dim)
    with torch.no_grad():
        adapter.train()
        out = seeded(adapter, x)
        assert not torch.allclose(adapter(x), out)
        assert torch.allclose(out, seeded(reference_adapter, adapter, x, train_drop), atol=ATOL)
        on_output = seeded(reference_adapter, adapter, x, train_drop, {"adapter-dropout-on-output"})
        assert max_diff(out, on_output) > 100 * ATOL
        adapter.eval()
        assert torch.equal(adapter(x), adapter(x))
        assert torch.allclose(adapter(x), reference_adapter(adapter, x), atol=ATOL)


# ---------------------------------------------------------------------- no dropout of their own
@pytest.mark.parametrize("preset", methods_with("adapter", "prefix"))
def test_sequential_adapters_and_prefixes_have_no_dropout_of_their_own(tiny, preset):
    model = fresh(tiny, preset).train()
    x, _ = batch(tiny.dim)
    active, blocks = method_blocks(preset), []
    with torch.no_grad():
        if "prefix" in active:
            blocks.append(model.prefix_encoder)
            kv = [model.prefix_encoder.layer_kv(i) for i in range(2)]
            assert all(
                torch.equal(a, b)
                for i in range(2)
                for a, b in zip(kv[i], model.prefix_encoder.layer_kv(i), strict=False)
            )
        if "adapter" in active:
            layer = model.encoder.sentence_encoder.layers[0]
            blocks += [layer.attn_adapter, layer.ffn_adapter]
            for adapter in blocks[-2:]:
                assert adapter.dropout.p == 0.0
                assert torch.equal(adapter(x), adapter(x))
                assert torch.allclose(adapter(x), reference_adapter(adapter, x), atol=ATOL)
    assert not any(isinstance(m, (nn.Dropout, FairseqDropout)) and m.p > 0 for b in blocks for m in b.modules())


# ---------------------------------------------------------------------- whole layers in train mode
@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_train_mode_layer_equals_the_hand_built_layer_with_dropout(tiny, preset):
    model = fresh(tiny, preset).train()
    x, pad = batch(tiny.dim)
    with torch.no_grad():
        for i, layer in enumerate(model.encoder.sentence_encoder.layers):
            inducer_path = getattr(layer.self_attn, "inducer", None) is not None  # our explicit softmax dropout
            if not inducer_path and not sdpa_draws_like_f_dropout():
                pytest.skip("this torch's fused attention draws its dropout mask unlike F.dropout")
            out = seeded(layer, x, pad)
            assert not torch.allclose(layer(x, pad), out)
            expected = seeded(reference_layer, layer, x, pad, train_drop)
            assert torch.allclose(out, expected, atol=ATOL), f"layer {i}: max |diff| {max_diff(out, expected):.2e}"
            layer.eval()
            assert torch.equal(layer(x, pad), layer(x, pad))
            assert torch.allclose(layer(x, pad), reference_layer(layer, x, pad), atol=ATOL)


@pytest.mark.parametrize("preset", methods_with("adapter"))
def test_sequential_adapters_come_after_the_sublayer_dropout(tiny, preset):
    """Houlsby (adapter-bert: dense -> dropout -> adapter -> LayerNorm(+ input)), Compacter likewise."""
    if not sdpa_draws_like_f_dropout():
        pytest.skip("this torch's fused attention draws its dropout mask unlike F.dropout")
    model = fresh(tiny, preset).train()
    x, pad = batch(tiny.dim)
    with torch.no_grad():
        for layer in model.encoder.sentence_encoder.layers:
            out = seeded(layer, x, pad)
            assert torch.allclose(out, seeded(reference_layer, layer, x, pad, train_drop), atol=ATOL)
            before = seeded(reference_layer, layer, x, pad, train_drop, {"adapter-before-dropout"})
            assert max_diff(out, before) > 100 * ATOL


@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_with_the_backbone_dropouts_off_only_blocks_with_dropout_make_training_random(tiny, preset):
    model = fresh(tiny, preset)
    for module in model.modules():  # fairseq's dropouts (embeddings, attention, layers) and the head's
        if isinstance(module, FairseqDropout) or module is model.classification_heads["head"].dropout:
            module.p = 0.0
    with torch.no_grad():
        model.train()
        first, second = logits(model), logits(model)
        assert torch.equal(first, second) == (preset not in WITH_DROPOUT)
        model.eval()
        assert torch.equal(logits(model), logits(model))
