"""Helpers of the tests of the blocks family (``--arch roberta_blocks``: test_inducer.py, test_lora.py,
test_prefix.py, test_adapters.py, test_block_placement.py, test_block_dropout.py). No tests here; the tiny
backbone and builder are conftest's.

The methods a test runs come from the registry (``fairseq_idpg.methods.METHODS``), chosen by what their
settings turn on (``methods_with``), never from a list of names: a new record is tested wherever its blocks are.
Blocks come from the block registry (``fairseq_idpg.blocks.BLOCKS``: ``blocks_in`` a slot, ``size_options``), and
what a built model's blocks attach is read from the blocks' own ``layer_blocks`` (``block_tensors``).
"""

import json
import subprocess
from pathlib import Path

import torch

from fairseq_idpg.blocks import BLOCKS, EncoderSizes, blocks_turned_on
from fairseq_idpg.methods import METHODS
from fairseq_idpg.modules.slots import SLOTS

REPO = Path(__file__).resolve().parents[1]
TOKENS = torch.tensor([[0, 5, 6, 7, 8, 2], [0, 9, 10, 2, 1, 1]])  # one padded row


def block_methods():
    """Every method of the family (``--arch roberta_blocks``), in registration order."""
    return [name for name, method in METHODS.items() if method.arch == "roberta_blocks"]


def method_blocks(name):
    """``{block: config}`` of the blocks (fairseq_idpg/blocks/) that the settings of method ``name`` (its
    record's ``preset``, over the blocks' defaults) turn on."""
    return blocks_turned_on(METHODS[name].preset)


def method_slots(name):
    """The slots the blocks of method ``name`` attach to."""
    return {slot for config in method_blocks(name).values() for slot in config.slots}


def methods_with(*blocks, slots=(), where=None):
    """The methods of the family, in registration order, whose settings turn on one of ``blocks`` (block
    names) or a block attaching to one of ``slots``, and (if given) satisfy ``where({block: config})``.
    Never empty: a query that matched no method would leave its test with nothing to test."""
    unknown = (set(blocks) - set(BLOCKS)) | (set(slots) - set(SLOTS))
    assert not unknown, f"unknown {sorted(unknown)}; blocks: {', '.join(BLOCKS)}; slots: {', '.join(SLOTS)}"

    def chosen(name):
        active = method_blocks(name)
        turned_on = not (blocks or slots) or set(blocks) & set(active) or set(slots) & method_slots(name)
        return bool(turned_on) and (where is None or where(active))

    names = [name for name in block_methods() if chosen(name)]
    assert names, f"no method of the registry matches blocks={blocks}, slots={slots}, where={where}"
    return names


def blocks_in(*slots):
    """The registered blocks (``fairseq_idpg.blocks.BLOCKS``), in registration order, that attach to one of
    ``slots``. Never empty, as ``methods_with``."""
    names = [name for name, cls in BLOCKS.items() if set(cls.slots) & set(slots)]
    assert names, f"no registered block attaches to {slots}; slots: {', '.join(SLOTS)}"
    return names


def size_options(block):
    """The size options block ``block`` declares (``option(..., size=True)``: a rank or size, 0: off)."""
    return [f.name for f, _ in BLOCKS[block].options() if f.metadata["size"]]


def block_attachments(model):
    """``{(layer index, attribute name): block}`` of the modules each active block of ``model`` attaches, read
    from the blocks' own ``layer_blocks`` (built again under a forked RNG: the model's randomness is untouched)."""
    encoder = EncoderSizes.of(model.args)
    with torch.random.fork_rng(devices=[]):
        return {
            (i, attachment.name): config.name
            for config in model.block_configs
            if config.active()
            for i in range(encoder.layers)
            for attachment in config.layer_blocks(i, encoder, model)
        }


def attached(model):
    """``(layer index, slot, attribute name, module)`` of every module attached to a slot of ``model``'s layers
    (the attention's slots, then the layer's), in attaching order."""
    for i, layer in enumerate(model.encoder.sentence_encoder.layers):
        for host in (layer.self_attn, layer):
            for slot, names in getattr(host, "slots", {}).items():
                for name in names:
                    if getattr(host, name, None) is not None:
                        yield i, slot, name, getattr(host, name)


def block_tensors(model):
    """``{block: names of its tensors}`` of the active blocks of ``model``: the parameters of the modules attached
    to the layers' slots (prefix tuning's: the model's shared encoder, attached unowned), each checked to be what
    an active block's ``layer_blocks`` builds, at a slot it declares, and the backbone tensors a block declares
    trained (BitFit's biases)."""
    names = {id(p): n for n, p in model.named_parameters()}
    tensors = {config.name: set() for config in model.block_configs if config.active()}
    owners = block_attachments(model)
    for i, slot, name, module in attached(model):
        block = owners.get((i, name))
        assert block is not None, f"layer {i}: {name!r} attached to {slot!r}, and no active block builds it"
        assert slot in BLOCKS[block].slots, f"{block} attaches {name!r} to {slot!r}, not a slot it declares"
        tensors[block] |= {names[id(p)] for p in module.parameters()}
    assert {(i, name) for i, _, name, _ in attached(model)} == set(owners), "a block's module is not attached"
    for config in model.block_configs:
        if config.active():
            tensors[config.name] |= {n for n in model.backbone_names if config.trains_backbone_parameter(n)}
    return tensors


def logits(model, tokens=TOKENS):
    return model(tokens, classification_head_name="head")[0]


def run_main_job(work_dir, method, raw, task="RTE"):
    """``scripts/run.sh`` (prepare -> fairseq-train -> fairseq-validate), 5 updates on the offline
    stand-in (all-MiniLM-L6-v2 converted to fairseq RoBERTa) with the task files in ``raw`` (conftest's
    ``glue_slices``: the first rows of the real files, so the dev set's first examples are the real
    ones); returns the run's folder (``checkpoints/standin/<task>/<method>/lr<lr>.seed1.<hash>``) and
    its results.json."""
    from fairseq_idpg.run import find_runs

    cmd = ["bash", str(REPO / "scripts" / "run.sh"), task, "--method", method, "--raw", str(raw)]
    cmd += ["--max-update", "5", "--total-batch", "8", "--validate-interval-updates", "5", "--work-dir", str(work_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (save,) = find_runs(work_dir, "standin", task, method)
    return save, json.loads((save / "results.json").read_text())
