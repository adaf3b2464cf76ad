"""Prefix tuning (Li & Liang 2021, He et al. 2021's form): attention over [P_k; K] / [P_v; V], the
reparameterisation and its per-layer slices, trained through the MLP; training checkpoints keep the
MLP (resumable: tests/test_block_generic.py), exported ones hold the 2 L l d prefixes. The methods come from
the registry (``blocks_support.methods_with``)."""

import argparse
import math

import pytest
import torch
from blocks_support import logits, methods_with, run_main_job
from checkpoint_support import (
    HEAD,
    assert_compact_and_resumable,
    assert_hub_agrees_with_validation,
    fairseq_adam,
    hub,
    train_steps,
)
from conftest import SHARED, STANDIN, build_tiny
from fairseq.modules.multihead_attention import MultiheadAttention

from fairseq_idpg.blocks.prefix import PREFIX_KEY
from fairseq_idpg.methods import METHODS
from fairseq_idpg.models.frozen_roberta import FINGERPRINT_KEY, export_checkpoint
from fairseq_idpg.models.roberta_blocks import RobertaBlocksModel
from fairseq_idpg.modules.attention.augmented_self_attention import AugmentedSelfAttention
from fairseq_idpg.modules.attention.prefix import PrefixEncoder


def test_layer_slices_are_the_reparameterised_prefixes():
    torch.manual_seed(0)
    prefix = PrefixEncoder(num_layers=3, dim=8, length=5, mid_dim=11).double()
    full = prefix.output(torch.tanh(prefix.hidden(prefix.embedding.weight))).view(5, 3, 2, 8)  # P.view(l, L, 2, d)
    for layer in range(3):
        k, v = prefix.layer_kv(layer)
        assert torch.allclose(k, full[:, layer, 0], atol=1e-12) and torch.allclose(v, full[:, layer, 1], atol=1e-12)
    stored = prefix.prefixes()
    assert stored.shape == (3, 2, 5, 8) and torch.allclose(stored[1, 1], full[:, 1, 1], atol=1e-12)
    trained = sum(p.numel() for p in prefix.parameters())
    assert trained == 5 * 8 + (8 * 11 + 11) + (11 * 2 * 3 * 8 + 2 * 3 * 8)
    prefix.to_stored()
    assert [n for n, _ in prefix.named_parameters()] == ["kv"] and prefix.kv.numel() == 2 * 3 * 5 * 8
    assert torch.equal(prefix.layer_kv(2)[0], stored[2, 0])


def per_layer_prefixes(prefix, layer):
    """The reparameterisation as it was computed before it ran once per forward: tanh(E W_1 + b_1) and the
    layer's own rows of W_2 in every layer (the reference the per-forward prefixes must equal)."""
    h = torch.tanh(prefix.hidden(prefix.embedding.weight))
    rows = slice(layer * 2 * prefix.dim, (layer + 1) * 2 * prefix.dim)
    kv = torch.nn.functional.linear(h, prefix.output.weight[rows], prefix.output.bias[rows])
    return kv[:, : prefix.dim], kv[:, prefix.dim :]


def test_prefixes_once_per_forward_give_the_logits_and_gradients_of_per_layer_prefixes(tiny4, monkeypatch):
    """The MLP runs once per model forward (``PrefixEncoder.begin``): fp32 logits and the MLP's gradients equal
    those of the per-layer computation within 1e-6 (summation order), and no prefixes outlive the forward."""
    torch.manual_seed(0)
    model = build_tiny(tiny4, METHODS["prefix-tuning"]).eval()
    tokens = torch.tensor([[0, 5, 6, 7, 8, 2], [0, 9, 10, 2, 1, 1]])

    def logits_and_grads():
        model.zero_grad(set_to_none=True)
        out = model(tokens, classification_head_name="head")[0]
        out.sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.prefix_encoder.named_parameters()}

    once, once_grads = logits_and_grads()
    assert model.prefix_encoder._layers is None
    monkeypatch.setattr(PrefixEncoder, "layer_kv", per_layer_prefixes)
    per_layer, per_layer_grads = logits_and_grads()
    assert torch.allclose(once, per_layer, atol=1e-6, rtol=0)
    for name, grad in per_layer_grads.items():
        assert torch.allclose(once_grads[name], grad, atol=1e-6, rtol=1e-5), name


