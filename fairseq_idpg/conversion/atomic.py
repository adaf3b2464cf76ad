"""Atomic file writing: every output file is written under a temporary name beside its target and
renamed into place only when complete, so an interrupted conversion never leaves a half-written
``model.pt``, ``dict.txt`` or tokenizer file."""

import os
import shutil
import tempfile
from contextlib import contextmanager


@contextmanager
def atomic_path(path: str):
    """Yield a temporary path beside ``path``; it replaces ``path`` only if the block succeeds."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file ordinary permissions
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_copy(src: str, dst: str) -> None:
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def atomic_write_text(path: str, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def save_checkpoint(state: dict, path: str) -> None:
    import torch

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        # through a file object: torch.save(<path>) names the zip's records after the file, here a random
        # temporary name, so two builds of the same tensors had different bytes (and sha256, which
        # identifies a run's backbone); a file object's records are always "archive/"
        torch.save(state, f)
