"""What every block of ``--arch roberta_blocks`` gets with no test code of its own: each test here is
parametrised over the registries (``fairseq_idpg.blocks.BLOCKS``, the ``roberta_blocks`` records of
``fairseq_idpg.methods.METHODS``), so a new block or record is tested as soon as it is registered.

- every record: a compact checkpoint resumes with fairseq's optimizer state (3 + 3 steps equal 6);
- every record: only its blocks' tensors train (the modules attached to the slots each block declares, the
  modules it installs, the backbone tensors it declares trained), and each of its blocks trains some;
- every size option a block declares (``option(..., size=True)``): 0 where the record sets it >= 1, or any
  negative value, fails at build time with one line naming the flag.

A block's maths (its paper's equation) is checked in tests/test_block_placement.py, whose reference layer must
hold the block's formula (docs/blocks.md: tests).
"""

import re

import pytest
import torch
from blocks_support import block_methods, block_tensors, methods_with, size_options
from checkpoint_support import resume_matches_uninterrupted
from conftest import build_tiny

from fairseq_idpg.blocks import BLOCKS
from fairseq_idpg.methods import METHODS
from fairseq_idpg.options import flag

# (record, size option) of every size option of a record's blocks that its settings set >= 1
SIZES_SET = [
    (name, option)
    for name in block_methods()
    for block in METHODS[name].blocks
    for option in size_options(block)
    if METHODS[name].preset.get(option, 0) >= 1
]
# (block, size option, a record with the block) of every size option a registered block declares
SIZES = [(block, option, methods_with(block)[0]) for block in BLOCKS for option in size_options(block)]


def build(tiny, preset, **options):
    return build_tiny(tiny, "roberta_blocks", blocks_preset=preset, **options)


@pytest.mark.parametrize("preset", block_methods())
def test_compact_checkpoint_resumes_with_its_optimizer_state(tiny, tmp_path, preset):
    """Saved compact after 3 steps (the trained tensors: BitFit's biases, not the frozen weights; prefix tuning's
    MLP), loaded into a fresh model with fairseq's Adam and scheduler state: 3 more steps give the tensors of 6
    uninterrupted ones, bit for bit (every block's dropout included)."""

    def seeded(seed):
        torch.manual_seed(seed)
        return build(tiny, preset, save_trainable_only=True)

    state = resume_matches_uninterrupted(seeded, tmp_path / "checkpoint_last.pt")
    model = seeded(0)
    assert not set(state) & model.frozen_names()
    assert {n for n, p in model.named_parameters() if p.requires_grad} < set(state)


@pytest.mark.parametrize("preset", block_methods())
def test_only_the_blocks_tensors_train_and_each_block_trains_some(tiny, preset):
    model = build(tiny, preset)
    trained = {n for n, p in model.named_parameters() if p.requires_grad and not n.startswith("classification_heads.")}
    tensors = block_tensors(model)  # checks that each attached module is an active block's, at a slot it declares
    assert tensors.keys() == set(METHODS[preset].blocks)
    assert all(tensors.values()), f"a block of {preset} trains nothing: {tensors}"
    assert set().union(*tensors.values()) == trained


@pytest.mark.parametrize("preset,option", SIZES_SET)
def test_a_size_the_record_sets_fails_at_zero_with_one_line_naming_the_flag(tiny, preset, option):
    message = f"{flag(option)} must be >= 1 for --blocks-preset {preset} (got 0)"
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        build(tiny, preset, **{option: 0})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("block,option,preset", SIZES)
def test_a_negative_size_fails_with_one_line_naming_the_flag(tiny, block, option, preset):
    with pytest.raises(ValueError, match=re.escape(f"{flag(option)} must be >= 0, got -1")) as error:
        build(tiny, preset, **{option: -1})
    assert "\n" not in str(error.value)
