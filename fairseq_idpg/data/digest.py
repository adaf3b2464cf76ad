"""sha256 of files, computed once per process for a given path, size and modification time: the
identity of raw task files, BPE files, binarized splits, GloVe vectors and model checkpoints."""

import hashlib
import os
from typing import Dict

_DIGESTS: Dict[tuple, str] = {}  # (real path, size, mtime) -> sha256


def file_sha256(path) -> str:
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]
