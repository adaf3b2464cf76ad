"""roberta_idpg (IDPG): the generator against its equations (IDPG Eq. 2-4), zero generator weights =
the static prompts of roberta_prompt (prompt tuning, P-tuning v2), the multi-layer path against a
layer-by-layer reference, freezing, compact checkpoints, build-time errors. Tiny random backbones
(3 layers x 32, conftest)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import build_tiny
from test_prompt_insertion import PAD, PAIRS, batch, hand_built, slot_by_hand

from fairseq_idpg.data.task_info import TaskInfo
from fairseq_idpg.methods import METHODS
from fairseq_idpg.models import roberta_idpg
from fairseq_idpg.models.roberta_prompt import full_preset
from fairseq_idpg.modules.prompts.generator import PromptGenerator
from fairseq_idpg.modules.prompts.layer_biases import LayerBiases
from fairseq_idpg.tasks.model_protocol import SentenceCacheModel

LAYERS, DIM = 3, 32
IDPG = "roberta_idpg"


@pytest.fixture(scope="session")
def backbones(tiny_backbones):
    """Two tiny backbones of one shape (3 layers x 32), different weights."""
    return [tiny_backbones(layers=LAYERS, dim=DIM, seed=seed) for seed in (0, 1)]


def kron_weight(A, B):
    return sum(torch.kron(A[i], B[i]) for i in range(A.size(0)))  # Eq. 4, term by term


def generator_by_formula(gen, x, index):
    """G (IDPG Eq. 2-4, eval mode): (GELU(x W1 + b1) W2 + c_index).view(B, t, d)."""
    b = gen.biases  # c_0, then c_1..c_(K-1) in full or as U V
    c = b.first if index == 0 else (b.rest if b.rank == 0 else b.mix @ b.basis)[index - 1]
    if gen.kind == "dnn":
        W1, b1, W2 = gen.W1, gen.b1, gen.W2
    else:
        W1, b1, W2 = kron_weight(gen.phm1.A_set(), gen.phm1.B), gen.phm1.bias, kron_weight(gen.phm2.A_set(), gen.phm2.B)
    return (F.gelu(x @ W1 + b1) @ W2 + c).view(x.size(0), gen.t, gen.embed_dim)


# ---------------------------------------------------------------------- the generator
@pytest.mark.parametrize("kind,a_sets", [("phm", 1), ("phm", 2), ("dnn", 2)])
def test_generator_equals_its_equations(kind, a_sets):
    torch.manual_seed(0)
    n, d_in, d, t, m, K = 4, 12, 8, 3, 8, 4
    gen = PromptGenerator(d_in, d, t, m, kind, phm_n=n, phm_a_sets=a_sets, num_biases=K).double().eval()
    x = torch.randn(5, d_in, dtype=torch.float64)
    for k in range(K):
        assert torch.allclose(gen(x, k), generator_by_formula(gen, x, k), atol=1e-12)
    expected = {
        "phm": a_sets * n**3 + (d_in * m + m * t * d) // n + m + K * t * d,
        "dnn": d_in * m + m + m * t * d + K * t * d,
    }[kind]
    assert sum(p.numel() for p in gen.parameters()) == expected
    if kind == "phm":
        assert (gen.phm2.A_set() is gen.phm1.A) == (a_sets == 1)


def test_generator_dropout_is_on_input_and_hidden_only_in_training():
    gen = PromptGenerator(8, 8, 2, 16, "dnn", dropout=0.5)
    x = torch.randn(64, 8)
    gen.eval()
    assert torch.equal(gen.prepare(x), x) and torch.equal(gen(x), gen(x))
    gen.train()
    assert not torch.equal(gen.prepare(x), x) and not torch.equal(gen(x), gen(x))


def test_ablations_residual_and_layer_norm():
    torch.manual_seed(1)
    x = torch.randn(3, 8)
    plain = PromptGenerator(8, 8, 2, 16, "phm", phm_n=4).eval()
    for residual, norm in [(True, False), (False, True), (True, True)]:
        gen = PromptGenerator(8, 8, 2, 16, "phm", phm_n=4, residual=residual, layer_norm=norm).eval()
        gen.load_state_dict(plain.state_dict(), strict=False)
        g = plain(x)
        ln = lambda v: F.layer_norm(v, (8,))  # noqa: E731  (fresh LayerNorms: weight 1, bias 0)
        expected = {(True, False): g + x[:, None], (False, True): ln(g), (True, True): ln(ln(x)[:, None] + ln(g))}[
            residual, norm
        ]
        assert torch.allclose(gen(x), expected, atol=1e-6)


def test_low_rank_layer_biases():
    torch.manual_seed(2)
    b = LayerBiases(24, 5120, rank=4)
    c = b()
    assert c.shape == (24, 5120)
    assert torch.equal(c[0], b.first) and torch.allclose(c[1:], b.mix @ b.basis)
    assert sum(p.numel() for p in b.parameters()) == LayerBiases.num_parameters(24, 5120, 4) == 5120 + 23 * 4 + 4 * 5120
    # an entry of C = U V has the spread of a full bias at any rank: N(0, 0.02^2) by default, U(-0.5, 0.5) as asked
    assert abs(c[1:].std().item() - 0.02) < 0.002
    assert abs(c[0].std().item() - 0.02) < 0.002
    uniform = LayerBiases(24, 5120, rank=4, init="uniform")()
    assert abs(uniform[1:].std().item() - 12**-0.5) < 0.03 and uniform[0].abs().max() <= 0.5
    zero = LayerBiases(24, 5120, rank=4, init="zero")
    assert not zero().any() and zero.mix.std() > 0  # C = 0 at the start, and V still gets a gradient through U
    with pytest.raises(ValueError, match="a low rank needs per-layer biases"):
        LayerBiases(1, 10, rank=2)


# ---------------------------------------------------------------------- equivalences in the model
# every IDPG preset on RoBERTa's M(x) (GloVe's needs a vectors file) and the static prompt method of
# its length and depth: prompt-tuning-5 for S-IDPG, p-tuning-v2-5 for M-IDPG
ZERO_W = [
    (name, full_preset(roberta_idpg.DEFAULTS["idpg_prompt_length"], p["idpg_depth"] == "multi"))
    for name, p in roberta_idpg.RobertaIdpgModel.presets().items()
    if p.get("idpg_input", roberta_idpg.DEFAULTS["idpg_input"]) == "roberta"
]


@pytest.mark.parametrize("idpg,baseline", ZERO_W)
def test_zero_generator_weights_give_prompt_tuning_logits(backbones, idpg, baseline):
    """IDPG section 3.1: with W = 0 IDPG is prompt tuning (single layer) or P-tuning v2 (multi-layer)
    whose prompts are the biases c: the roberta_prompt model of that method, on the same backbone
    with the same head, gives exactly the same logits."""
    torch.manual_seed(3)
    model, reference = build_tiny(backbones[0], METHODS[idpg]), build_tiny(backbones[0], METHODS[baseline])
    src = batch(PAIRS)
    model.eval(), reference.eval()
    reference.classification_heads.load_state_dict(model.classification_heads.state_dict())
    with torch.no_grad():
        c = model.generator.biases().view(-1, model.args.idpg_prompt_length, DIM)  # [K, t, d], K = 1 or L
        assert reference.prompt.weight.shape == (c.shape if reference.deep else c.shape[1:])
        reference.prompt.weight.copy_(c if reference.deep else c[0])
        assert not torch.equal(
            model(src, classification_head_name="head")[0], reference(src, classification_head_name="head")[0]
        )
        for name, p in model.generator.named_parameters():
            if name.startswith(("W", "phm1.B", "phm2.B")):  # dense W1, W2 or the PHM B sets: W = 0
                p.zero_()
        assert torch.equal(
            model(src, classification_head_name="head")[0], reference(src, classification_head_name="head")[0]
        )


def idpg_prompt_of(model):
    """prompt(l, x, mx) -> P_l of layer l by IDPG's formula: from the <s> state x after layer l or M(x)."""
    a = model.args

    def gen_of(l):
        if a.idpg_sharing == "L":
            return model.generators[l], 0
        return model.generator, l if a.idpg_sharing == "M" else 0

    def prompt(l, x, mx):
        gen, index = gen_of(l)
        source = x if l > 0 and a.idpg_layer_input == "previous" else mx
        return generator_by_formula(gen, source[None], index)[0]

    return prompt


