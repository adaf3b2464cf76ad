"""M(x) computed once per example and reused across epochs and runs (IDPG section 3.1: "we can
cache the prediction M(x)"; computed in eval mode, M(x) is deterministic, so a stored row equals
a recomputed one).

- ``SentenceRepresentationCache``: N rows of float32 [d] plus a filled flag per row, in memory
  or on disk under ``ROOT/<key>/`` (numpy memmaps ``values.npy``, ``filled.npy`` and a readable
  ``key.json``). Rows are written as they are computed: a run that stops early keeps what it
  computed, and data-parallel workers fill disjoint rows of the same files (a row is written
  before its flag; a row two workers compute holds the same value either way).
- ``cache_key(...)``: sha256 of a canonical JSON of what determines the values: the model side
  (a digest of the frozen backbone's weights, the encoder kind and settings, the compute dtype)
  and the data side (``dataset_identity``: split, sha256 of its binarized files, the example
  lengths after truncation, the special tokens). Another backbone, dataset, split, truncation
  budget or dtype gives another key, hence another folder: nothing is ever reused across them.
- ``WithSentenceIds``: wraps a split's dataset so that each batch carries
  ``net_input["sentence_ids"] = (slot << SLOT_SHIFT) | id`` (``id`` is fairseq's per-example
  ``sample["id"]``); the model finds the split's cache by the slot and the rows by the ids, since
  a model only sees ``net_input``.
"""

import hashlib
import json
import os
import shutil
import tempfile

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset

from fairseq_idpg.errors import MissingFile

from .digest import file_sha256

SLOT_SHIFT = 40  # example ids below 2**40; slots (one per loaded split) above


def dataset_identity(data_dir, split, dataset, **settings):
    """What identifies a loaded split: its files' digests, its lengths, the given settings."""
    files = {}
    for column in ("input0", "input1"):
        for ext in ("bin", "idx"):
            path = os.path.join(data_dir, column, f"{split}.{ext}")
            if os.path.exists(path):
                files[f"{column}/{split}.{ext}"] = file_sha256(path)
    if not files:
        raise MissingFile(f"no binarized files for split {split!r} under {data_dir}")
    sizes = np.ascontiguousarray(np.asarray(dataset.sizes, dtype=np.int64))
    return {
        "split": split,
        "files": files,
        "num_examples": len(dataset),
        "lengths_sha256": hashlib.sha256(sizes.tobytes()).hexdigest(),
        **settings,
    }


def cache_key(*parts):
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


class SentenceRepresentationCache:
    """``size`` rows of float32 [dim]; on disk under ``root/key`` when ``root`` is given.

    ``lookup(ids)`` -> (values [B, dim] float32 numpy, filled [B] bool); ``store(ids, values)``.
    """

    def __init__(self, size, dim, key=None, root=None, description=None):
        self.size, self.dim, self.key = size, dim, key
        self.path = None
        if root is None:
            self.values = np.zeros((size, dim), dtype=np.float32)
            self.filled = np.zeros(size, dtype=np.uint8)
            return
        if key is None:
            raise ValueError("an on-disk cache needs a key")
        self.path = os.path.join(root, key)
        if not os.path.isdir(self.path):
            self._create(root, description)
        self.values = np.load(os.path.join(self.path, "values.npy"), mmap_mode="r+")
        self.filled = np.load(os.path.join(self.path, "filled.npy"), mmap_mode="r+")
        if self.values.shape != (size, dim) or self.filled.shape != (size,):
            raise RuntimeError(
                f"sentence representation cache {self.path} holds {self.values.shape}, expected "
                f"{(size, dim)}: remove that folder"
            )

    def _create(self, root, description):
        os.makedirs(root, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{self.key}.", dir=root)
        try:
            np.lib.format.open_memmap(
                os.path.join(staging, "values.npy"), "w+", np.float32, (self.size, self.dim)
            ).flush()
            np.lib.format.open_memmap(os.path.join(staging, "filled.npy"), "w+", np.uint8, (self.size,)).flush()
            with open(os.path.join(staging, "key.json"), "w") as f:
                json.dump(description or {}, f, indent=1, sort_keys=True)
            os.rename(staging, self.path)  # atomic; a worker that loses the race uses the winner's
        except OSError:
            if not os.path.isdir(self.path):
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    @property
    def num_filled(self):
        return int(np.count_nonzero(self.filled))

    def lookup(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        return np.asarray(self.values[ids]), np.asarray(self.filled[ids]).astype(bool)

    def store(self, ids, values):
        ids = np.asarray(ids, dtype=np.int64)
        self.values[ids] = np.asarray(values, dtype=np.float32)
        self.filled[ids] = 1


class WithSentenceIds(BaseWrapperDataset):
    """Adds ``net_input["sentence_ids"]`` = ``(slot << SLOT_SHIFT) | sample["id"]`` to each batch."""

    def __init__(self, dataset, slot):
        super().__init__(dataset)
        self.slot = slot

    def collater(self, samples):
        batch = self.dataset.collater(samples)
        if batch:
            batch["net_input"]["sentence_ids"] = batch["id"] | (self.slot << SLOT_SHIFT)
        return batch


def split_sentence_ids(sentence_ids):
    """(slot: int, example ids: LongTensor [B] on the CPU) of one batch's ``sentence_ids``."""
    ids = sentence_ids.cpu()
    slot = int(ids[0]) >> SLOT_SHIFT
    return slot, ids & ((1 << SLOT_SHIFT) - 1)


def to_device(values, like):
    """numpy rows -> a tensor on ``like``'s device and dtype. To a GPU from pinned memory: from pageable memory
    the host waits for the copy, and so for the device's queued work (a sync every update)."""
    rows = torch.from_numpy(values)
    if like.is_cuda:
        rows = rows.pin_memory()  # the caching host allocator keeps it until the copy has run
    return rows.to(device=like.device, dtype=like.dtype, non_blocking=True)
