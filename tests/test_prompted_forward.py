"""The prompted forward and the frozen encoder's embeddings in fewer operators (docs/launches.md) compute what they
replaced: fp32 logits and every trained gradient of a training step (dropout on, the same seed) are equal, for
every frozen-backbone method record, at every prompt position.

What they replaced is kept here as the reference: the prompt inserted by an index and gathers at every position
(``insert_prompts``), fairseq's ``forward_embedding`` on the tokens (``make_positions``, a multiply by
``embed_scale``), the padded rows zeroed by a multiply, and deep prompts added by ``add_at_slots``. M-IDPG's
prompts at position 0 by ``layer_steps`` (its generator's weight gradients once per backward: other sums) are
equal within 1e-6, and exactly with its generic operators."""

import contextlib

import pytest
import torch
from conftest import build_record
from test_prompt_insertion import PAIRS, batch

from fairseq_idpg.methods import METHODS
from fairseq_idpg.models import frozen_roberta, prompted_roberta
from fairseq_idpg.modules import frozen_encoder
from fairseq_idpg.modules.prompts.encoder import add_at_slots, slot_rows
from fairseq_idpg.modules.prompts.insertion import insert_prompts, insertion_index

FROZEN = sorted(name for name, m in METHODS.items() if m.frozen_backbone)
PROMPTED = {name for name in FROZEN if issubclass(METHODS[name].model_class, prompted_roberta.PromptedRobertaModel)}


def replaced_encode_layers(enc, tokens, embeddings=None, after_layer=None, all_hiddens=False):
    """``frozen_encoder.encode_layers`` as it was: fairseq's ``forward_embedding``, a multiply zeroes padding (the
    layers after it are run as they were and are)."""
    padding_mask = tokens.eq(enc.padding_idx)
    has_pads = getattr(enc, frozen_encoder.ASSUME_PADS, False) or bool(padding_mask.any())
    x, _ = enc.forward_embedding(tokens, embeddings)
    if has_pads:
        x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
    return frozen_encoder.run_layers(enc, x, padding_mask if has_pads else None, after_layer, all_hiddens)


def replaced_prompted_features(enc, src_tokens, prompt, position=0, layer_prompts=None, filler_idx=None):
    """``prompts.encoder.prompted_features`` as it was: the index and gathers at every position."""
    pad = enc.padding_idx
    filler = pad + 2 if filler_idx is None else filler_idx
    index = insertion_index(src_tokens, position, pad, enc.dictionary.eos())
    tokens, embeddings, slots = insert_prompts(src_tokens, enc.embed_tokens(src_tokens), prompt, index, pad, filler)
    after_layer = None
    if layer_prompts is not None:
        rows = slot_rows(slots, prompt.size(-2))

        def after_layer(l, x):
            p = layer_prompts(l, x)
            return x if p is None else add_at_slots(x, slots, p, rows)

    features, _ = replaced_encode_layers(enc, tokens, embeddings, after_layer=after_layer)
    return features, slots


def step(model, src, seed=7):
    """(fp32 logits, {name: gradient}, prompt slots) of a training step's forward and backward (dropout on)."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    logits, extra = model(src, classification_head_name="head")
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 1])).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads, extra.get("prompt_slots")


def assert_equal_steps(new, old, atol=0.0):
    """Equal (``atol`` 0) or within ``atol`` (and 1e-5 relative for the gradients)."""
    same = torch.equal if not atol else lambda a, b: torch.allclose(a, b, atol=atol, rtol=1e-5)
    assert same(new[0], old[0])
    assert new[1].keys() == old[1].keys() and new[1]
    for name, grad in old[1].items():
        assert same(new[1][name], grad), name
    if old[2] is not None:
        assert torch.equal(new[2], old[2])


def replaced_steps(model, src, monkeypatch, encode=True):
    """``step`` with the replaced forward; M-IDPG's generator by the generic operators (``layer_steps``' batched
    weight gradients are an addition of this forward: ``equal_steps``)."""
    with monkeypatch.context() as m:
        m.setattr(prompted_roberta, "prompted_features", replaced_prompted_features)
        if encode:
            m.setattr(frozen_roberta, "encode_layers", replaced_encode_layers)
        if hasattr(model, "batched_generator_gradients"):
            m.setattr(model, "batched_generator_gradients", False)
        return step(model, src)


def assert_equal_to_replaced(model, src, monkeypatch, encode=True):
    """The forward equals the replaced one exactly; with M-IDPG's batched generator gradients (``layer_steps``:
    other sums, the same maths) within 1e-6 in fp32, and exactly without them."""
    old = replaced_steps(model, src, monkeypatch, encode)
    batched = getattr(model, "_batched_generator_gradients", lambda: False)()
    assert_equal_steps(step(model, src), old, atol=1e-6 if batched else 0.0)
    if batched:
        with monkeypatch.context() as m:
            m.setattr(model, "batched_generator_gradients", False)
            assert_equal_steps(step(model, src), old)


@pytest.mark.parametrize("name", FROZEN)
def test_equal_to_the_replaced_forward(name, tiny4, method_files, monkeypatch):
    model = build_record(METHODS[name], tiny4, method_files, seed=0).float()
    src = batch(PAIRS)  # pairs, one row padded by 4 and one by 2
    positions = (0, 1, 2, 3, 4) if name in PROMPTED else (None,)
    for position in positions:
        if position is not None:
            model.prompt_position = position
        assert_equal_to_replaced(model, src, monkeypatch)


def test_equal_without_padding_and_under_pads_known(tiny4, method_files, monkeypatch):
    """A batch without padding (no mask anywhere), and every batch masked (``pads_known``, as fused members)."""
    model = build_record(METHODS["m-idpg-phm"], tiny4, method_files, seed=0).float()
    unpadded = torch.tensor([[0, 11, 12, 2, 2, 21, 2], [0, 13, 2, 2, 22, 23, 2], [0, 14, 15, 16, 2, 2, 2]])
    for src, known in ((unpadded, False), (unpadded, True), (batch(PAIRS), True)):
        with frozen_encoder.pads_known(model.encoder.sentence_encoder) if known else contextlib.nullcontext():
            assert_equal_to_replaced(model, src, monkeypatch, encode=False)


def test_positions_past_the_table_fall_back_to_fairseqs(tiny4):
    """Rows padded past the learned positions' table: padded rows take fairseq's padding row, not an index past
    the table, and the features equal fairseq's encoder's on the same tokens."""
    from conftest import build_tiny

    enc = build_tiny(tiny4, "roberta_prompt").encoder.sentence_encoder.eval()
    table = enc.embed_positions.num_embeddings - enc.padding_idx - 1  # positions the table holds
    src = torch.full((2, table + 1), enc.padding_idx)  # one column more: padding in every row
    src[0, :table], src[1, :4] = torch.randint(4, 30, (table,)), torch.tensor([0, 11, 12, 2])
    src[0, 0], src[0, table - 1] = 0, 2
    emb = enc.embed_tokens(src)
    with torch.no_grad():
        ours, _ = frozen_encoder.encode_layers(enc, None, emb, padding_mask=src.eq(enc.padding_idx))
        theirs, _ = replaced_encode_layers(enc, src)
    assert torch.equal(ours, theirs)