def static_prompt_of(model):
    """prompt(l, x, mx) -> P_l of a deep roberta_prompt model: its weight [L, t, d], row l."""
    return lambda l, x, mx: model.prompt.weight[l]


def reference_features(model, src, position, prompt_of):
    """The multi-layer additive scheme (IDPG section 3.2.2) one layer and one example at a time;
    ``prompt_of(l, x, mx)``: the [t, d] prompt of layer l for an example with <s> state x, M(x) mx."""
    enc = model.encoder.sentence_encoder
    L, t = len(enc.layers), model.num_inserted_tokens
    mx = enc(src)["encoder_out"][0][0]  # the unprompted input's final <s> state
    first = torch.stack([prompt_of(0, None, mx[i]) for i in range(src.size(0))])
    tokens, emb = hand_built(src, first, position, enc.embed_tokens)
    starts = [slot_by_hand(row, position) for row in src.tolist()]
    pad = tokens.eq(PAD)
    x, _ = enc.forward_embedding(tokens, emb)
    x = (x * (1 - pad.unsqueeze(-1).type_as(x))).transpose(0, 1)
    for l, layer in enumerate(enc.layers, start=1):
        out = layer(x, encoder_padding_mask=pad)
        x = (out[0] if isinstance(out, tuple) else out).clone()
        if l < L:
            for i, s in enumerate(starts):
                x[s : s + t, i] = x[s : s + t, i] + prompt_of(l, x[0, i], mx[i])
    return x.transpose(0, 1), tokens


