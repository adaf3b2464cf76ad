"""Fused attention for K members under ``torch.func.vmap``: the members folded into the kernel's batch.

``StackedMembers`` runs K members of a method in one forward by vmapping the model over them. torch's fused
attention kernels have no batching rule on every device, so under vmap ``F.scaled_dot_product_attention``
either loops over the members or, restricted to its maths, materialises every member's T x S scores and runs
a dozen operators each way per layer. Inside ``folded_members(seed)``, ``AugmentedSelfAttention`` calls
``attention`` instead: a custom operator whose batching rule reshapes q, k, v and the mask from [K, B, H, T, d]
to [K x B, H, T, d] and calls the fused kernel once for all members; its backward (a second custom operator,
batched the same way) recomputes the fused forward under autograd and returns the kernel's own gradients: two
kernels (a GPU launches one more than a lone backward; the recomputed attention is ~2% of a layer's arithmetic
at T = 128).

Dropout: the forward and its recomputation draw the same masks from the seed ``seed + layer`` (the caller's
``folded_members`` seed, drawn outside vmap from torch's generator, so a seeded run repeats its masks); each
row of the folded batch draws its own.

Outside ``folded_members`` (a lone run, serving one task) nothing changes: ``attention_function`` returns
``F.scaled_dot_product_attention``.
"""

import contextlib
import functools
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

_seed = None  # folded_members' seed, when inside it


@contextlib.contextmanager
def folded_members(seed: int):
    """Run the attention of the vmapped forward inside as one fused kernel over all members (module doc)."""
    global _seed
    previous, _seed = _seed, seed
    try:
        yield
    finally:
        _seed = previous


def attention_function(layer_index: int):
    """``F.scaled_dot_product_attention``'s signature: the folded operator inside ``folded_members``, else
    torch's own."""
    if _seed is None:
        return F.scaled_dot_product_attention
    return functools.partial(_attention_call, seed=_seed + layer_index)


def _attention_call(q, k, v, attn_mask=None, dropout_p=0.0, scale=None, seed=0):
    return attention(q, k, v, attn_mask, float(dropout_p), float(scale), int(seed))


def _any_kernel():
    """Every SDPA backend allowed inside the operators (``StackedMembers`` restricts the vmapped model's other
    attention calls to the maths)."""
    return sdpa_kernel(_BACKENDS)


_BACKENDS = [
    getattr(SDPBackend, name)
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
    if hasattr(SDPBackend, name)
]


@contextlib.contextmanager
def _seeded(seed, dropout_p, device):
    if dropout_p == 0.0:  # no draw: the generator is not touched
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def _autograd_inside():
    """Autograd back on inside an operator's body, which runs with it excluded (the rest of the dispatch state,
    autocast's included, as it is)."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in _AUTOGRAD_KEYS:
        exclude = exclude.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


_AUTOGRAD_KEYS = [
    getattr(torch._C.DispatchKey, name)
    for name in ("AutogradFunctionality", "AutogradOther", "AutogradNestedTensor", "ADInplaceOrView")
    if hasattr(torch._C.DispatchKey, name)
]


@torch.library.custom_op("fairseq_idpg::folded_attention", mutates_args=())
def attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float, scale: float, seed: int
) -> Tensor:
    """q [B, H, T, d], k and v [B, H, S, d], mask broadcastable to [B, H, T, S] -> [B, H, T, d_v]."""
    with _any_kernel(), _seeded(seed, dropout_p, q.device):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


@attention.register_fake
def _(q, k, v, mask, dropout_p, scale, seed):
    return q.new_empty(*q.shape[:-1], v.size(-1))


@torch.library.custom_op("fairseq_idpg::folded_attention_backward", mutates_args=())
def attention_backward(
    grad: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float, scale: float, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of ``attention`` for q, k and v: the forward recomputed with the same dropout masks."""

    with _autograd_inside(), torch.enable_grad(), _any_kernel(), _seeded(seed, dropout_p, q.device):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
        return torch.autograd.grad(out, (q, k, v), grad)


@attention_backward.register_fake
def _(grad, q, k, v, mask, dropout_p, scale, seed):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, mask, dropout_p, scale, seed = inputs
    ctx.save_for_backward(q, k, v, mask)
    ctx.settings = (dropout_p, scale, seed)


def _backward(ctx, grad):
    q, k, v, mask = ctx.saved_tensors
    return (*attention_backward(grad, q, k, v, mask, *ctx.settings), None, None, None, None)


attention.register_autograd(_backward, setup_context=_setup_context)


def _members_first(info, in_dims, tensors):
    """Each tensor with the vmapped (member) dimension first, [K, ...] (an unbatched one expanded)."""
    out = []
    for t, dim in zip(tensors, in_dims, strict=True):
        if t is not None:
            t = t.unsqueeze(0).expand(info.batch_size, *t.shape) if dim is None else t.movedim(dim, 0)
        out.append(t)
    return out


def _fold(t):
    return None if t is None else t.reshape(-1, *t.shape[2:])  # [K, B, ...] -> [K x B, ...]


def _mask_rows(mask, q):
    """The mask [K, ...] broadcast to q's [K, B, ...] leading dimensions (it may broadcast over B)."""
    if mask is None:
        return None
    while mask.dim() < q.dim():
        mask = mask.unsqueeze(1)
    return mask.expand(*q.shape[:2], *mask.shape[2:])


@attention.register_vmap
def _(info, in_dims, q, k, v, mask, dropout_p, scale, seed):
    q, k, v, mask = _members_first(info, in_dims[:4], (q, k, v, mask))
    mask = _mask_rows(mask, q)
    out = attention(_fold(q), _fold(k), _fold(v), _fold(mask), dropout_p, scale, seed)
    return out.unflatten(0, (info.batch_size, -1)), 0


@attention_backward.register_vmap
def _(info, in_dims, grad, q, k, v, mask, dropout_p, scale, seed):
    grad, q, k, v, mask = _members_first(info, in_dims[:5], (grad, q, k, v, mask))
    mask = _mask_rows(mask, q)
    grads = attention_backward(_fold(grad), _fold(q), _fold(k), _fold(v), _fold(mask), dropout_p, scale, seed)
    return tuple(g.unflatten(0, (info.batch_size, -1)) for g in grads), (0, 0, 0)