def test_attention_with_prefixes_equals_explicit_attention_over_prefixed_keys():
    torch.manual_seed(0)
    D, H, l = 16, 4, 3
    dh = D // H
    attention = MultiheadAttention(D, H, dropout=0.0, self_attention=True).double()
    prefix = PrefixEncoder(num_layers=2, dim=D, length=l, mid_dim=7).double()
    AugmentedSelfAttention.convert(attention, 1).attach("keys_values", "prefix", prefix, owned=False)
    x = torch.randn(5, 2, D, dtype=torch.float64)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    out, _ = attention(x, x, x, key_padding_mask=pad)

    pk, pv = prefix.layer_kv(1)
    for b in range(2):
        valid = ~pad[b]
        keys = torch.cat([pk, attention.k_proj(x[valid, b])])  # [l + S, D]: prefixes never masked
        values = torch.cat([pv, attention.v_proj(x[valid, b])])
        q = attention.q_proj(x[:, b])
        heads = [
            torch.softmax(q[:, h * dh : (h + 1) * dh] @ keys[:, h * dh : (h + 1) * dh].T / math.sqrt(dh), dim=-1)
            @ values[:, h * dh : (h + 1) * dh]
            for h in range(H)
        ]
        assert torch.allclose(out[:, b], attention.out_proj(torch.cat(heads, dim=-1)), atol=1e-12)


def test_trained_through_the_mlp_saved_with_it_and_exported_without_it(tiny):
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="prefix-tuning", save_trainable_only=True)
    logits(model).sum().backward()
    mlp = model.prefix_encoder
    assert mlp.embedding.weight.grad.abs().sum() > 0 and mlp.output.weight.grad.abs().sum() > 0
    assert model.num_trainable_parameters() == 32 * 32 + (32 * 800 + 800) + (800 * 2 * 2 * 32 + 2 * 2 * 32)

    model.eval()
    expected = logits(model)
    state = model.state_dict()  # what fairseq-train saves: the training form, so that a run resumes
    assert "prefix_encoder.output.weight" in state and PREFIX_KEY not in state
    assert not any(k.startswith("encoder.") for k in state)  # --save-trainable-only: no backbone

    stored = RobertaBlocksModel.stored_state_dict(state)  # what an exported checkpoint holds
    assert stored[PREFIX_KEY].shape == (2, 2, 32, 32)  # [L, 2, l, d]
    assert not any(k.startswith("prefix_encoder.") and k != PREFIX_KEY for k in stored)
    assert torch.allclose(stored[PREFIX_KEY], model.prefix_encoder.prefixes(), atol=1e-6)
    fresh = build_tiny(tiny, "roberta_blocks", blocks_preset="prefix-tuning", save_trainable_only=True).eval()
    fresh.load_state_dict(stored)
    assert fresh.prefix_encoder.stored and fresh.num_trainable_parameters() == 2 * 2 * 32 * 32
    assert torch.allclose(logits(fresh), expected, atol=1e-6)
    assert PREFIX_KEY in fresh.state_dict()  # a stored model saves the same compact form again

    fresh = build_tiny(tiny, "roberta_blocks", blocks_preset="prefix-tuning", save_trainable_only=True).eval()
    fresh.load_state_dict(state)  # a training checkpoint: the MLP again
    assert not fresh.prefix_encoder.stored and torch.equal(logits(fresh), expected)


@pytest.mark.parametrize("preset", methods_with("prefix"))
def test_training_checkpoints_keep_the_mlp_and_the_stored_form_does_not_fit_their_optimizer_state(tiny, preset):
    """A compact checkpoint holds the MLP, so that fairseq's optimizer state fits a resumed run (its resume:
    tests/test_block_generic.py); the stored form has other trainable tensors: that state does not fit them (why
    training checkpoints keep the MLP; an exported checkpoint resumes with --reset-optimizer)."""
    model = build_tiny(tiny, "roberta_blocks", blocks_preset=preset, save_trainable_only=True)
    optimizer, scheduler = fairseq_adam(model)
    train_steps(model, optimizer, scheduler, range(1))
    state = model.state_dict()
    assert "prefix_encoder.output.weight" in state and not set(state) & model.frozen_names()
    model.load_state_dict(RobertaBlocksModel.stored_state_dict(state))
    with pytest.raises(ValueError, match="size of optimizer's group"):
        fairseq_adam(model)[0].load_state_dict(optimizer.state_dict())