@pytest.mark.parametrize(
    "arch,flags,position",
    [
        (IDPG, dict(idpg_preset="m-idpg-phm"), 1),  # previous-layer input, M version
        (IDPG, dict(idpg_preset="m-idpg-phm", idpg_layer_input="first"), 3),
        (IDPG, dict(idpg_preset="m-idpg-dnn", idpg_sharing="S"), 2),
        (IDPG, dict(idpg_preset="m-idpg-phm", idpg_sharing="L"), 0),
        (IDPG, dict(idpg_preset="m-idpg-phm", idpg_layer_bias_rank=1), 4),
        ("roberta_prompt", dict(prompt_preset="p-tuning-v2-5"), 1),  # the static prompts of P-tuning v2
    ],
)
def test_multi_layer_path_equals_layer_by_layer_reference(backbones, arch, flags, position):
    torch.manual_seed(4)
    model = build_tiny(backbones[0], arch, prompt_position=position, **flags).double().eval()
    prompt_of = idpg_prompt_of(model) if arch == IDPG else static_prompt_of(model)
    with torch.no_grad():
        trained = model.prompt if arch != IDPG else model.generator if hasattr(model, "generator") else model.generators
        for p in trained.parameters():
            p.mul_(8)  # large enough that the prompts depend visibly on their input
        src = batch(PAIRS)
        features, _ = model(src, features_only=True)
        reference, tokens = reference_features(model, src, position, prompt_of)
        keep = tokens.ne(PAD)
        assert torch.allclose(features[keep], reference[keep], atol=1e-9)
        if flags.get("idpg_preset") == "m-idpg-phm" and "idpg_layer_input" not in flags:
            model.args.idpg_layer_input = "first"  # the other input changes the result: the test can fail
            assert not torch.allclose(model(src, features_only=True)[0][keep], reference[keep], atol=1e-3)


def logits_and_grads(model, src):
    """(logits, {name: gradient of their sum}) of ``model`` on ``src``."""
    model.zero_grad(set_to_none=True)
    out = model(src, classification_head_name="head")[0]
    out.sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_step(a, b, atol=1e-6):
    """Two ``logits_and_grads`` agree: logits within ``atol``, the same gradients within ``atol`` (and 1e-5
    relative)."""
    assert torch.allclose(a[0], b[0], atol=atol, rtol=0)
    assert a[1].keys() == b[1].keys()
    for name, grad in b[1].items():
        assert torch.allclose(a[1][name], grad, atol=atol, rtol=1e-5), name


def test_slot_rows_and_biases_once_per_forward_keep_logits_and_gradients(backbones, monkeypatch):
    """M-IDPG finds the prompt slots' rows and unbinds its biases once per forward: fp32 logits and every
    trained gradient equal those of the per-layer computation (slot rows found after every layer, c_l indexed
    out of all biases in every layer) within 1e-6."""
    from fairseq_idpg.modules.prompts import encoder

    torch.manual_seed(4)
    model = build_tiny(backbones[0], IDPG, idpg_preset="m-idpg-phm").eval()
    src = batch(PAIRS)

    once = logits_and_grads(model, src)
    add_at_slots, generate = encoder.add_at_slots, PromptGenerator.forward
    monkeypatch.setattr(encoder, "add_at_slots", lambda x, slots, prompt, rows=None: add_at_slots(x, slots, prompt))
    monkeypatch.setattr(PromptGenerator, "forward", lambda gen, x, index=0, weights=None, biases=None: generate(
        gen, x, index, weights))  # fmt: skip
    assert_same_step(once, logits_and_grads(model, src))
    assert any("biases" in n for n in once[1])


