"""A second count of a training step's operators, by another tracer than ``launches.py``'s: torch.profiler.

``launches.py`` counts in a Python ``TorchDispatchMode`` and makes the CPU follow CUDA's path (dropout and
attention as CUDA's fused kernels). This count reads what the dispatcher itself recorded (the profiler's
RecordFunction events, kept by C++ whatever Python does) and patches nothing: the CPU's own paths. Each
event tree counts its outermost operators that compute, once each:

- an aten operator computes unless it is a view or an allocation (``launches.launches_kernel``: its schema
  says so) or a composite that only decomposes into others (``CompositeImplicitAutograd``: ``linear``,
  ``matmul``, ``dropout``; its parts are counted);
- what a computing operator runs inside is its own work (``clone``'s copy, ``_foreach_add_``'s per-tensor
  loop on the CPU), not counted again.

So the CPU's unfused dropout (``bernoulli_``, ``div_``, ``mul``) and attention with dropout (its math: a dozen
operators) count as several, and the optimizer's step counts (host tensors in a GPU run) count too: a count
above ``launches.py``'s for both sides alike, for a comparison of ours with PEFT's made another way
(docs/launches.md, "A second tracer").

    counts = profiled_launches(lambda: step())
    sum(counts.values()), counts.most_common(5)
"""

from collections import Counter

import torch

from fairseq_idpg.launches import launches_kernel, model_step_count

_COMPUTES = {}


def computes(name) -> bool:
    """Whether aten operator ``name`` (a profiler event's name without ``aten::``) computes (module docstring),
    judged on its overloads that are called (not ``out=`` variants)."""
    if name not in _COMPUTES:
        packet = getattr(torch.ops.aten, name, None)
        called = [getattr(packet, o) for o in packet.overloads() if "out" not in o.split("_")] if packet else []
        own = [op for op in called if not _composite(op)]
        _COMPUTES[name] = bool(own) and all(launches_kernel(op) for op in own)
    return _COMPUTES[name]


def _composite(op):
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
    except RuntimeError:  # a TorchScript-only overload (``to.prim_Device``): never dispatched here
        return True


def outermost_computing(events) -> Counter:
    """{operator: count} of a profile's events (``prof.events()``): each tree's outermost computing operators."""
    counts = Counter()

    def walk(event):
        name = event.name[len("aten::") :] if event.name.startswith("aten::") else None
        if name is not None and computes(name):
            counts[name] += 1
            return
        for child in event.cpu_children:
            walk(child)

    for event in events:
        if event.cpu_parent is None:
            walk(event)
    return counts


def profiled_launches(fn) -> Counter:
    """The computing operators ``fn()`` dispatches, as the profiler recorded them (module docstring)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return outermost_computing(prof.events())


def model_profiled_launches(build, name, shape, layers=None, dtype=torch.bfloat16):
    """``launches.model_launches``' step (the same model, batch, step and warm-up), traced by the profiler: a
    Counter; None where ``build`` gives no model."""
    return model_step_count(build, name, shape, layers, dtype, lambda step, _: profiled_launches(step))