def test_export_checkpoint_writes_the_stored_form_without_optimizer_state(tiny, tmp_path):
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="prefix-tuning", save_trainable_only=True).eval()
    cfg = {"model": argparse.Namespace(arch="roberta_blocks", _name="roberta_blocks"), "task": {}}
    torch.save({"cfg": cfg, "model": model.state_dict(), "last_optimizer_state": {"state": {}}}, tmp_path / "a.pt")
    values = export_checkpoint(tmp_path / "a.pt", tmp_path / "b.pt")
    exported = torch.load(tmp_path / "b.pt", weights_only=False)
    assert exported["last_optimizer_state"] is None and exported["cfg"]["model"].arch == "roberta_blocks"
    head = sum(p.numel() for p in model.classification_heads.parameters())
    assert values == 2 * 2 * 32 * 32 + head and FINGERPRINT_KEY in exported["model"]
    assert torch.allclose(exported["model"][PREFIX_KEY], model.prefix_encoder.prefixes())


def test_prefixes_change_outputs_and_bad_length_fails(tiny):
    model = build_tiny(tiny, "roberta_blocks", blocks_preset="prefix-tuning").eval()
    reference = build_tiny(tiny, "roberta_blocks", bitfit=True).eval()
    reference.classification_heads.load_state_dict(model.classification_heads.state_dict())
    assert not torch.allclose(logits(model), logits(reference), atol=1e-4)
    with pytest.raises(ValueError, match=r"--prefix-length must be >= 1 for --blocks-preset prefix-tuning \(got 0\)"):
        build_tiny(tiny, "roberta_blocks", blocks_preset="prefix-tuning", prefix_length=0)


@pytest.mark.slow
def test_prefix_tuning_trains_and_validates_from_the_compact_checkpoint(tmp_path, glue_slices, standin_model):
    from fairseq_idpg.layout import data_folder
    from fairseq_idpg.preprocessing import prepare

    # RTE's slice prepared in this process where run.sh prepares it: its task.json records the same files, so
    # run.sh uses it (one prepare_data.py start fewer)
    data, vocab = data_folder(tmp_path, "standin", "RTE"), STANDIN / "vocab.txt"
    prepare("RTE", str(glue_slices / "RTE"), str(data), bpe="wordpiece", vocab=str(vocab), workers=1)
    save, results = run_main_job(tmp_path, "prefix-tuning", glue_slices / "RTE")
    # checkpoints: the MLP + head + fingerprint, no backbone tensor; checkpoint_last resumes
    assert_compact_and_resumable(save, updates=5)
    state = torch.load(save / "checkpoint_best.pt", map_location="cpu", weights_only=False)
    assert state["model"]["prefix_encoder.output.weight"].shape == (6 * 2 * 384, 800)  # stand-in: L = 6, d = 384
    raw = SHARED / "data" / "glue" / "RTE"
    # the hub, from the raw dev sentences, reproduces the prepared tokens and what fairseq-validate's model predicts
    assert_hub_agrees_with_validation(save, "RTE", raw)
    assert 0.0 < results["results"]["valid"]["accuracy"] < 100.0  # a score, as a number

    # exported: the 2 L l d prefixes (no MLP, no optimizer state), predicting as checkpoint_best does
    export_checkpoint(save / "checkpoint_best.pt", save / "exported.pt")
    exported = torch.load(save / "exported.pt", map_location="cpu", weights_only=False)
    assert exported["model"][PREFIX_KEY].shape == (6, 2, 32, 384) and exported["last_optimizer_state"] is None
    assert not any(k.startswith("prefix_encoder.") and k != PREFIX_KEY for k in exported["model"])
    best, stored = hub(save), hub(save, "exported.pt")
    assert stored.model.prefix_encoder.stored and not best.model.prefix_encoder.stored
    tokens = best.encode("The cat sat on the mat.", "A cat is sitting.")
    assert torch.allclose(stored.predict(HEAD, tokens), best.predict(HEAD, tokens), atol=1e-5)