def train_step(model, src, seed=5):
    """(logits, {name: gradient}) of a training-mode forward (dropout on, seeded) and the backward of a loss."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(src, classification_head_name="head")[0]
    (out * torch.arange(1, out.numel() + 1, dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    "flags",
    [
        dict(idpg_preset="m-idpg-phm"),  # previous-layer input, M version
        dict(idpg_preset="m-idpg-dnn"),
        dict(idpg_preset="m-idpg-phm", idpg_layer_input="first"),
        dict(idpg_preset="m-idpg-dnn", idpg_sharing="S"),
        dict(idpg_preset="m-idpg-phm", idpg_layer_bias_rank=1),
        dict(idpg_preset="m-idpg-phm", idpg_phm_a_sets=1),
    ],
)
def test_batched_generator_gradients_equal_the_generic_path(backbones, flags):
    """M-IDPG's prompts by ``layer_steps`` (the generator's weight gradients once per backward over every layer's
    rows, the prompts added in fewer operators) against the generic operators (each use differentiated by
    autograd): float64 logits and every gradient within 1e-12, in eval mode and in training mode (dropout on,
    the same seed: the same masks), with the weights scaled up so that the prompts depend visibly on their input."""
    torch.manual_seed(4)
    model = build_tiny(backbones[0], IDPG, **flags).double()
    with torch.no_grad():
        for p in model.generator.parameters():
            p.mul_(4)
    src = batch(PAIRS)
    assert model._batched_generator_gradients()
    for step in (logits_and_grads, train_step):
        model.eval()
        batched = step(model, src)
        model.batched_generator_gradients = False
        generic = step(model, src)
        model.batched_generator_gradients = True
        assert_same_step(batched, generic, atol=1e-12)
        assert {n for n in batched[1] if n.startswith("generator.")} == {
            n for n, p in model.generator.named_parameters(prefix="generator") if p.requires_grad
        }
    with torch.no_grad():
        assert not torch.equal(model(src, classification_head_name="head")[0], batched[0])  # eval != training


def test_batched_generator_gradients_only_where_they_apply(backbones):
    """The batched path needs one generator at position 0, under plain autograd or one vmap (fused members): the
    L version, another position, a single-layer model and ``torch.func.grad`` take the generic one."""
    assert build_tiny(backbones[0], IDPG)._batched_generator_gradients()
    for flags in (dict(idpg_sharing="L"), dict(prompt_position=1), dict(idpg_preset="s-idpg-phm")):
        assert not build_tiny(backbones[0], IDPG, **flags)._batched_generator_gradients(), flags
    model = build_tiny(backbones[0], IDPG)
    applies = lambda x: x + model._batched_generator_gradients()  # noqa: E731
    assert torch.func.vmap(applies)(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert torch.func.vmap(torch.func.vmap(applies))(torch.zeros(2, 2)).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert torch.func.grad(lambda x: applies(x).sum())(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert not torch.func.grad(lambda x: (x * model._batched_generator_gradients()).sum())(torch.ones(2)).any()


@pytest.mark.parametrize("flags", [dict(idpg_preset="m-idpg-phm"), dict(idpg_preset="m-idpg-dnn", idpg_sharing="S")])
def test_batched_generator_gradients_of_fused_members_equal_the_generic_path(backbones, flags):
    """Fused members (``fairseq_idpg/fused``: the model under vmap) by ``layer_steps``' vmap rules (every member
    as one run of the same operators) against the generic operators under vmap: float64 outputs and every
    member's gradients within 1e-12, dropout off and on (the same seed: the same masks)."""
    from fairseq_idpg.fused import StackedMembers

    torch.manual_seed(4)
    model = build_tiny(backbones[0], IDPG, **flags).double()
    src = batch(PAIRS)
    trained = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    members = [{n: v * (1 + i) + 0.1 * i * torch.randn_like(v) for n, v in trained.items()} for i in range(3)]

    def fused(train):
        model.train(train)
        stacked = StackedMembers(model, members=members)
        torch.manual_seed(5)
        out = stacked(src.expand(3, -1, -1), classification_head_name="head")
        (out * torch.arange(1, out.numel() + 1, dtype=out.dtype).view_as(out)).sum().backward()
        return out.detach(), {n: t.grad for n, t in zip(stacked.names, stacked.tensors, strict=True)}

    for train in (False, True):
        batched = fused(train)
        model.batched_generator_gradients = False
        generic = fused(train)
        model.batched_generator_gradients = True
        assert torch.allclose(batched[0], generic[0], atol=1e-12, rtol=0)
        for name, grad in generic[1].items():
            assert torch.allclose(batched[1][name], grad, atol=1e-12, rtol=1e-9), name


