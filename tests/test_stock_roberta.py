"""``--arch roberta`` (full fine-tuning: ``finetune``, ``efl``) builds ``models/stock_roberta.StockRobertaModel``:
fairseq's ``RobertaModel`` with its layers run as the frozen-backbone models run theirs. The same state-dict names
(checkpoints load both ways), the same run identity (no model settings: the run folders keep their names), and
fp32 logits, hidden states and gradients equal fairseq's model's within 1e-6, in eval and training mode."""

import pytest
import torch
from conftest import build_tiny

from fairseq_idpg.methods import METHODS
from fairseq_idpg.models import stock_roberta
from fairseq_idpg.models.stock_roberta import StockRobertaModel
from fairseq_idpg.modules.attention.augmented_self_attention import AugmentedSelfAttention
from fairseq_idpg.run import model_settings

TOKENS = torch.tensor([[0, 11, 12, 13, 14, 2, 2, 21, 22, 2], [0, 15, 2, 2, 23, 2, 1, 1, 1, 1], [0, 16, 2, *[1] * 7]])


@pytest.fixture
def pair(tiny, monkeypatch):
    """(ours, fairseq's RobertaModel) of ``--arch roberta`` with the same weights, fp32."""
    ours = build_tiny(tiny, "roberta")
    with monkeypatch.context() as m:
        m.setitem(stock_roberta.ARCH_MODEL_REGISTRY, "roberta", stock_roberta.FAIRSEQ_MODEL)
        theirs = build_tiny(tiny, "roberta")
    theirs.load_state_dict(ours.state_dict(), strict=True)
    return ours, theirs


def test_arch_roberta_is_fairseqs_model_under_its_names(pair):
    ours, theirs = pair
    assert type(ours) is StockRobertaModel and type(theirs) is stock_roberta.FAIRSEQ_MODEL
    assert METHODS["finetune"].model_class is StockRobertaModel and METHODS["efl"].model_class is StockRobertaModel
    assert all(type(layer.self_attn) is AugmentedSelfAttention for layer in ours.encoder.sentence_encoder.layers)
    mine, stock = ours.state_dict(), theirs.state_dict()
    assert list(mine) == list(stock) and all(mine[k].shape == stock[k].shape for k in stock)
    ours.load_state_dict(stock, strict=True)  # a checkpoint of either loads into the other
    assert model_settings(METHODS["finetune"]) == {} and model_settings(METHODS["efl"]) == {}  # run hashes
    assert all(p.requires_grad for p in ours.parameters())


def outputs(model, training, seed=3):
    """(logits, LM logits, the hidden states, {name: gradient}) of one forward and backward."""
    model.train(training)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    logits = model(TOKENS, classification_head_name="head")[0]
    lm, extra = model(TOKENS, return_all_hiddens=True)
    (logits.logsumexp(-1).sum() + lm.logsumexp(-1).mean()).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), lm.detach(), [s.detach() for s in extra["inner_states"]], grads


@pytest.mark.parametrize("training", [False, True])
def test_logits_states_and_gradients_equal_fairseqs(pair, training):
    ours, theirs = (outputs(model, training) for model in pair)
    keep = TOKENS.ne(1).t()  # hidden states [T, B, C]: padded rows are garbage in both
    assert torch.allclose(ours[0], theirs[0], atol=1e-6, rtol=0)
    assert torch.allclose(ours[1], theirs[1], atol=1e-6, rtol=0)
    for mine, stock in zip(ours[2], theirs[2], strict=True):
        assert torch.allclose(mine[keep], stock[keep], atol=1e-6, rtol=0)
    assert ours[3].keys() == theirs[3].keys() and len(ours[3]) == len(list(pair[0].parameters()))
    for name, grad in theirs[3].items():
        assert torch.allclose(ours[3][name], grad, atol=1e-6, rtol=1e-5), name
