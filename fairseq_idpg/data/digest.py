"""sha256 of files, computed once per process for a given path, size and modification time: the
identity of raw task files, BPE files, binarized splits, GloVe vectors and model checkpoints."""

import hashlib
import os
from typing import Dict, Optional

_DIGESTS: Dict[tuple, str] = {}  # (real path, size, mtime) -> sha256
_WEIGHTS: Dict[tuple, Optional[str]] = {}  # (real path, size, mtime) -> sha256 of the checkpoint's tensors


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


def weights_sha256(path) -> Optional[str]:
    """sha256 of a fairseq checkpoint's weights (``state["model"]``: each tensor's name, dtype, shape and
    bytes, in name order), not of its file: two saves of the same tensors are the same backbone even
    where the file's bytes differ (torch.save's record names, the model folder's path that fairseq keeps
    in the checkpoint's cfg), as every build of the stand-in's did. None: the file holds no weights."""
    import torch

    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _WEIGHTS:
        import zipfile

        # mmap (no copy in memory) needs torch's zip format; fairseq's released checkpoints are the older one
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=zipfile.is_zipfile(path)).get("model")
        if not isinstance(state, dict):
            _WEIGHTS[key] = None
            return None
        digest = hashlib.sha256()
        for name in sorted(state):
            tensor = state[name].detach().cpu()
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
            # flat first: a 0-dim tensor (a scalar buffer) cannot be viewed as bytes
            digest.update(tensor.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        _WEIGHTS[key] = digest.hexdigest()
    return _WEIGHTS[key]
