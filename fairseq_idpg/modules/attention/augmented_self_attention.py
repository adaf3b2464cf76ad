"""``AugmentedSelfAttention``: fairseq's encoder self-attention with slots for trained blocks
(``modules/slots.py``), in one forward pass:

- ``keys_values``: key/value prefixes (prefix tuning, Li & Liang 2021; the MAM adapter of He et al.
  2021), from a ``prefix.PrefixEncoder`` owned by the model and shared by the layers;
- ``q``, ``k``, ``v``: hooks on the projections' outputs, ``y = block.project(x, y)`` (LoRA on W_q,
  inducer-tuning section 4.5, Eq. 10, and on W_v, Hu et al. 2021);
- ``attention_output``: a block that reads the scores and changes the heads' context and the
  output (``inducer.Inducer``: inducer keys, lambda and the value term; inducer-tuning sections
  4.3-4.4, Eqs. 5-9).

``AugmentedSelfAttention.convert(layer.self_attn, i)`` turns a frozen fairseq ``MultiheadAttention``
into this class in place: the same object keeps its q/k/v/out projections (the same frozen
Parameter objects, under the same names, so the backbone stays loaded and frozen) and fairseq's
settings (heads, scaling, attention dropout); ``attach(slot, name, block)`` adds the blocks as
submodules, and they train. This forward always runs: fairseq's own forward would hand the
projections' weights to ``F.multi_head_attention_forward`` and bypass the blocks.

Computation (x: [T, B, d], time first as in fairseq; heads laid out [B, H, T, d_h]):

    q = W_q x + b_q, then each q-slot block (LoRA: + (alpha / r) B A x); k, v likewise
    K, V = [P_k; k], [P_v; v]                      (keys_values; prefixes of length l; never masked)
    without an attention_output block: ctx = SDPA(q, K, V)   (torch's fused attention, padding masked)
    with one:        S = q K^T / sqrt(d_h) (padded keys -inf); P = softmax(S) (float32, as
                     fairseq); ctx = Dropout(P) V; then the block (the inducer's lambda, from
                     lse = max S - log max P, and its value term); out = W_o ctx + b_o (+ Delta)

The explicit path builds the same T x T tensors as fairseq's own non-fused attention (scores,
masked scores, float32 softmax, dropout); the inducer adds only [B, H, T] vectors.

Every layer of a forward gets the same padding-mask tensor, so what is derived from it (the mask widened
by the prefixes, SDPA's boolean mask) is built once per forward, for the first layer, and kept while that
tensor lives (``derived_mask``), not rebuilt in every layer (a kernel launch each on a GPU).
"""

import torch
import torch.nn.functional as F
from fairseq.modules.multihead_attention import MultiheadAttention
from torch.utils.weak import WeakTensorKeyDictionary

from ..slots import ATTENTION_SLOTS, Slots
from .folded import attention_function

_DERIVED_MASKS = WeakTensorKeyDictionary()  # padding mask -> {what: mask derived from it} (module docstring)


def derived_mask(padding_mask, what, build):
    """``build()``, the mask ``what`` derived from ``padding_mask``, built once while ``padding_mask`` lives
    (built every time in a compiled layer, ``--compile-layers``: the compiler cannot trace the weak-keyed cache,
    and would split the layer's graph there)."""
    if torch.compiler.is_compiling():
        return build()
    masks = _DERIVED_MASKS.setdefault(padding_mask, {})
    if what not in masks:
        masks[what] = build()
    return masks[what]


