"""Prompt initialisations for long prompts (``--prompt-init vocab|zero``, docs/long-prompts.md): the
vocabulary start takes rows of the frozen embedding table, DPT's factors start at that prompt's
best rank-b approximation, the zero start is LoRA-style; the uniform start's scale. Tiny backbone
(2 layers x 32, the stand-in's WordPiece vocabulary), conftest."""

import math

import pytest
import torch
from conftest import build_tiny

import fairseq_idpg.models.roberta_prompt as roberta_prompt
from fairseq_idpg.modules.prompts.soft_prompts import (
    FullPrompt,
    LowRankPrompt,
    RankProbePrompt,
    sample_vocab_rows,
    split_low_rank,
)

ARCH = "roberta_prompt"


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def table_indices(model, P):
    """For each row of P [l, d], the index of the identical embedding row (-1 if there is none)."""
    table = model.encoder.sentence_encoder.embed_tokens.weight.detach()
    same = (P.detach().unsqueeze(1) == table.unsqueeze(0)).all(-1)  # [l, V]
    return torch.where(same.any(1), same.float().argmax(1), torch.full((P.size(0),), -1))


def test_vocab_init_rows_are_distinct_rows_of_the_embedding_table(tiny):
    model = build_tiny(tiny, ARCH, prompt_preset="prompt-tuning-100", prompt_length=50, prompt_init="vocab")
    idx = table_indices(model, model.prompt())
    assert (idx >= 0).all() and idx.unique().numel() == 50  # 50 distinct rows, copied exactly
    symbols = [tiny.dictionary[i] for i in idx.tolist()]
    assert not any(s.startswith(("<", "[", "madeupword")) for s in symbols), symbols  # no specials, no [unused]
    ordinary = model.ordinary_tokens()
    assert ordinary[idx].all()
    assert not ordinary[: tiny.dictionary.nspecial].any() and not ordinary[tiny.dictionary.index("<mask>")]
    assert not ordinary[tiny.dictionary.index("[unused0]")] and ordinary[tiny.dictionary.index("the")]
    # the prompt's scale is the vocabulary's: mean row norm within the spread of the table's rows
    norms = model.encoder.sentence_encoder.embed_tokens.weight[ordinary].norm(dim=1)
    assert abs(model.prompt().norm(dim=1).mean() - norms.mean()) < 3 * norms.std() / math.sqrt(50)


def test_vocab_init_top_tokens_draws_from_the_first_ordinary_entries(tiny):
    model = build_tiny(
        tiny, ARCH, prompt_preset="prompt-tuning-5", prompt_length=3, prompt_init="vocab", prompt_init_top_tokens=3
    )
    first3 = torch.nonzero(model.ordinary_tokens()).flatten()
    assert first3.numel() == 3
    assert sorted(table_indices(model, model.prompt()).tolist()) == first3.tolist()


def test_sample_vocab_rows():
    table = torch.arange(10.0).unsqueeze(1).expand(10, 4)  # row i = [i, i, i, i]
    keep = torch.tensor([False, True] * 5)  # rows 1, 3, 5, 7, 9
    rows = sample_vocab_rows(table, 5, keep)
    assert sorted(rows[:, 0].long().tolist()) == [1, 3, 5, 7, 9]  # without replacement: all of them
    rows = sample_vocab_rows(table, 12, keep)  # more than there are: with replacement
    assert rows.shape == (12, 4) and set(rows[:, 0].long().tolist()) <= {1, 3, 5, 7, 9}
    with pytest.raises(ValueError, match="no vocabulary rows"):
        sample_vocab_rows(table, 2, torch.zeros(10, dtype=torch.bool))


def test_low_rank_start_is_the_truncated_svd_with_balanced_factors():
    P = torch.randn(100, 64, dtype=torch.float64)
    S = torch.linalg.svdvals(P)
    prompt = LowRankPrompt(100, 64, 10).double()
    prompt.start_from_(P)
    A, B = prompt.A.detach(), prompt.B.detach()
    # Eckart-Young: the error is the norm of the dropped singular values
    assert torch.linalg.norm(P - prompt().detach()).item() == pytest.approx(S[10:].pow(2).sum().sqrt().item(), rel=1e-9)
    assert torch.linalg.matrix_rank(prompt().detach()).item() == 10
    assert torch.allclose(A.T @ A, torch.diag(S[:10]), atol=1e-9)  # A = U S^1/2, B = S^1/2 V^T
    assert torch.allclose(B @ B.T, torch.diag(S[:10]), atol=1e-9)
    a, b = split_low_rank(P, 64)  # full rank: exact
    assert torch.allclose(a @ b, P, atol=1e-9)