def test_batched_generator_gradients_sum_with_a_callers_own_addition(backbones):
    """A caller that adds P_l itself (``GeneratedPrompts(l, x)``, generic operators on the same weights) gets
    the generic path's gradients: those of its operators are summed with the tape's."""
    from fairseq_idpg.modules.prompts import encoder

    torch.manual_seed(4)
    model = build_tiny(backbones[0], IDPG).double().eval()
    src = batch(PAIRS)
    model.batched_generator_gradients = False
    generic = logits_and_grads(model, src)
    model.batched_generator_gradients = True
    features = encoder.prompted_features

    def without_add_after_bos(enc, src_tokens, prompt, position=0, layer_prompts=None, **kwargs):
        return features(enc, src_tokens, prompt, position, lambda l, x: layer_prompts(l, x), **kwargs)

    from fairseq_idpg.models import prompted_roberta

    prompted_roberta.prompted_features, saved = without_add_after_bos, prompted_roberta.prompted_features
    try:
        assert_same_step(logits_and_grads(model, src), generic, atol=1e-12)
    finally:
        prompted_roberta.prompted_features = saved


@pytest.mark.parametrize("arch,flags", [("roberta_prompt", dict(prompt_preset="prompt-tuning-5")), (IDPG, {})])
def test_prompt_models_attention_gives_fairseqs_logits_and_gradients(backbones, arch, flags):
    """The prompt models run the frozen attention as ``AugmentedSelfAttention`` (fused attention, the padding
    mask built once per forward): fp32 logits and gradients equal fairseq's attention's within 1e-6."""
    from fairseq.modules.multihead_attention import MultiheadAttention

    from fairseq_idpg.modules.attention.augmented_self_attention import AugmentedSelfAttention

    torch.manual_seed(4)
    model = build_tiny(backbones[0], arch, **flags).eval()
    layers = model.encoder.sentence_encoder.layers
    assert all(type(layer.self_attn) is AugmentedSelfAttention for layer in layers)
    src = batch(PAIRS)

    ours = logits_and_grads(model, src)
    for layer in layers:
        layer.self_attn.__class__ = MultiheadAttention
    assert_same_step(ours, logits_and_grads(model, src))


# ---------------------------------------------------------------------- training and freezing
def test_only_prompt_machinery_and_head_train(backbones):
    model = build_tiny(backbones[0], IDPG, idpg_preset="m-idpg-phm")
    model.train()
    logits, _ = model(batch(PAIRS), classification_head_name="head")
    logits.sum().backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {
        n for n, _ in model.named_parameters() if n.startswith(("generator.", "classification_heads."))
    }
    assert all(p.grad is None for n, p in model.named_parameters() if n in model.backbone_names)
    assert all(
        p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if n.startswith("generator.")
    )
    n, m, t, d, L = 16, 16, 5, DIM, LAYERS
    assert model.num_trainable_parameters() == 2 * n**3 + (d * m + m * t * d) // n + m + L * t * d


def test_mx_is_the_eval_mode_frozen_first_pass(backbones):
    model = build_tiny(backbones[0], IDPG, idpg_preset="s-idpg-phm", idpg_cache="off")
    src = batch(PAIRS)
    model.train()
    mx = model.sentence_representation(src)
    assert model.training and model.encoder.training  # switched back after the first pass
    assert not mx.requires_grad
    assert torch.equal(mx, model.sentence_representation(src))  # no dropout: deterministic
    model.eval()
    assert torch.equal(mx, model.encoder.extract_features(src)[0][:, 0])
    authors = build_tiny(backbones[0], IDPG, idpg_preset="s-idpg-phm", idpg_cache="off", idpg_mx_train_mode=True)
    authors.train()
    assert not torch.equal(authors.sentence_representation(src), authors.sentence_representation(src))  # dropout on


