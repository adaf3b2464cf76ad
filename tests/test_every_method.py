"""Every registered method (``fairseq_idpg.methods.METHODS``), with no per-method test code: a new
record is covered here as soon as it is registered.

For each frozen-backbone method, on a tiny random backbone of 4 layers (conftest; 4 so that
every layer-wise option fits, e.g. rank-2 IDPG layer biases need L - 1 > 2):
- the forward pass gives [B, classes] logits;
- only the method's own tensors and the classification head train: after an Adam step every
  backbone tensor the model does not declare trained (``trains_backbone_parameter``: BitFit's
  biases) is bit-identical, and the method's tensors moved;
- the checkpoint round-trips: a model built with other random weights and loaded from the state
  dict gives the same logits; with ``--save-trainable-only`` the state holds no frozen tensor.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import build_record

from fairseq_idpg.methods import METHODS

FROZEN = sorted(name for name, m in METHODS.items() if m.frozen_backbone)
TOKENS = torch.tensor([[0, 2023, 3185, 2001, 2045, 2], [0, 7592, 2088, 2, 1, 1]])  # one padded row
TARGET = torch.tensor([0, 1])


@pytest.mark.parametrize("name", FROZEN)
def test_forward_shape_and_only_the_method_trains(name, tiny4, method_files):
    method = METHODS[name]
    model = build_record(method, tiny4, method_files, seed=0)
    logits = model(TOKENS, classification_head_name="head")[0]
    assert logits.shape == (2, 2)

    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    declared = {n for n in model.backbone_names if model.trains_backbone_parameter(n)}
    own = trained - model.backbone_names
    assert trained & model.backbone_names <= declared, f"{name} trains backbone tensors it does not declare"
    assert any(not n.startswith("classification_heads.") for n in own | declared), f"{name} trains nothing"
    assert model.num_trainable_parameters() > 0

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    F.cross_entropy(model(TOKENS, classification_head_name="head")[0], TARGET).backward()
    optimizer.step()
    after = dict(model.named_parameters())
    for n in model.backbone_names - declared:
        if n in after:
            assert torch.equal(before[n], after[n]), f"{name} changed frozen {n}"
    moved = [
        n for n in own | declared if not n.startswith("classification_heads.") and not torch.equal(before[n], after[n])
    ]
    assert moved, f"{name}: no method tensor changed in a training step"


@pytest.mark.parametrize("name", FROZEN)
def test_checkpoint_round_trips(name, tiny4, method_files):
    method = METHODS[name]
    model = build_record(method, tiny4, method_files, seed=0).eval()
    state = model.state_dict()
    assert method.options.get("save_trainable_only"), f"{name}: its checkpoints would hold the whole backbone"
    assert not (set(state) & model.frozen_names()), f"{name}: compact checkpoint holds frozen tensors"
    other = build_record(method, tiny4, method_files, seed=1).eval()
    with torch.no_grad():
        expected = model(TOKENS, classification_head_name="head")[0]
        assert not torch.equal(other(TOKENS, classification_head_name="head")[0], expected), "seeds gave one model"
        other.load_state_dict(state)
        assert torch.equal(other(TOKENS, classification_head_name="head")[0], expected)


def test_every_method_record_is_well_formed():
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    for method in METHODS.values():
        assert method.arch in ARCH_MODEL_REGISTRY, method.name
        assert method.task in TASK_REGISTRY, method.name
        assert method.train_args()[:2] == ["--task", method.task]
        assert method.train_args().count("--task") == 1 and method.train_args().count("--arch") == 1


def test_a_method_and_its_preset_have_one_name():
    """A record whose options name its own preset carries that preset's settings (``Method.preset``),
    and the model family reads its presets from the records (``--prompt-preset``, ``--idpg-preset``)."""
    for method in METHODS.values():
        option = getattr(method.model_class, "PRESET_OPTION", None)
        if option is None:
            assert not method.preset, f"{method.name}: {method.arch} has no preset option to read Method.preset"
            continue
        presets = method.model_class.presets()
        assert method.options[option] in presets, f"{method.name}: --{option.replace('_', '-')} names no preset"
        if method.preset:
            assert method.options[option] == method.name, f"{method.name}: its preset goes by another name"
            assert presets[method.name] == method.preset
