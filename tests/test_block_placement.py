"""Where the blocks of ``--arch roberta_blocks`` sit inside a frozen encoder layer, checked against the layer
written out by hand from fairseq's weights (post-LN, as RoBERTa: ``normalize_before=False``):

    h = Dropout(W_o Attn(x) + b_o)                    attention sublayer (+ prefixes, LoRA, inducer inside)
    h = h + f_attn(h)                                  Houlsby adapter / Compacter: after the output projection
    y = LN_1(x + h)                                    and its dropout, before the residual and the LayerNorm
    g = Dropout(W_2 GELU(W_1 y + b_1) + b_2)
    g = g + f_ffn(g)                                   the same after the FFN (Houlsby et al. 2019, Figure 2)
    out = LN_2(y + g + s f_par(y))                     parallel FFN adapter beside the FFN (He et al. 2021;
                                                       MAM adapter, MAM inducer-tuning section 5.2), s = 2

with f(h) = s (W_up Dropout(ReLU(W_down h + b_d)) + b_u) (``BottleneckAdapter``) or PHM_up(GELU(PHM_down(h)))
(``CompacterAdapter``). Every other block enters at its slot's place (``modules/slots.py``) by its own formula in
``FORMULAS``, computed from its tensors by its paper's equation, never by its ``project()`` / forward: LoRA
W x + b + (alpha / r) B A x on q and v; (IA)^3 l_k * k, l_v * v, l_ff * GELU(W_1 y + b_1); the inducer's
lambda and value term (Eqs. 5-9); prefix tuning's attention over [P_k; K], [P_v; V]; BitFit's biases are the b
of every linear map and LayerNorm above. A registered block without a formula fails here (its module, and
``test_every_block_has_an_independent_formula``) with a message saying to add one.
Every trained tensor is set to random non-zero values first: the zero-initialised
up-projections would make every placement agree. The misplaced variants show the check can fail: moving the
attention adapter after the LayerNorm (in the reference or in the layer itself) no longer matches.

``reference_layer`` (also used by test_block_dropout.py) takes ``drop(t, p)``: identity in eval mode,
``F.dropout(t, p, True)`` in train mode, called in the order the modules draw their dropout masks.
"""

import copy
import functools
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from blocks_support import block_attachments, block_methods, method_slots, methods_with
from conftest import build_tiny

from fairseq_idpg.blocks import BLOCKS
from fairseq_idpg.modules.adapters.compacter import CompacterAdapter

LENGTHS = (7, 5, 3)  # one full row and two padded ones
ATOL = 1e-5


MISPLACEMENTS = {
    "attn-adapter-after-ln": "the attention adapter after LN_1: LN_1(x + h) + f(LN_1(x + h))",
    "ffn-adapter-after-ln": "the FFN adapter after LN_2",
    "parallel-adapter-after-ln": "the parallel adapter added after LN_2",
    "parallel-adapter-sequential": "the parallel adapter fed by the FFN output (sequential) instead of its input",
}
MISPLACEABLE = {  # the slots of the placement question (after the attention, beside or after the FFN): their moves
    "after_attention": ("attn-adapter-after-ln",),
    "after_ffn": ("ffn-adapter-after-ln",),
    "ffn": ("parallel-adapter-after-ln", "parallel-adapter-sequential"),
}
# every method of the family, from the records: the adapter-family methods of the placement question (a block in
# one of those slots) first, then every other (bitfit: no module, so fairseq's own layer, and the reference
# itself is checked)
ADAPTER_PRESETS = methods_with(slots=tuple(MISPLACEABLE))
OTHER_PRESETS = [name for name in block_methods() if name not in ADAPTER_PRESETS]


# ---------------------------------------------------------------------- inputs and models
@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread (on a busy machine, waking threads costs more than the maths)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def batch(dim, seed=1):
    """x [T, B, d] and its padding mask [B, T] (True at padding)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(max(LENGTHS), len(LENGTHS), dim, generator=g)
    pad = torch.arange(max(LENGTHS))[None, :] >= torch.tensor(LENGTHS)[:, None]
    return x, pad


def randomise_blocks(model, std=0.3, seed=0):
    """Every trained tensor but the head's to N(0, std^2): no zero up-projection hides a placement."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and not name.startswith("classification_heads."):
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