class AugmentedSelfAttention(Slots, MultiheadAttention):
    """See the module docstring. Built only by ``convert``; encoder self-attention only."""

    SLOTS = ATTENTION_SLOTS

    @classmethod
    def convert(cls, attention, layer_index):
        """Make ``attention`` (a fairseq self-attention) an ``AugmentedSelfAttention`` in place, with
        empty slots; ``layer_index``: 0-based layer number (selects the layer's prefixes)."""
        if not isinstance(attention, MultiheadAttention) or not attention.self_attention:
            raise TypeError(f"expected fairseq's self-attention MultiheadAttention, got {type(attention).__name__}")
        if not isinstance(attention, cls):
            attention.__class__ = cls  # in place: same Parameter objects, names and fairseq settings
            attention.layer_index = layer_index
            attention.init_slots()
        return attention

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        query,
        key=None,
        value=None,
        key_padding_mask=None,
        incremental_state=None,
        need_weights=False,
        static_kv=False,
        attn_mask=None,
        before_softmax=False,
        need_head_weights=False,
    ):
        """fairseq's signature; returns (output [T, B, d], head-averaged weights [B, T, S] or None)."""
        if incremental_state is not None or static_kv or before_softmax:
            raise NotImplementedError("AugmentedSelfAttention is an encoder self-attention (no incremental state)")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, dim = query.shape
        q, k, v = self._heads(query)  # [B, H, T, d_h]
        k, v, attn_mask, length = self._prepend_prefixes(k, v, attn_mask, q.dtype)
        pad = self._padding(key_padding_mask, length)
        dropout_p = self.dropout_module.p if (self.training or self.dropout_module.apply_during_inference) else 0.0

        output_blocks = self.attached("attention_output")
        if not output_blocks and not need_weights:  # nothing reads the scores: torch's fused attention
            mask = self._fused_mask(q, k, pad, attn_mask, key_padding_mask, length)
            attention = attention_function(self.layer_index)  # torch's, or folded over vmapped members
            ctx = attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.scaling)
            weights, deltas = None, []
        else:
            scores, raw, probs_float, ctx = self._explicit_attention(q, k, v, pad, attn_mask, dropout_p)
            weights = self._returned_weights(probs_float, need_weights, need_head_weights)
            ctx, deltas = self._attend(output_blocks, q, ctx, scores, raw, probs_float, pad)

        out = self.out_proj(ctx.permute(2, 0, 1, 3).reshape(tgt_len, bsz, dim))
        for delta in deltas:
            out = out + delta
        return out, weights

    def _heads(self, x):
        """q, k, v of x [T, B, d] through their slots' blocks, each split into heads [B, H, T, d_h]."""
        tgt_len, bsz, _ = x.shape
        q, k, v = (self._project(slot, x) for slot in ("q", "k", "v"))
        return tuple(t.view(tgt_len, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3) for t in (q, k, v))

    def _prepend_prefixes(self, k, v, attn_mask, dtype):
        """k, v [B, H, S, d_h] with each keys_values block's prefixes (cast to ``dtype``, the queries') in
        front, attn_mask [T, S] widened to match (prefixes are never masked), and the prefixes' length."""
        bsz, heads, _, head_dim = k.shape
        total = 0
        for block in self.attached("keys_values"):
            pk, pv = block.layer_kv(self.layer_index)  # [l, d] each
            length = pk.size(0)
            pk, pv = (
                p.to(dtype).view(length, heads, head_dim).transpose(0, 1).expand(bsz, -1, -1, -1) for p in (pk, pv)
            )  # [B, H, l, d_h]
            k, v = torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)
            if attn_mask is not None:
                attn_mask = torch.cat([attn_mask.new_zeros(attn_mask.size(0), length), attn_mask], dim=1)
            total += length
        return k, v, attn_mask, total

    @staticmethod
    def _padding(key_padding_mask, length):
        """The padding mask [B, S] as booleans, widened by ``length`` prefix positions in front (never masked);
        None without one. Built once per forward (``derived_mask``)."""
        if key_padding_mask is None:
            return None

        def build():
            pad = key_padding_mask.bool()
            return torch.cat([pad.new_zeros(pad.size(0), length), pad], dim=1) if length else pad

        return derived_mask(key_padding_mask, ("padding", length), build)

    @staticmethod
    def _fused_mask(q, k, pad, attn_mask, key_padding_mask, length):
        """SDPA's mask: attn_mask (additive [T, S]; fairseq converts masks to large negatives) with padded
        keys at -inf, or the padding alone as a boolean mask (True = attend; once per forward), or None."""
        if attn_mask is not None:
            mask = attn_mask.to(q.dtype)[None, None].expand(q.size(0), 1, q.size(2), k.size(2))
            if pad is not None:
                mask = mask.masked_fill(pad[:, None, None, :], float("-inf"))
            return mask
        if pad is not None:
            return derived_mask(key_padding_mask, ("attend", length), lambda: ~pad[:, None, None, :])
        return None

    def _explicit_attention(self, q, k, v, pad, attn_mask, dropout_p):
        """(scores, raw, probs_float, ctx): the masked scores [B, H, T, S], those before padding's -inf,
        their softmax in (at least) float32, and the heads' context [B, H, T, d_h]."""
        scores = torch.matmul(q * self.scaling, k.transpose(-1, -2))  # [B, H, T, S]
        if attn_mask is not None:
            scores = scores + attn_mask.to(scores.dtype)
        raw = scores
        if pad is not None:
            scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
        # softmax in (at least) float32 under fp16/bf16, as fairseq's attention does
        probs_float = F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
        probs = probs_float.type_as(scores)
        ctx = torch.matmul(F.dropout(probs, dropout_p, True), v)  # [B, H, T, d_h]
        return scores, raw, probs_float, ctx

    @staticmethod
    def _returned_weights(probs_float, need_weights, need_head_weights):
        """fairseq's returned weights: head-averaged [B, T, S], per head [H, B, T, S], or None."""
        if not need_weights:
            return None
        return probs_float.mean(dim=1) if not need_head_weights else probs_float.transpose(0, 1)

    def _attend(self, output_blocks, q, ctx, scores, raw, probs_float, pad):
        """ctx through the attention_output blocks, and the output deltas [T, B, d] they return."""
        deltas = []
        for block in output_blocks:
            ctx, delta = block.attend(q, ctx, scores, raw, probs_float, pad, self.scaling)
            if delta is not None:
                deltas.append(delta)
        return ctx, deltas

    def _project(self, slot, x):
        """The projection of ``slot`` ("q", "k" or "v") of x [T, B, d], through the blocks attached there."""
        y = getattr(self, f"{slot}_proj")(x)
        for block in self.attached(slot):
            y = block.project(x, y)
        return y

    def extra_repr(self):
        attached = ", ".join(f"{slot}={'+'.join(names)}" for slot, names in self.slots.items() if names)
        return f"layer={self.layer_index}, heads={self.num_heads}" + (f", {attached}" if attached else "")
