"""Helpers of the tests of the blocks family (``--arch roberta_blocks``: test_inducer.py, test_lora.py,
test_prefix.py, test_adapters.py, test_block_placement.py, test_block_dropout.py). No tests here; the tiny
backbone and builder are conftest's.

The methods a test runs come from the registry (``fairseq_idpg.methods.METHODS``), chosen by what their
settings turn on (``methods_with``), never from a list of names: a new record is tested wherever its blocks are.
"""

import json
import subprocess
from pathlib import Path

import torch

from fairseq_idpg.blocks import BLOCKS, blocks_turned_on
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