def test_rank_probe_start_is_the_svd_at_the_initial_s():
    P = torch.randn(12, 8, dtype=torch.float64)
    probe = RankProbePrompt(12, 8, 8, s_init=0.02).double()
    probe.start_from_(P)
    assert torch.allclose(probe().detach(), P, atol=1e-9)  # r = min(l, d): P itself
    assert probe.num_positive() == 8


def test_dpt_vocab_init_is_the_best_rank_b_approximation_of_the_sampled_rows(tiny, monkeypatch):
    sampled = []

    def recording(*args, **kwargs):
        sampled.append(sample_vocab_rows(*args, **kwargs))
        return sampled[-1]

    monkeypatch.setattr(roberta_prompt, "sample_vocab_rows", recording)
    model = build_tiny(tiny, ARCH, prompt_preset="dpt", prompt_length=20, dpt_bottleneck=4, prompt_init="vocab")
    (rows,) = sampled
    A, B = split_low_rank(rows, 4)
    assert torch.allclose(model.prompt.A, A) and torch.allclose(model.prompt.B, B)
    P = model.prompt().detach()
    S = torch.linalg.svdvals(rows)
    assert torch.linalg.matrix_rank(P, atol=1e-5).item() == 4
    assert torch.linalg.norm(rows - P).item() == pytest.approx(S[4:].pow(2).sum().sqrt().item(), rel=1e-4)
    # the start keeps most of the sampled prompt's energy, at the vocabulary's scale (not U(-0.5, 0.5)'s)
    assert torch.linalg.norm(P) ** 2 == pytest.approx(S[:4].pow(2).sum().item(), rel=1e-4)


def test_deep_vocab_init_starts_as_the_shallow_model(tiny):
    deep = build_tiny(tiny, ARCH, prompt_preset="deep-dpt", prompt_length=8, dpt_bottleneck=3, prompt_init="vocab")
    P = deep.prompt().detach()
    assert P.shape == (2, 8, 32) and torch.linalg.matrix_rank(P[0]).item() == 3
    assert (P[1:] == 0).all() and (deep.prompt.B[1:] == 0).all() and (deep.prompt.A[1:] != 0).all()
    full = build_tiny(tiny, ARCH, prompt_preset="deep-prompt-tuning-100", prompt_length=8, prompt_init="vocab")
    P = full.prompt().detach()
    assert (table_indices(full, P[0]) >= 0).all() and (P[1:] == 0).all()


def test_zero_init_is_lora_style_and_still_learns(tiny):
    model = build_tiny(tiny, ARCH, prompt_preset="dpt", prompt_length=10, dpt_bottleneck=3, prompt_init="zero")
    assert (model.prompt() == 0).all() and (model.prompt.B == 0).all()
    assert model.prompt.A.abs().max() <= 0.5 and model.prompt.A.abs().min() > 0  # U(-0.5, 0.5) kept
    src = torch.tensor([[0, 2023, 3185, 2001, 2], [0, 7592, 2, 1, 1]])
    model(src, classification_head_name="head")[0].logsumexp(-1).sum().backward()
    assert model.prompt.B.grad.abs().sum() > 0 and (model.prompt.A.grad == 0).all()  # dL/dB = A^T dL/dP
    assert (FullPrompt(5, 8, init="zero")() == 0).all()
    probe = RankProbePrompt(5, 8, 5, init="zero")
    assert (probe() == 0).all() and (probe.V == 0).all() and (probe.U != 0).all()


def test_uniform_start_scales():
    """The default U(-0.5, 0.5) start: prompt rows of norm sqrt(d / 12) (5.66 at d = 384), and DPT's
    product A B with entries of sd sqrt(b) / 12 (0.264 at b = 10; research note 1c) and rank b."""
    P = FullPrompt(100, 384)()
    assert P.norm(dim=1).mean().item() == pytest.approx(math.sqrt(384 / 12), rel=0.02)
    dpt = LowRankPrompt(100, 384, 10)
    P = dpt().detach()
    assert P.std().item() == pytest.approx(math.sqrt(10) / 12, rel=0.05)
    assert torch.linalg.matrix_rank(P).item() == 10