def test_compact_checkpoint_roundtrip_and_wrong_backbone(backbones):
    model = build_tiny(backbones[0], METHODS["m-idpg-phm"]).eval()  # the record saves compact checkpoints
    state = model.state_dict()
    assert not any(k.startswith("encoder.") for k in state)
    assert {k for k in state if k.startswith("generator.")} == {
        n for n, _ in model.generator.named_parameters(prefix="generator")
    }
    same = build_tiny(backbones[0], METHODS["m-idpg-phm"]).eval()
    same.load_state_dict(state)
    src = batch(PAIRS)
    assert torch.equal(model(src, classification_head_name="head")[0], same(src, classification_head_name="head")[0])
    other = build_tiny(backbones[1], METHODS["m-idpg-phm"])
    with pytest.raises(RuntimeError, match="trained on another backbone"):
        other.load_state_dict(state)


def test_supplementary_stage_trains_the_backbone(backbones):
    model = build_tiny(backbones[0], IDPG, idpg_preset="s-idpg-phm", idpg_train_backbone=True)
    assert all(p.requires_grad for p in model.parameters())
    assert isinstance(model, SentenceCacheModel) and not model.wants_sentence_cache()  # M(x) changes while it trains


# ---------------------------------------------------------------------- bad configurations
SINGLE_SENTENCES = TaskInfo(task="SST-2", num_classes=2, regression=False, pair=False, metric="accuracy", splits={})


BAD = [
    (
        dict(idpg_phm_n=3),
        "--idpg-phm-n 3 must divide the generator input size 32 .roberta., --idpg-hidden 16 and t.d = 5.32 = 160; "
        "valid here: 1, 2, 4, 8, 16",
    ),
    (dict(idpg_input="glove"), "--idpg-input glove needs GloVe vectors: give --idpg-glove-vectors PATH"),
    (dict(prompt_position=2), "--prompt-position 2 needs sentence pairs"),
    (dict(prompt_position=3), "--prompt-position 3 needs sentence pairs"),
    (dict(idpg_prompt_length=509), "--idpg-prompt-length 509: .* must fit --max-positions 512: use 1 to 508"),
    (dict(idpg_residual=True), "--idpg-residual / --idpg-layer-norm are the single-layer generator ablations"),
    (dict(idpg_layer_bias_rank=1, idpg_sharing="S"), "--idpg-layer-bias-rank 1 factorises the per-layer biases"),
    (dict(idpg_layer_bias_rank=2), "--idpg-layer-bias-rank must be between 1 and 1"),
    (dict(idpg_sharing="x"), "--idpg-sharing must be one of S, M, L, got 'X'"),
]


@pytest.mark.parametrize("flags,message", BAD)
def test_bad_configuration_fails_at_build_time(backbones, tmp_path, monkeypatch, flags, message):
    monkeypatch.setattr(roberta_idpg, "DEFAULT_GLOVE", tmp_path / "absent.txt")
    absent = tmp_path / "absent.pt"  # the checks come before the backbone is loaded
    with pytest.raises(ValueError, match=message):
        build_tiny(backbones[0], IDPG, info=SINGLE_SENTENCES, backbone_file=absent, **flags)


def test_glove_input_cannot_take_the_previous_layer_state(backbones, tmp_path):
    glove = tmp_path / "g.txt"
    glove.write_text("the " + " ".join(["0.5"] * 300) + "\n")
    flags = dict(backbone_file=tmp_path / "absent.pt", idpg_preset="m-idpg-phm-glove", idpg_glove_vectors=str(glove))
    message = "--idpg-layer-input previous feeds the 32-dim <s> state to a generator built for GloVe's 300-dim"
    with pytest.raises(ValueError, match=message):
        build_tiny(backbones[0], IDPG, idpg_layer_input="previous", **flags)
    with pytest.raises(ValueError, match="--idpg-phm-n 16 must divide the generator input size 300 .glove."):
        build_tiny(backbones[0], IDPG, idpg_phm_n=16, **flags)


def test_table2_counts_at_roberta_large():
    """scripts/count_params.py's IDPG rows: the real modules at roberta-large size equal the formulas
    of IDPG appendix A.1.2 (prompt tuning and P-tuning v2 from roberta_prompt's records)."""
    from fairseq_idpg.counts.prompts import low_rank_rows, table2_rows

    rows = table2_rows()
    assert all(ours == paper for _, ours, paper in rows + low_rank_rows())
    assert [ours for _, ours, _ in rows] == [5120, 137216, 122880, 107776, 1578240, 144704, 137232, 221200]
