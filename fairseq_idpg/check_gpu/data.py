"""A synthetic SST-2-shaped data folder for the check's training runs: what ``scripts/prepare_data.py``
writes (``input0/``, ``label/``, ``task.json``), made of random words of the model's own ``dict.txt``.

Every sentence has exactly ``tokens`` tokens once the task adds ``<s>`` (``<s> w_1 ... w_{T-2} </s>``), so
every batch has the shape [batch, tokens] and a seconds-per-update figure is the one of that shape.
No BPE files, raw data or downloads are needed: the check runs before a researcher prepares any task.
"""

import shutil
from pathlib import Path

import torch

LABELS = ("0", "1")


def write_synthetic_data(out, dict_file, train, valid, tokens, seed=0):
    """Write ``train`` and ``valid`` random sentences of ``tokens`` tokens over ``dict_file``'s words into
    ``out``; returns ``out`` (a Path). Labels are uniform over SST-2's two classes."""
    from fairseq.data import Dictionary

    from fairseq_idpg.data.task_info import TaskInfo

    if tokens < 3:
        raise ValueError(f"--tokens must be >= 3 (<s>, a word, </s>), got {tokens}")
    out = Path(out)
    dictionary = Dictionary.load(str(dict_file))
    g = torch.Generator().manual_seed(seed)
    for folder in ("input0", "label"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(dict_file, out / "input0" / "dict.txt")
    # the label dictionary in the task's fixed order, as prepare_data.py writes it
    (out / "label" / "dict.txt").write_text("".join(f"{label} 1\n" for label in LABELS))
    label_index = Dictionary.load(str(out / "label" / "dict.txt")).nspecial
    for split, rows in (("train", train), ("valid", valid)):
        words = torch.randint(dictionary.nspecial, len(dictionary), (rows, tokens - 2), generator=g)
        labels = torch.randint(0, len(LABELS), (rows,), generator=g)
        eos = torch.full((rows, 1), dictionary.eos())
        # fairseq-preprocess's rows: the words then </s> (the task prepends <s>); labels: index, </s>
        _binarize(out / "input0" / split, torch.cat([words, eos], 1), len(dictionary))
        _binarize(out / "label" / split, torch.stack([labels + label_index, eos[:, 0]], 1), len(LABELS) + label_index)
    info = TaskInfo(
        task="SST-2", num_classes=len(LABELS), regression=False, pair=False, metric="accuracy",
        splits={"train": train, "valid": valid}, labels=list(LABELS), extra={"synthetic": True},
    )  # fmt: skip
    info.write(out)
    return out


def _binarize(prefix, rows, vocab_size):
    """``prefix.{bin,idx}`` in fairseq's mmap format, one row of ``rows`` [N, T] per example."""
    from fairseq.data import indexed_dataset

    builder = indexed_dataset.make_builder(f"{prefix}.bin", impl="mmap", vocab_size=vocab_size)
    for row in rows:
        builder.add_item(row.to(torch.int32))
    builder.finalize(f"{prefix}.idx")
