"""LoRA's variants against their references on one batch: DoRA (Liu et al. 2024, Eq. 5 and section 4.3;
``--lora-dora``, the dora record) against PEFT's ``use_dora`` layer, outputs and gradients; PiSSA (Meng et al.
2024; ``--lora-init pissa``, the pissa record) against a float64 SVD and PEFT's ``pissa_init``; both start where
the backbone loaded at build time says; DoRA's count at roberta-large against PEFT's. The export / import
round trips with PEFT: tests/test_interop.py and tests/test_interop_peft_fields.py."""

import pytest
import torch
import torch.nn as nn
from blocks_support import logits
from conftest import build_tiny
from interop_support import assert_same_as_peft, peft_count_at_roberta_large

from fairseq_idpg.modules.attention.dora import DoRA
from fairseq_idpg.modules.attention.lora import LoRA

peft = pytest.importorskip("peft", reason="the [interop] extra (pip install -e .[interop]) is not installed")
pytestmark = pytest.mark.usefixtures("one_thread")

IN, OUT, RANK, ALPHA = 12, 10, 3, 6.0


def frozen_linear(seed=0):
    torch.manual_seed(seed)
    linear = nn.Linear(IN, OUT)
    linear.requires_grad_(False)
    return linear


def peft_layer(linear, dropout=0.0, **config):
    """PEFT's LoRA layer on a copy of ``linear`` (its own ``use_dora`` / ``init_lora_weights`` code), as
    ``get_peft_model`` builds it on a module holding that projection."""
    import copy

    holder = nn.Module()
    holder.proj = copy.deepcopy(linear)
    lora = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=dropout, target_modules=["proj"], **config)
    return peft.get_peft_model(holder, lora).base_model.model.proj


def theirs_params(theirs):
    """PEFT's A, B (and DoRA's m) of the layer's adapter."""
    parts = (theirs.lora_A, theirs.lora_B, theirs.lora_magnitude_vector)
    return tuple(p["default"].weight for p in parts if "default" in p)


def moved(*tensors, seed=1, std=0.3):
    """Every tensor moved off its start (in place, the same draws for each side)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in tensors:
            t.add_(torch.randn(t.shape, generator=g) * std)


# ------------------------------------------------------------------------------------------------------ PiSSA
def test_pissa_starts_from_the_top_singular_factors_and_leaves_the_output():
    """s B_0 A_0 is W's best rank-r approximation (a float64 SVD); A_0 A_0^T = B_0^T B_0 = diag(S_r / s) (the
    square root of the singular values in each factor); the projection's output starts unchanged; A, B and the
    residual equal PEFT's pissa_init on the same weight."""
    linear = frozen_linear()
    lora = LoRA(IN, OUT, RANK, ALPHA, init="pissa")
    lora.start_from(linear)
    s = ALPHA / RANK
    u, sv, vh = torch.linalg.svd(linear.weight.double(), full_matrices=False)
    best = (u[:, :RANK] * sv[:RANK]) @ vh[:RANK]
    assert torch.allclose((s * lora.B0 @ lora.A0).double(), best, atol=1e-5)
    diag = torch.diag(sv[:RANK] / s).float()
    assert torch.allclose(lora.A0 @ lora.A0.T, diag, atol=1e-5) and torch.allclose(lora.B0.T @ lora.B0, diag, atol=1e-5)
    assert torch.equal(lora.A, lora.A0) and torch.equal(lora.B, lora.B0)
    x = torch.randn(4, IN)
    assert torch.allclose(lora.project(x, linear(x)), linear(x), atol=1e-5)
    theirs = peft_layer(linear, init_lora_weights="pissa")
    assert torch.allclose(theirs.lora_A["default"].weight, lora.A, atol=1e-6)
    assert torch.allclose(theirs.lora_B["default"].weight, lora.B, atol=1e-6)
    residual = linear.weight - lora.delta_weight() - s * lora.B0 @ lora.A0  # delta = 0 at the start
    assert torch.allclose(theirs.get_base_layer().weight, residual, atol=1e-6)


def test_pissa_trains_as_peft_with_the_residual_frozen():
    """Moved off its start, our PiSSA projection (W x - s B_0 A_0 x + s B A x) gives PEFT's output (W_res x + s B A
    x) and the gradients of A and B, dropout included (the same draws)."""
    linear = frozen_linear()
    ours = LoRA(IN, OUT, RANK, ALPHA, dropout=0.2, init="pissa")
    ours.start_from(linear)
    theirs = peft_layer(linear, dropout=0.2, init_lora_weights="pissa")
    moved(ours.A, ours.B)
    moved(*theirs_params(theirs))
    assert_same_as_peft(linear, ours, theirs, (ours.A, ours.B), theirs_params(theirs)[:2], torch.randn(5, IN))


