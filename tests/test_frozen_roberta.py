"""The frozen-backbone base of every method: freezing, optimizer, compact checkpoints."""

import argparse
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from fairseq.data import Dictionary

from fairseq_idpg.conversion.tiny import write_tiny_roberta
from fairseq_idpg.models.build import stub_task
from fairseq_idpg.models.frozen_roberta import FINGERPRINT_KEY, FrozenBackboneRobertaModel


class WithExtraVector(FrozenBackboneRobertaModel):
    """A minimal method: one trainable vector added to the <s> features."""

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        self.extra = nn.Parameter(torch.zeros(args.encoder_embed_dim))

    def forward(self, src_tokens, **kwargs):
        x, extra = self.encoder(src_tokens, features_only=True)
        return self.classification_heads["head"](x + self.extra), extra


@pytest.fixture(scope="module")
def tiny(tiny_backbones):
    """Two tiny backbones of the same shapes with other weights (conftest)."""
    return tiny_backbones(seed=0).folder, tiny_backbones(seed=1).folder


def build(backbone, save_trainable_only=True):
    """The minimal method on a backbone folder, built as fairseq-train builds a model."""
    d = Dictionary.load(str(backbone / "dict.txt"))
    d.add_symbol("<mask>")
    args = argparse.Namespace(
        arch="roberta",
        encoder_layers=2,
        encoder_embed_dim=32,
        encoder_ffn_embed_dim=64,
        encoder_attention_heads=4,
        max_positions=512,
        backbone=str(backbone / "model.pt"),
        save_trainable_only=save_trainable_only,
    )
    model = WithExtraVector.build_model(args, stub_task(d))
    model.register_classification_head("head", num_classes=2)
    return model


def test_backbone_is_loaded_frozen_and_out_of_the_optimizer(tiny):
    model = build(tiny[0])
    reference = torch.load(tiny[0] / "model.pt", weights_only=False)["model"]
    name = "encoder.sentence_encoder.layers.1.fc1.weight"
    assert torch.equal(model.state_dict(full=True)[name], reference[name])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"extra"} | {
        n for n, _ in model.classification_heads.named_parameters(prefix="classification_heads")
    }
    assert model.num_trainable_parameters() == 32

    # fairseq's trainer hands only requires_grad tensors to the optimizer, and backprop
    # leaves frozen ones without gradient
    tokens = torch.tensor([[0, 5, 6, 2], [0, 7, 2, 1]])
    logits, _ = model(tokens)
    logits.sum().backward()
    assert all(p.grad is None for n, p in model.named_parameters() if n in model.backbone_names)
    assert model.extra.grad is not None


def test_compact_checkpoint_roundtrip_and_wrong_backbone(tiny):
    model = build(tiny[0])
    with torch.no_grad():
        model.extra.add_(0.5)
    state = model.state_dict()
    assert FINGERPRINT_KEY in state and "extra" in state
    assert not any(k.startswith("encoder.") for k in state)  # the backbone is not stored

    same = build(tiny[0])
    same.load_state_dict(state)
    tokens = torch.tensor([[0, 5, 6, 2]])
    model.eval(), same.eval()
    assert torch.equal(model(tokens)[0], same(tokens)[0])

    other = build(tiny[1])  # same shapes, other weights
    with pytest.raises(RuntimeError, match="trained on another backbone"):
        other.load_state_dict(state)


def test_full_pretrained_checkpoint_fills_method_tensors(tiny):
    """--restore-file of a plain pretrained RoBERTa: the method keeps its initialisation."""
    model = build(tiny[0], save_trainable_only=False)
    pretrained = torch.load(tiny[1] / "model.pt", weights_only=False)["model"]
    heads = {k: v for k, v in model.state_dict().items() if k.startswith("classification_heads.")}
    model.load_state_dict({**pretrained, **heads})
    assert torch.equal(model.extra, torch.zeros(32))
    name = "encoder.sentence_encoder.layers.0.fc2.weight"
    assert torch.equal(model.state_dict()[name], pretrained[name])


def test_backbone_of_another_size_is_a_clear_error(tiny, tmp_path):
    bigger = write_tiny_roberta(tmp_path / "big", dim=64, ffn=128)
    with pytest.raises(ValueError, match="does not fit this architecture .*shape of"):
        build(Path(bigger))
