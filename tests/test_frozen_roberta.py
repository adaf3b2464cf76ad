"""The frozen-backbone base of every method: freezing, optimizer, compact checkpoints that resume,
the backbone's location and the one-line errors of a missing or wrong one."""

import argparse
import logging
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from checkpoint_support import resume_matches_uninterrupted
from fairseq.data import Dictionary

from fairseq_idpg.conversion.tiny import write_tiny_roberta
from fairseq_idpg.models.build import stub_task
from fairseq_idpg.models.frozen_roberta import FINGERPRINT_KEY, RELOCATE, FrozenBackboneRobertaModel


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


def build(backbone, save_trainable_only=True, backbone_file=None):
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
        backbone=str(backbone_file or backbone / "model.pt"),
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
    with pytest.raises(RuntimeError, match="trained on another backbone") as error:
        other.load_state_dict(state)
    message = str(error.value)  # one line: the backbone given and how to give the right one
    assert "\n" not in message and str(tiny[1] / "model.pt") in message and message.endswith(RELOCATE)


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


def test_relocation_hint_names_every_entry_point():
    assert "--model-overrides \"{'backbone': 'PATH'}\" (fairseq-validate)" in RELOCATE
    assert "backbone='PATH' (RobertaModel.from_pretrained)" in RELOCATE and "--backbone PATH" in RELOCATE


def _truncated(folder, tiny):
    data = (tiny / "model.pt").read_bytes()
    (folder / "truncated.pt").write_bytes(data[: len(data) // 2])
    return folder / "truncated.pt"


@pytest.mark.parametrize(
    "make,error,reason",
    [
        (lambda folder, tiny: folder / "moved" / "model.pt", FileNotFoundError, "no such file"),
        (lambda folder, tiny: folder, ValueError, "is a folder, not a fairseq checkpoint file"),
        (lambda folder, tiny: tiny, ValueError, r"is a folder, .*; did you mean .*model\.pt\?"),
        (
            lambda folder, tiny: (folder / "notes.txt", (folder / "notes.txt").write_text("hello\n"))[0],
            ValueError,
            r"not a fairseq checkpoint \(torch\.load: ",
        ),
        (
            lambda folder, tiny: (folder / "plain.pt", torch.save({"weight": torch.ones(2)}, folder / "plain.pt"))[0],
            ValueError,
            r"not a fairseq checkpoint \(it holds a dict of weight, no 'model' weights\)",
        ),
        (_truncated, ValueError, r"not a fairseq checkpoint \(torch\.load: "),
    ],
    ids=["missing", "folder", "folder-with-model-pt", "text-file", "plain-torch-dict", "truncated"],
)
def test_bad_backbone_fails_with_one_line_naming_the_flag_and_the_file(tiny, tmp_path, make, error, reason):
    path = make(tmp_path, tiny[0])
    with pytest.raises(error) as raised:
        build(tiny[0], backbone_file=path)
    message = str(raised.value)
    assert "\n" not in message, message
    assert re.match(f"--backbone {re.escape(str(path))}: {reason}", message), message
    if "did you mean" not in message:
        assert message.endswith(RELOCATE)
    # no "During handling of the above exception" tail of an unpickling or zip error
    assert raised.value.__context__ is None or raised.value.__suppress_context__


def test_backbone_of_another_size_names_the_relocation_too(tiny, tmp_path):
    bigger = write_tiny_roberta(tmp_path / "big", dim=64, ffn=128)
    with pytest.raises(ValueError, match="does not fit this architecture") as raised:
        build(Path(bigger))
    assert str(raised.value).endswith(RELOCATE) and "\n" not in str(raised.value)


def test_compact_checkpoint_resumes_with_its_optimizer_state(tiny, tmp_path):
    def build_seeded(seed):
        torch.manual_seed(seed)
        model = build(tiny[0])
        nn.init.normal_(model.extra)  # the zero init is the same for every seed
        return model

    state = resume_matches_uninterrupted(build_seeded, tmp_path / "checkpoint_last.pt")
    assert set(state) == {"extra", FINGERPRINT_KEY} | {
        f"classification_heads.head.{n}" for n, _ in build(tiny[0]).classification_heads["head"].named_parameters()
    }


def test_build_logs_the_trained_and_total_parameters(tiny, caplog):
    """As PEFT's print_trainable_parameters: every run's log states both at the start (the head comes later)."""
    with caplog.at_level(logging.INFO, logger="fairseq_idpg.models.frozen_roberta"):
        model = build(tiny[0])
    head = sum(p.numel() for p in model.classification_heads.parameters())
    total = sum(p.numel() for p in model.parameters()) - head
    trained = model.num_trainable_parameters()
    assert trained == 32 and total > 1000
    line = f"trainable params: {trained:,} || all params: {total:,} || trainable%: {100 * trained / total:.4f}"
    assert line in caplog.messages


def test_a_method_logs_its_counted_parameters(caplog):
    """The logged trained count is the one count_params.py reports (count_trainable), and the total is the
    model's parameter count, at roberta-base (built on the meta device)."""
    from fairseq_idpg.methods import METHODS
    from fairseq_idpg.models.build import ROBERTA_BASE, build_method, count_trainable

    with caplog.at_level(logging.INFO, logger="fairseq_idpg.models.frozen_roberta"):
        model = build_method(METHODS["lora"], Dictionary(), meta=True, **ROBERTA_BASE)
    (line,) = [m for m in caplog.messages if m.startswith("trainable params: ")]
    trained, total = count_trainable(METHODS["lora"], ROBERTA_BASE), sum(p.numel() for p in model.parameters())
    assert trained == 589_824 and total > 86_000_000
    assert line == f"trainable params: {trained:,} || all params: {total:,} || trainable%: {100 * trained / total:.4f}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gelu_in_the_compute_dtype_gives_fairseqs_logits(tiny, dtype):
    """The frozen layers' GELU is torch's in the compute dtype, not fairseq's fp32 round trip: fp32 logits are
    equal, half precision ones within a rounding of the dtype (2 ** -7 for bf16 and 2 ** -10 for fp16, relative)."""
    from fairseq.utils import get_activation_fn

    model = build(tiny[0]).eval()
    layers = model.encoder.sentence_encoder.layers
    assert all(layer.activation_fn is torch.nn.functional.gelu for layer in layers)
    model.extra.data.normal_()
    model = model.to(dtype)
    tokens = torch.tensor([[0, 5, 6, 7, 8, 2], [0, 9, 10, 2, 1, 1]])
    with torch.no_grad():
        ours = model(tokens)[0].float()
        for layer in layers:
            layer.activation_fn = get_activation_fn("gelu")
        fairseqs = model(tokens)[0].float()
    if dtype == torch.float32:
        assert torch.equal(ours, fairseqs)
    else:
        eps = torch.finfo(dtype).eps
        assert torch.allclose(ours, fairseqs, rtol=eps, atol=eps * fairseqs.abs().max().item())