# ------------------------------------------------------------------------------------------------------- DoRA
def dora_pair(dropout=0.0, init="kaiming"):
    """(ours, PEFT's) DoRA on the same frozen projection, with the same A, B and m moved off their start."""
    linear = frozen_linear()
    theirs = peft_layer(linear, dropout=dropout, use_dora=True, init_lora_weights=True if init == "kaiming" else init)
    ours = DoRA(linear, RANK, ALPHA, dropout, init)
    ours.start_from(linear)
    assert torch.allclose(ours.magnitude, theirs.lora_magnitude_vector["default"].weight, atol=1e-6)
    with torch.no_grad():
        ours.A.copy_(theirs.lora_A["default"].weight)
        ours.B.copy_(theirs.lora_B["default"].weight)
    moved(ours.A, ours.B, ours.magnitude)
    moved(*theirs_params(theirs))
    return linear, ours, theirs


@pytest.mark.parametrize("init", ["kaiming", "pissa"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_dora_computes_peft_use_dora_outputs_and_gradients(dropout, init):
    """Eq. 5 as PEFT computes it: the same output and the same gradients of A, B and m (the norm a constant
    for the backward, section 4.3), in eval and in training (dropout on the input, the same draws), from
    loralib's start and from PiSSA's."""
    linear, ours, theirs = dora_pair(dropout, init)
    params = (ours.A, ours.B, ours.magnitude)
    assert_same_as_peft(linear, ours, theirs, params, theirs_params(theirs), torch.randn(2, 5, IN))


def test_dora_norm_is_detached_as_section_4_3_says():
    """The gradient of A and B is that of m (W_0 + s B A) / c with c = ||W_0 + s B A||_c held constant: it differs
    from the gradient through the norm (which the paper drops), so the test would see a norm left attached."""
    linear, ours, _ = dora_pair()
    x = torch.randn(7, IN)
    s = ALPHA / RANK

    def output(detach):
        direction = linear.weight + s * ours.B @ ours.A
        norm = direction.norm(dim=1)
        return x @ ((ours.magnitude / (norm.detach() if detach else norm))[:, None] * direction).T + linear.bias

    ours.eval()
    mine = ours.project(x, linear(x))
    got = torch.autograd.grad(mine.sum(), (ours.A, ours.B))
    detached = torch.autograd.grad(output(True).sum(), (ours.A, ours.B))
    attached = torch.autograd.grad(output(False).sum(), (ours.A, ours.B))
    assert all(torch.allclose(g, d, atol=1e-5) for g, d in zip(got, detached, strict=True))
    assert not all(torch.allclose(g, a, atol=1e-3) for g, a in zip(got, attached, strict=True))


@pytest.mark.parametrize("preset", ["dora", "pissa"])
def test_the_start_is_computed_from_the_loaded_backbone(tiny, preset):
    """The magnitude (||W_0||_c) and PiSSA's factors are computed from the backbone's weights once they are
    loaded (not the random ones the layers are built with), and the model starts as the frozen one."""
    model = build_tiny(tiny, "roberta_blocks", blocks_preset=preset).eval()
    weights = torch.load(tiny.model_file, weights_only=False)["model"]
    key = "encoder.sentence_encoder.layers.1.self_attn.v_proj.weight"
    attention = model.encoder.sentence_encoder.layers[1].self_attn
    assert torch.equal(attention.v_proj.weight, weights[key])
    if preset == "dora":
        assert torch.allclose(attention.lora_v.magnitude, weights[key].norm(dim=1), atol=1e-6)
    else:
        s = attention.lora_v.scaling
        u, sv, vh = torch.linalg.svd(weights[key].double(), full_matrices=False)
        r = attention.lora_v.rank
        best = (u[:, :r] * sv[:r]) @ vh[:r]
        assert torch.allclose((s * attention.lora_v.B @ attention.lora_v.A).double(), best, atol=1e-5)
    plain = build_tiny(tiny, "roberta_blocks", blocks_preset="lora").eval()  # B = 0: the frozen model
    plain.classification_heads.load_state_dict(model.classification_heads.state_dict())
    assert torch.allclose(logits(model), logits(plain), atol=1e-5)


def test_merging_dora_keeps_the_logits(tiny):
    """W' = m (W_0 + s B A) / ||W_0 + s B A||_c folded into W (bias kept): the same logits with the block gone."""
    from fairseq_idpg.blocks.lora import merge_lora

    model = build_tiny(tiny, "roberta_blocks", blocks_preset="dora").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.add_(torch.randn_like(p) * 0.3)
    before = logits(model)
    merge_lora(model)
    assert model.encoder.sentence_encoder.layers[0].self_attn.lora_q is None
    assert torch.allclose(logits(model), before, atol=1e-5)


# ------------------------------------------------------------------------------------------------------ counts
def test_dora_count_at_roberta_large_is_peft_s():
    """PEFT's trainable count of DoRA r = 16, alpha 32 on query and value of roberta-large (no head; built on
    the meta device) is the dora record's and the figure scripts/count_params.py checks ours against."""
    from fairseq_idpg.counts.blocks import PEFT_DORA_LARGE, count

    lora = peft.LoraConfig(r=16, lora_alpha=32, target_modules=["query", "value"], use_dora=True)
    trainable = peft_count_at_roberta_large(lora)
    assert trainable == PEFT_DORA_LARGE == count("dora", "roberta-large") == 24 * 2 * (2 * 1024 * 16 + 1024)
    assert count("pissa", "roberta-large") == count("lora", "roberta-large")