@pytest.fixture(scope="module")
def blocks_model(tiny):
    """``make(preset)``: the tiny model with that preset, its blocks randomised (built once per module; the
    tests here only read it)."""
    made = {}

    def make(preset):
        if preset not in made:
            made[preset] = randomise_blocks(build_tiny(tiny, "roberta_blocks", blocks_preset=preset)).eval()
        return made[preset]

    return make


def no_drop(t, p):
    return t


def train_drop(t, p):
    return F.dropout(t, p, True)


# ---------------------------------------------------------------------- the layer by hand
def linear(t, module):
    return t @ module.weight.T + module.bias


def layer_norm(t, module):
    mean = t.mean(-1, keepdim=True)
    var = ((t - mean) ** 2).mean(-1, keepdim=True)
    return (t - mean) / torch.sqrt(var + module.eps) * module.weight + module.bias


def split_heads(t, heads):
    """[T, B, d] -> [B, H, T, d_h]."""
    length, bsz, dim = t.shape
    return t.reshape(length, bsz, heads, dim // heads).permute(1, 2, 0, 3)


def reference_lora(lora, x, drop, misplace):
    """(alpha / r) Dropout(x) A^T B^T (Hu et al. 2021): the dropout on the input; r = the rows of A."""
    scaling = lora.alpha / lora.A.size(0)
    if "lora-dropout-on-output" in misplace:
        return drop(x @ lora.A.T @ lora.B.T * scaling, lora.dropout.p)
    return drop(x, lora.dropout.p) @ lora.A.T @ lora.B.T * scaling


def reference_prefixes(encoder, layer):
    """Layer ``layer``'s key and value prefixes [l, d]: P = tanh(E W_1 + b_1) W_2 + b_2, P.view(l, L, 2, d)."""
    if encoder.stored:
        return encoder.kv[layer, 0], encoder.kv[layer, 1]
    hidden = torch.tanh(linear(encoder.embedding.weight, encoder.hidden))
    P = linear(hidden, encoder.output).view(encoder.length, encoder.num_layers, 2, encoder.dim)
    return P[:, layer, 0], P[:, layer, 1]


def slot_blocks(host, slot):
    """(name, block) of the blocks attached to ``slot`` of ``host``, in order (none in fairseq's own modules)."""
    names = getattr(host, "slots", {}).get(slot, [])
    return [(name, getattr(host, name)) for name in names if getattr(host, name, None) is not None]


def reference_inducer(ind, q, ctx, scores, raw, drop=no_drop, misplace=()):
    """Inducer-tuning Eqs. 5-9 (the module docstring of modules/attention/inducer.py): the heads' context and the
    term added to the output projection, (ctx, Delta), from the queries q [B, H, T, d_h], the heads' context, the
    masked and raw scores."""
    k_ind = q
    if ind.key_rank:  # k~ = q + tanh(q A_k + a_k) B_k + b_k (Eq. 5)
        hidden = torch.tanh(torch.einsum("bhtd,hdr->bhtr", q, ind.key_A) + ind.key_a[:, None])
        k_ind = q + torch.einsum("bhtr,hrd->bhtd", hidden, ind.key_B) + ind.key_b[:, None]
    s = (q * k_ind).sum(-1) / math.sqrt(q.size(-1))  # [B, H, T]
    lam = torch.sigmoid(s - torch.logsumexp(scores if ind.mask_lambda else raw, dim=-1))  # Eq. 7
    moved = "lambda-dropout-on-output" in misplace
    if not moved:
        lam = drop(lam, ind.lambda_dropout)
    z = torch.tanh(torch.einsum("bhtd,hdr->bhtr", q, ind.value_A) + ind.value_a[:, None])
    gate = (1 - lam).unsqueeze(-1) if ind.output == "gated" else 1.0
    if ind.extend_value:  # Delta = sum_h lambda_h z_h B_v[h] + b_v, in the output space
        delta = torch.einsum("bhtr,hrd->tbd", lam.unsqueeze(-1) * z, ind.value_B) + ind.value_b
        return ctx * gate, drop(delta, ind.lambda_dropout) if moved else delta
    # v~_h = z_h B_v[h] + b_v[h] inside each head
    term = lam.unsqueeze(-1) * (torch.einsum("bhtr,hrd->bhtd", z, ind.value_B) + ind.value_b[:, None])
    return ctx * gate + (drop(term, ind.lambda_dropout) if moved else term), None


def reference_projection(lora, x, y, drop=no_drop, misplace=()):
    """LoRA on W_q / W_v: W x + b + (alpha / r) B A x. Under PiSSA (Meng et al. 2024) the frozen part is the
    residual W_0 = W - s B_0 A_0 of the weight's top-r singular factors (B_0, A_0: the block's frozen start, checked
    against an SVD of W in tests/test_lora.py). DoRA
    (Liu et al. 2024, Eq. 5): x W'^T + b with W' = m (W_0 + s B A) / ||W_0 + s B A||_c, the norm over each output
    feature's row; in training with dropout, PEFT's use_dora form W_0 x + b + (k - 1) W_0 x_d + k s B A x_d, with
    k = m / ||W_0 + s B A||_c and x_d = Dropout(x)."""
    scaling = lora.alpha / lora.A.size(0)
    principal = scaling * lora.B0 @ lora.A0 if lora.init == "pissa" else 0.0  # s B_0 A_0
    start = x @ principal.T if lora.init == "pissa" else 0.0
    if not hasattr(lora, "magnitude"):
        return y - start + reference_lora(lora, x, drop, misplace)
    residual = lora.base.weight - principal
    direction = residual + scaling * lora.B @ lora.A
    k = lora.magnitude / direction.norm(dim=1)
    if drop is no_drop:
        return x @ (k[:, None] * direction).T + lora.base.bias
    x_d = drop(x, lora.dropout.p)
    return y - start + (k - 1) * (x_d @ residual.T) + k * (x_d @ lora.A.T @ lora.B.T * scaling)


def reference_vera(vera, x, y, drop=no_drop, misplace=()):
    """VeRA (Kopiczko et al. 2024, Eq. 2) on W_q / W_v: W x + b + Lambda_b B Lambda_d A Dropout(x), the frozen A, B
    the model's one shared pair."""
    A, B = vera.shared.A, vera.shared.B
    return y + drop(x, vera.dropout.p) @ (torch.diag(vera.b) @ B @ torch.diag(vera.d) @ A).T


def reference_scale(scale, t, drop=no_drop, misplace=()):
    """(IA)^3 (Liu et al. 2022): l_ff * h elementwise, h the FFN's inner activations GELU(W_1 y + b_1)."""
    return t * scale.l


def reference_scaled_projection(scale, x, y, drop=no_drop, misplace=()):
    """(IA)^3 on the keys and values: l_k * (W_k x + b_k), l_v * (W_v x + b_v)."""
    return y * scale.l


def reference_attention(attn, x, pad, drop=no_drop, misplace=()):
    """The attention sublayer W_o Attn(x) + b_o [T, B, d], with whatever blocks ``attn`` carries."""
    length, bsz, dim = x.shape
    heads = attn.num_heads
    head_dim = dim // heads
    projected = []
    for slot in "qkv":  # drawn in the module's order: LoRA q, then LoRA v
        y = linear(x, getattr(attn, f"{slot}_proj"))
        for name, block in slot_blocks(attn, slot):
            y = formula(slot, name)(block, x, y, drop, misplace)
        projected.append(y)
    q, k, v = (split_heads(t, heads) for t in projected)
    key_pad = pad
    for name, block in slot_blocks(attn, "keys_values"):
        pk, pv = formula("keys_values", name)(block, attn.layer_index)
        pk, pv = (split_heads(p[:, None].expand(-1, bsz, -1), heads) for p in (pk, pv))  # [B, H, l, d_h]
        k, v = torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)
        key_pad = torch.cat([key_pad.new_zeros(bsz, pk.size(2)), key_pad], dim=1)  # prefixes are never masked
    raw = q @ k.transpose(-1, -2) / math.sqrt(head_dim)  # [B, H, T, S]
    scores = raw.masked_fill(key_pad[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    ctx = drop(probs, attn.dropout_module.p) @ v  # [B, H, T, d_h]
    delta = 0.0
    for name, block in slot_blocks(attn, "attention_output"):
        ctx, extra = formula("attention_output", name)(block, q, ctx, scores, raw, drop, misplace)
        delta = delta if extra is None else delta + extra
    return linear(ctx.permute(2, 0, 1, 3).reshape(length, bsz, dim), attn.out_proj) + delta


def reference_adapter(adapter, h, drop=no_drop, misplace=()):
    """f(h): s (W_up Dropout(ReLU(W_down h + b_d)) + b_u), or Compacter's PHM_up(Dropout(GELU(PHM_down h)))."""
    if isinstance(adapter, CompacterAdapter):  # W = sum_i kron(A_i, s_i t_i), row-vector convention
        down, up = (
            sum(torch.kron(adapter.A[i], m.s[i] @ m.t[i]) for i in range(m.n)) for m in (adapter.down, adapter.up)
        )
        hidden = F.gelu(h @ down + adapter.down.bias)
        return drop(hidden, adapter.dropout.p) @ up + adapter.up.bias
    hidden = F.relu(h @ adapter.down.weight.T + adapter.down.bias)
    if "adapter-dropout-on-output" in misplace:
        return drop(adapter.scale * (hidden @ adapter.up.weight.T + adapter.up.bias), adapter.dropout.p)
    return adapter.scale * (drop(hidden, adapter.dropout.p) @ adapter.up.weight.T + adapter.up.bias)


def reference_loreft(loreft, h, pad, drop=no_drop, misplace=()):
    """ReFT Eq. 2 at the first n and last m real tokens of each row (pad: [B, T], True at padding; real tokens
    first, as here): Dropout(h + R^T (W h + b - R h)) there, h elsewhere; R through its parametrisation."""
    R, W, b = loreft.R, loreft.source.weight, loreft.source.bias
    edited = drop(h + (h @ W.T + b - h @ R.T) @ R, loreft.dropout.p)
    lengths = (~pad).sum(1)  # [B]
    index = torch.arange(h.shape[0])[:, None]  # [T, 1]
    chosen = (index < loreft.first) | ((index >= lengths - loreft.last) & (index < lengths))
    return torch.where(chosen[..., None], edited, h)


# The independent formula of every registered block, in the convention of the slot it attaches to
# (modules/slots.py), by the attribute name of its module in the layer (as the block's ``layer_blocks`` names it):
#   q, k, v:            f(block, x, y, drop, misplace) -> y, the projection's output (y = W x + b)
#   keys_values:        f(block, layer index) -> P_k, P_v [l, d], prepended to the keys and values (never masked)
#   attention_output:   f(block, q, ctx, scores, raw scores, drop, misplace) -> ctx, Delta (or None)
#   after_attention,
#   after_ffn, ffn:     f(block, h, drop, misplace) -> f(h), added (h + f(h); beside the FFN: out + f(x))
#   ffn_inner:          f(block, h, drop, misplace) -> h, the FFN's inner activations
#   layer_output:       f(block, h, pad, drop, misplace) -> h, the layer's output (after its final LayerNorm)
# each computed from the block's tensors by its paper's equation, never by the block's own forward. A new block
# adds its equation here (test_every_block_has_an_independent_formula fails until it does; docs/blocks.md).
FORMULAS = {
    "lora": {"lora_q": reference_projection, "lora_v": reference_projection},
    "loreft": {"loreft": reference_loreft},
    "ia3": {"ia3_k": reference_scaled_projection, "ia3_v": reference_scaled_projection, "ia3_ff": reference_scale},
    "prefix": {"prefix": reference_prefixes},
    "vera": {"vera_q": reference_vera, "vera_v": reference_vera},
    "inducer": {"inducer": reference_inducer},
    "adapter": {"attn_adapter": reference_adapter, "ffn_adapter": reference_adapter},
    "ffn_adapter": {"parallel_adapter": reference_adapter},
    # no module: BitFit trains the backbone's biases, the b of every ``linear`` and ``layer_norm`` of the reference
    "bitfit": {},
}
FORMULA_OF = {name: formula for formulas in FORMULAS.values() for name, formula in formulas.items()}


def formula(slot, name):
    """The formula of the module attached to ``slot`` as ``name``; a failure saying to add one if none."""
    if name not in FORMULA_OF:
        pytest.fail(
            f"no independent formula for the block module {name!r} in slot {slot!r}: add its paper's equation to "
            f"FORMULAS in tests/test_block_placement.py (docs/blocks.md: tests)"
        )
    return FORMULA_OF[name]


def by_formulas(layer, slot, t, combine):
    """``t`` through the blocks of ``layer``'s ``slot`` by their formulas, ``t = combine(t, formula, block)`` for
    each, but the adapters ``reference_layer`` writes out itself (to move them: ``MISPLACEMENTS``)."""
    for name, block in slot_blocks(layer, slot):
        if name not in ("attn_adapter", "ffn_adapter", "parallel_adapter"):
            t = combine(t, formula(slot, name), block)
    return t


def reference_layer(layer, x, pad, drop=no_drop, misplace=()):
    """The post-LN encoder layer by hand (module docstring), [T, B, d] -> [T, B, d]; ``misplace``: names of
    ``MISPLACEMENTS`` (and of the dropout misplacements of test_block_dropout.py) to compute instead."""
    assert not layer.normalize_before  # RoBERTa's post-LN layer
    attn_adapter = getattr(layer, "attn_adapter", None)
    ffn_adapter = getattr(layer, "ffn_adapter", None)
    parallel = getattr(layer, "parallel_adapter", None)
    p = layer.dropout_module.p

    others = functools.partial(by_formulas, layer)
    added = lambda t, f, block: t + f(block, t, drop, misplace)  # noqa: E731

    def sequential(adapter, t, slot):  # the sublayer's dropout, then h + f(h)
        if adapter is None:
            return others(slot, drop(t, p), added)
        if "adapter-before-dropout" in misplace:
            return drop(t + reference_adapter(adapter, t, drop, misplace), p)
        t = drop(t, p)
        return others(slot, t + reference_adapter(adapter, t, drop, misplace), added)

    h = reference_attention(layer.self_attn, x, pad, drop, misplace)
    after_ln = "attn-adapter-after-ln" in misplace
    y = layer_norm(x + sequential(None if after_ln else attn_adapter, h, "after_attention"), layer.self_attn_layer_norm)
    if after_ln and attn_adapter is not None:
        y = y + reference_adapter(attn_adapter, y, drop, misplace)

    beside = parallel is not None and "parallel-adapter-sequential" not in misplace
    f_par = reference_adapter(parallel, y, drop, misplace) if beside else None  # drawn before the FFN's masks
    f_par = others("ffn", f_par, lambda f, fn, block: fn(block, y, drop, misplace) + (0.0 if f is None else f))
    g = drop(F.gelu(linear(y, layer.fc1)), layer.activation_dropout_module.p)
    g = others("ffn_inner", g, lambda g, fn, block: fn(block, g, drop, misplace))  # inner activations, before fc2
    after_ln = "ffn-adapter-after-ln" in misplace
    g = sequential(None if after_ln else ffn_adapter, linear(g, layer.fc2), "after_ffn")
    if parallel is not None and not beside:
        g = g + reference_adapter(parallel, g, drop, misplace)
    par_after_ln = "parallel-adapter-after-ln" in misplace
    if f_par is not None and not par_after_ln:
        g = g + f_par
    out = layer_norm(y + g, layer.final_layer_norm)
    if after_ln and ffn_adapter is not None:
        out = out + reference_adapter(ffn_adapter, out, drop, misplace)
    if f_par is not None and par_after_ln:
        out = out + f_par
    return others("layer_output", out, lambda t, f, block: f(block, t, pad, drop, misplace))


def max_diff(a, b):
    return (a - b).abs().max().item()


# ---------------------------------------------------------------------- the tests
@pytest.mark.parametrize("preset", ADAPTER_PRESETS + OTHER_PRESETS)
def test_each_layer_equals_the_hand_built_layer(tiny, blocks_model, preset):
    model = blocks_model(preset)
    x, pad = batch(tiny.dim)
    with torch.no_grad():
        for i, layer in enumerate(model.encoder.sentence_encoder.layers):
            out, expected = layer(x, pad), reference_layer(layer, x, pad)
            assert out.shape == x.shape
            assert torch.allclose(out, expected, atol=ATOL), f"layer {i}: max |diff| {max_diff(out, expected):.2e}"


@pytest.mark.parametrize("block", BLOCKS)
def test_every_block_has_an_independent_formula(blocks_model, block):
    """Every registered block has its equation in ``FORMULAS``, for each module it attaches (every record of it)."""
    assert block in FORMULAS, (
        f"block {block!r} has no independent formula: add its paper's equation to FORMULAS in "
        "tests/test_block_placement.py (docs/blocks.md: tests); its own forward is no reference"
    )
    for preset in methods_with(block):
        model = blocks_model(preset)
        names = {name for (_, name), owner in block_attachments(model).items() if owner == block}
        assert names <= set(FORMULAS[block]), f"{preset}: no formula for {sorted(names - set(FORMULAS[block]))}"


def test_the_blocks_sit_in_the_slots_the_presets_name(blocks_model):
    slots = {}
    for preset in ADAPTER_PRESETS:
        layer = blocks_model(preset).encoder.sentence_encoder.layers[0]
        slots[preset] = {
            name: type(getattr(layer, name)).__name__ if getattr(layer, name, None) is not None else None
            for name in ("attn_adapter", "ffn_adapter", "parallel_adapter")
        }
    houlsby = dict(attn_adapter="BottleneckAdapter", ffn_adapter="BottleneckAdapter", parallel_adapter=None)
    compacter = dict(attn_adapter="CompacterAdapter", ffn_adapter="CompacterAdapter", parallel_adapter=None)
    mam = dict(attn_adapter=None, ffn_adapter=None, parallel_adapter="BottleneckAdapter")
    assert slots == {"houlsby-adapter": houlsby, "compacter": compacter, "mam-adapter": mam, "mam-inducer": mam}


@pytest.mark.parametrize(
    "preset,misplace",
    [(p, m) for p in ADAPTER_PRESETS for slot, moves in MISPLACEABLE.items() if slot in method_slots(p) for m in moves],
)
def test_a_misplaced_adapter_does_not_match(tiny, blocks_model, preset, misplace):
    """The comparison above can fail: each placement of MISPLACEMENTS gives another output."""
    model = blocks_model(preset)
    x, pad = batch(tiny.dim)
    with torch.no_grad():
        for layer in model.encoder.sentence_encoder.layers:
            out = layer(x, pad)
            assert torch.allclose(out, reference_layer(layer, x, pad), atol=ATOL)
            assert max_diff(out, reference_layer(layer, x, pad, misplace={misplace})) > 100 * ATOL, MISPLACEMENTS[
                misplace
            ]


class AddAfter(nn.Module):
    """``y = norm(t); y + adapter(y)``: put in place of a LayerNorm, it moves an adapter after it."""

    def __init__(self, norm, adapter):
        super().__init__()
        self.norm, self.adapter = norm, adapter

    def forward(self, t):
        t = self.norm(t)
        return t + self.adapter(t)


@pytest.mark.parametrize("preset", methods_with(slots=("after_attention",)))  # an attn_adapter to move
def test_moving_the_attention_adapter_after_the_layernorm_in_the_layer_is_caught(tiny, blocks_model, preset):
    """The mutation of the question (the layer's attention adapter moved after LN_1) fails the comparison."""
    model = blocks_model(preset)
    x, pad = batch(tiny.dim)
    with torch.no_grad():
        for layer in model.encoder.sentence_encoder.layers:
            moved = copy.deepcopy(layer)
            moved.self_attn_layer_norm = AddAfter(moved.self_attn_layer_norm, moved.attn_adapter)
            moved.attn_adapter = None
            out = moved(x, pad)
            assert not torch.allclose(out, reference_layer(layer, x, pad), atol=ATOL)
            assert torch.allclose(out, reference_layer(layer, x, pad, misplace={"attn-adapter-after-ln"}), atol=ATOL)
