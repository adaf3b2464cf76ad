"""Prompt positions 0-4 (IDPG appendix A.4/A.5, Figure 5): the vectorised insertion and the
prompted encoder equal a hand-built embedded sequence, for pairs and single sentences, with
padding, for a shared [t, C] prompt and per-example [B, t, C] prompts."""

import pytest
import torch
from conftest import build_tiny

from fairseq_idpg.modules.prompts.encoder import prompted_features
from fairseq_idpg.modules.prompts.insertion import check_position, insert_prompts, insertion_index

BOS, PAD, EOS, FILLER = 0, 1, 2, 3
PAIRS = [([11, 12, 13], [21, 22]), ([14], [23, 24, 25, 26]), ([15, 16], [])]
SINGLES = [[11, 12, 13, 14], [15], []]


def batch(examples):
    """Right-padded ``<s> A </s></s> B </s>`` (pairs) or ``<s> A </s>`` rows, as the task builds them."""
    rows = [[BOS, *ex[0], EOS, EOS, *ex[1], EOS] if isinstance(ex, tuple) else [BOS, *ex, EOS] for ex in examples]
    width = max(map(len, rows))
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


def slot_by_hand(row, position):
    """Where the prompt starts, read off the definition (Figure 5) one token at a time."""
    tokens = [x for x in row if x != PAD]
    eos = [i for i, x in enumerate(tokens) if x == EOS]
    return {0: 1, 1: eos[0], 2: eos[0] + 2, 3: eos[-1], 4: len(tokens)}[position]


def hand_built(src_tokens, prompts, position, embed):
    """Tokens and embeddings built example by example with torch.cat, then right-padded."""
    rows_tok, rows_emb = [], []
    for i, row in enumerate(src_tokens.tolist()):
        real = [x for x in row if x != PAD]
        s = slot_by_hand(row, position)
        p = prompts[i] if prompts.dim() == 3 else prompts
        tokens = real[:s] + [FILLER] * p.size(0) + real[s:]
        ids = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
        emb = torch.cat([embed(ids(real[:s])), p, embed(ids(real[s:]))])
        rows_tok.append(tokens)
        rows_emb.append(emb)
    width = max(map(len, rows_tok))
    tokens = torch.tensor([r + [PAD] * (width - len(r)) for r in rows_tok])
    emb = torch.stack([torch.cat([e, embed(torch.full((width - len(e),), PAD))]) for e in rows_emb])
    return tokens, emb


CASES = [(PAIRS, p) for p in range(5)] + [(SINGLES, p) for p in (0, 1, 4)]


@pytest.mark.parametrize("examples,position", CASES)
@pytest.mark.parametrize("per_example", [False, True])
def test_insert_prompts_equals_hand_built_sequence(examples, position, per_example):
    torch.manual_seed(position)
    src = batch(examples)
    embed = torch.nn.Embedding(40, 6, padding_idx=PAD)
    prompts = torch.randn(len(examples), 3, 6) if per_example else torch.randn(3, 6)
    index = insertion_index(src, position, PAD, EOS)
    tokens, emb, slots = insert_prompts(src, embed(src), prompts, index, PAD, FILLER)
    ref_tokens, ref_emb = hand_built(src, prompts, position, embed)
    assert torch.equal(tokens, ref_tokens)
    assert torch.equal(emb, ref_emb)
    assert torch.equal(slots, ref_tokens.eq(FILLER))


@pytest.fixture(scope="module")
def encoder(tiny):
    """fairseq's encoder of the tiny random RoBERTa (2 layers x 32, conftest), in eval mode."""
    return build_tiny(tiny, "roberta_prompt").encoder.sentence_encoder.eval()


@pytest.mark.parametrize("examples,position", CASES)
def test_prompted_encoder_equals_encoder_on_hand_built_embeddings(encoder, examples, position):
    """prompted_features == fairseq's own encoder run on the hand-built sequence: the prompt takes
    ordinary consecutive positions and is attended to (padding mask 0 at the slots)."""
    torch.manual_seed(10 + position)
    src = batch(examples)
    prompts = torch.randn(len(examples), 4, 32)
    with torch.no_grad():
        features, slots = prompted_features(encoder, src, prompts, position, filler_idx=FILLER)
        tokens, emb = hand_built(src, prompts, position, encoder.embed_tokens)
        reference = encoder(tokens, token_embeddings=emb)["encoder_out"][0].transpose(0, 1)
    keep = tokens.ne(PAD)  # padded rows are garbage in both (masked out of attention)
    assert torch.allclose(features[keep], reference[keep], atol=1e-5)
    assert torch.equal(slots, tokens.eq(FILLER))
    assert not torch.allclose(features[:, 0], encoder(src)["encoder_out"][0][0], atol=1e-3)  # the prompt matters


def test_pair_positions_are_refused_on_single_sentences():
    for position in (2, 3):
        with pytest.raises(ValueError, match=f"--prompt-position {position} needs sentence pairs"):
            check_position(position, is_pair=False)
    for position in (0, 1, 4):
        check_position(position, is_pair=False)
    with pytest.raises(ValueError, match="must be one of 0-4, got 5"):
        check_position(5, is_pair=True)
