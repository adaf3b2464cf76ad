"""Tensors a GPU run keeps on the host: the optimizer's step counts, a fused group's gradient norms copied to the
host. Training code marks them (``on_host``) where it makes them; the launch counter (``fairseq_idpg.launches``)
counts no kernel for an operator whose tensor arguments are all host tensors. A leaf: the training path marks its
tensors without importing the counter."""

import weakref

_HOST = {}  # id -> weak reference of the host tensors; not a WeakSet: it compares with ==


def on_host(tensor):
    """Mark ``tensor`` as one a GPU run keeps on the host; returns it."""
    key = id(tensor)
    _HOST[key] = weakref.ref(tensor, lambda _: _HOST.pop(key, None))
    return tensor


def is_host(tensor):
    """Whether ``tensor`` (this very object) was marked by ``on_host``."""
    ref = _HOST.get(id(tensor))
    return ref is not None and ref() is tensor
