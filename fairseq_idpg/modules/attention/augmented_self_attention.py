"""``AugmentedSelfAttention``: fairseq's encoder self-attention with any of the attention-side
blocks, in one forward pass:

- key/value prefixes (prefix tuning, Li & Liang 2021; the MAM adapter of He et al. 2021), from a
  ``prefix.PrefixEncoder`` owned by the model and shared by the layers;
- LoRA on W_q (inducer-tuning + LoRA, inducer-tuning section 4.5, Eq. 10) and on W_v (the LoRA
  baseline, Hu et al. 2021);
- an inducer (``inducer.Inducer``: inducer keys, lambda and the value term; inducer-tuning
  sections 4.3-4.4, Eqs. 5-9).

``AugmentedSelfAttention.convert(layer.self_attn, ...)`` turns a frozen fairseq
``MultiheadAttention`` into this class in place: the same object keeps its q/k/v/out
projections (the same frozen Parameter objects, under the same names, so the backbone stays
loaded and frozen) and fairseq's settings (heads, scaling, attention dropout); the blocks are
added as submodules and train. This forward always runs: fairseq's own forward would hand the
projections' weights to ``F.multi_head_attention_forward`` and bypass the blocks.

Computation (x: [T, B, d], time first as in fairseq; heads laid out [B, H, T, d_h]):

    q = W_q x + b_q (+ LoRA_q(x)),  k = W_k x + b_k,  v = W_v x + b_v (+ LoRA_v(x))
    K, V = [P_k; k], [P_v; v]                      (prefixes of length l; never masked)
    without inducer: ctx = SDPA(q, K, V)          (torch's fused attention, padding masked)
    with inducer:    S = q K^T / sqrt(d_h) (padded keys -inf); P = softmax(S) (float32, as
                     fairseq); lse = max S - log max P; ctx = Dropout(P) V; then lambda and the
                     value term (``inducer.Inducer``); out = W_o ctx + b_o (+ Delta)

The inducer path builds the same T x T tensors as fairseq's own non-fused attention (scores,
masked scores, float32 softmax, dropout); lambda adds only [B, H, T] vectors.
"""

import torch
import torch.nn.functional as F
from fairseq.modules.multihead_attention import MultiheadAttention

from .lora import merge_lora


class AugmentedSelfAttention(MultiheadAttention):
    """See the module docstring. Built only by ``convert``; encoder self-attention only."""

    @classmethod
    def convert(cls, attention, layer_index, inducer=None, lora_q=None, lora_v=None, prefix=None):
        """Make ``attention`` (a fairseq self-attention) an ``AugmentedSelfAttention`` in place.

        Args:
            layer_index: 0-based layer number (selects the layer's prefixes).
            inducer: an ``Inducer`` or None; lora_q, lora_v: ``LoRA`` modules or None;
            prefix: the model's ``PrefixEncoder`` or None (not registered here: the model owns it).
        """
        if not isinstance(attention, MultiheadAttention) or not attention.self_attention:
            raise TypeError(f"expected fairseq's self-attention MultiheadAttention, got {type(attention).__name__}")
        if inducer is not None and (inducer.dim, inducer.heads) != (attention.embed_dim, attention.num_heads):
            raise ValueError(
                f"inducer built for d={inducer.dim}, H={inducer.heads}; "
                f"attention has d={attention.embed_dim}, H={attention.num_heads}"
            )
        attention.__class__ = cls  # in place: same Parameter objects, names and fairseq settings
        attention.layer_index = layer_index
        attention.inducer = inducer
        attention.lora_q = lora_q
        attention.lora_v = lora_v
        attention._prefix = [prefix] if prefix is not None else []  # a list: not a submodule
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
        heads, head_dim = self.num_heads, self.head_dim

        x = query
        q = self.q_proj(x)
        if self.lora_q is not None:
            q = q + self.lora_q(x)
        k = self.k_proj(x)
        v = self.v_proj(x)
        if self.lora_v is not None:
            v = v + self.lora_v(x)
        q, k, v = (t.view(tgt_len, bsz, heads, head_dim).permute(1, 2, 0, 3) for t in (q, k, v))  # [B, H, T, d_h]

        pad = key_padding_mask.bool() if key_padding_mask is not None else None
        if self._prefix:
            pk, pv = self._prefix[0].layer_kv(self.layer_index)  # [l, d] each
            length = pk.size(0)
            pk, pv = (
                p.to(q.dtype).view(length, heads, head_dim).transpose(0, 1).expand(bsz, -1, -1, -1) for p in (pk, pv)
            )  # [B, H, l, d_h]
            k, v = torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)
            if pad is not None:
                pad = torch.cat([pad.new_zeros(bsz, length), pad], dim=1)
            if attn_mask is not None:
                attn_mask = torch.cat([attn_mask.new_zeros(attn_mask.size(0), length), attn_mask], dim=1)
        src_len = k.size(2)
        dropout_p = self.dropout_module.p if (self.training or self.dropout_module.apply_during_inference) else 0.0

        weights = None
        if self.inducer is None and not need_weights:
            mask = None
            if attn_mask is not None:  # additive [T, S] (fairseq converts masks to large negatives)
                mask = attn_mask.to(q.dtype)[None, None].expand(bsz, 1, tgt_len, src_len)
                if pad is not None:
                    mask = mask.masked_fill(pad[:, None, None, :], float("-inf"))
            elif pad is not None:
                mask = ~pad[:, None, None, :]  # True = attend
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.scaling)
        else:
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
            if need_weights:
                weights = probs_float.mean(dim=1) if not need_head_weights else probs_float.transpose(0, 1)

        delta = None
        if self.inducer is not None:
            ind = self.inducer
            if ind.mask_lambda or pad is None:
                # logsumexp of the masked scores from the softmax already computed (module docstring)
                lse = scores.max(dim=-1).values.to(probs_float.dtype) - torch.log(probs_float.max(dim=-1).values)
            else:  # the released code: padded keys stay in lambda's normaliser
                lse = torch.logsumexp(raw.to(probs_float.dtype), dim=-1)
            lam = ind.gate(ind.inducer_scores(q, self.scaling), lse, q.dtype)  # [B, H, T]
            z = ind.value_hidden(q)  # [B, H, T, r_v]
            if ind.output == "gated":
                ctx = ctx * (1 - lam).unsqueeze(-1)
            if ind.extend_value:
                delta = ind.extended_delta(z, lam)  # [T, B, d]
            else:
                ctx = ctx + lam.unsqueeze(-1) * ind.per_head_values(z)

        out = self.out_proj(ctx.permute(2, 0, 1, 3).reshape(tgt_len, bsz, dim))
        if delta is not None:
            out = out + delta
        return out, weights

    # ------------------------------------------------------------------ inference
    def merge_lora(self):
        """Fold the LoRA updates into W_q / W_v (changes the backbone tensors: for inference)."""
        if self.lora_q is not None:
            merge_lora(self.q_proj, self.lora_q)
            self.lora_q = None
        if self.lora_v is not None:
            merge_lora(self.v_proj, self.lora_v)
            self.lora_v = None

    def extra_repr(self):
        return f"layer={self.layer_index}, heads={self.num_heads}, prefix={'yes' if self._prefix else 'no'}"
