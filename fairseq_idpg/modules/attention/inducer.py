"""Inducer-tuning's tensors and equations for one self-attention layer (inducer-tuning sections
4.3-4.4 and appendix B.3; the equations' exact form follows the authors' released NLU code).

Per head h, with q_i the (unscaled) query of token i after the optional LoRA on W_q, K, V the
ordinary keys and values, d_h the head size:

    MLP_k(q)  = tanh(q A_k + a_k) B_k + b_k           A_k: [d_h, r_k], B_k: [r_k, d_h]  (per head)
    k~_i      = q_i + MLP_k(q_i)                       the inducer, "close to the query" (Eq. 5)
    s_i       = <q_i, k~_i> / sqrt(d_h)
    lambda_i  = exp(s_i) / (exp(s_i) + sum_j exp(q_i . k_j / sqrt(d_h)))
              = sigmoid(s_i - logsumexp_j(q_i . k_j / sqrt(d_h)))          (Eq. 7)
    z_i       = tanh(q_i A_v + a_v)                    A_v: [d_h, r_v] per head
    extended value (section 4.4, Eq. 9 / B.3 Eq. 11; default):
      Delta_i = sum_h lambda_{h,i} z_{h,i} B_v[h] + b_v      B_v[h]: [r_v, d] (fused with that
                                                              head's block of W_o), b_v: [d]
    per-head value (no extension; the "Adaptive" ablation of Table 3):
      v~_{h,i} = z_{h,i} B_v[h] + b_v[h]                      B_v[h]: [r_v, d_h], b_v[h]: [d_h]

Outputs (``attention output`` = W_o concat_h(ctx_h) + b_o, ctx = softmax(q K^T / sqrt(d_h)) V):
    residual (default; the released code, Eq. 8):  ctx_h + lambda_h v~_h  /  output + Delta
    gated (the paper's form; Table 3's "Gating"):    (1 - lambda_h) ctx_h + lambda_h v~_h  /
          W_o concat((1 - lambda_h) ctx_h) + b_o + Delta
    i.e. attention over [k~_i; K] with values [v~_i; V] (extended: the values [z_h B_v[h]; V_h W_o^h]
    in the output space; b_v is an output bias outside the gate, as in the released code).

lambda: padded keys are masked out of the logsumexp (our choice: padding then changes no output;
``mask_lambda=False`` reproduces the released code, which leaves them in); dropout (0.1) on
lambda in training.
The logsumexp is the one ordinary attention already implies: from the softmax P of the
masked scores S, ``logsumexp_j S_j = max_j S_j - log(max_j P_j)`` (exact: P_j = exp(S_j - lse);
the log is of a number >= 1/T), so lambda costs per-query reductions, no extra T x T tensor;
its gradient flows through the softmax the attention keeps anyway.

Parameters per layer: key 2 d r_k + H r_k + d (none for r_k = 0: k~ = q); value
d r_v + H r_v + H r_v d + d (extended) or 2 d r_v + H r_v + d (per head). Every tensor is
initialised 0.01 * fmod(N(0, 1), 2), nothing at zero (the authors' ``Houlsby`` init).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_idpg.errors import ConfigError

from ..adapters.bottleneck import truncated_normal_

OUTPUTS = ("residual", "gated")


class Inducer(nn.Module):
    """Inducer-tuning's per-layer tensors and the maths of lambda and the value term.

    Args:
        dim: d; heads: H (must divide d); key_rank: r_k (0: k~ = q, else >= 2);
        value_rank: r_v (>= 1); extend_value: fuse the value up-projection with W_o (Sec. 4.4);
        output: "residual" (released code) or "gated" (paper); mask_lambda: mask padded keys
        in lambda's normaliser; lambda_dropout: dropout on lambda (0.1).
    Shapes: queries [B, H, T, d_h] (unscaled); lambda [B, H, T].
    """

    def __init__(
        self,
        dim,
        heads,
        key_rank,
        value_rank,
        extend_value=True,
        output="residual",
        mask_lambda=True,
        lambda_dropout=0.1,
    ):
        super().__init__()
        if dim % heads:
            raise ConfigError(f"the head count {heads} must divide the model dimension {dim}")
        if key_rank == 1 or key_rank < 0:
            raise ConfigError(f"inducer key rank must be 0 (k~ = q) or >= 2, got {key_rank}")
        if value_rank < 1:
            raise ConfigError(f"inducer value rank must be >= 1, got {value_rank}")
        if output not in OUTPUTS:
            raise ConfigError(f"inducer output must be one of {OUTPUTS}, got {output!r}")
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.key_rank, self.value_rank = key_rank, value_rank
        self.extend_value, self.output, self.mask_lambda = extend_value, output, mask_lambda
        self.lambda_dropout = lambda_dropout
        H, dh = heads, self.head_dim
        if key_rank:
            self.key_A = nn.Parameter(torch.empty(H, dh, key_rank))
            self.key_a = nn.Parameter(torch.empty(H, key_rank))
            self.key_B = nn.Parameter(torch.empty(H, key_rank, dh))
            self.key_b = nn.Parameter(torch.empty(H, dh))
        self.value_A = nn.Parameter(torch.empty(H, dh, value_rank))
        self.value_a = nn.Parameter(torch.empty(H, value_rank))
        if extend_value:
            self.value_B = nn.Parameter(torch.empty(H, value_rank, dim))
            self.value_b = nn.Parameter(torch.empty(dim))
        else:
            self.value_B = nn.Parameter(torch.empty(H, value_rank, dh))
            self.value_b = nn.Parameter(torch.empty(H, dh))
        for p in self.parameters():
            truncated_normal_(p, 0.01)

    # ------------------------------------------------------------------ the attention_output slot
    def attend(self, q, ctx, scores, raw_scores, probs, pad, scaling):
        """Lambda and the value term, for ``AugmentedSelfAttention``'s ``attention_output`` slot.

        q: [B, H, T, d_h] (unscaled); ctx = Dropout(P) V [B, H, T, d_h]; scores: S with padded keys
        at -inf, raw_scores: S unmasked, [B, H, T, S]; probs: P = softmax(S) in float32 or wider;
        pad: [B, S] (True at padding) or None. Returns (ctx, Delta [T, B, d] or None): the gated
        output scales ctx by 1 - lambda; the per-head value adds lambda v~ to ctx, the extended one
        returns Delta for the output projection.
        """
        if self.mask_lambda or pad is None:
            # logsumexp of the masked scores from the softmax already computed (module docstring)
            # the subtraction promotes the max to probs' dtype inside its kernel (exact): no cast of its own
            lse = scores.max(dim=-1).values - torch.log(probs.max(dim=-1).values)
        else:  # the released code: padded keys stay in lambda's normaliser
            lse = torch.logsumexp(raw_scores.to(probs.dtype), dim=-1)
        lam = self.gate(self.inducer_scores(q, scaling), lse, q.dtype)  # [B, H, T]
        z = self.value_hidden(q)  # [B, H, T, r_v]
        if self.output == "gated":
            ctx = ctx * (1 - lam).unsqueeze(-1)
        if self.extend_value:
            return ctx, self.extended_delta(z, lam)
        return ctx + lam.unsqueeze(-1) * self.per_head_values(z), None

    # ------------------------------------------------------------------ lambda
    def inducer_scores(self, q, scaling):
        """s = <q, k~> * scaling with k~ = q + MLP_k(q): [B, H, T, d_h] -> [B, H, T] (float32 or wider)."""
        k = q
        if self.key_rank:
            h = torch.tanh(torch.einsum("bhtd,hdr->bhtr", q, self.key_A.to(q.dtype)) + self.key_a.to(q.dtype)[:, None])
            k = q + torch.einsum("bhtr,hrd->bhtd", h, self.key_B.to(q.dtype)) + self.key_b.to(q.dtype)[:, None]
        acc = torch.promote_types(q.dtype, torch.float32)  # |q|^2 summed over d_h: keep fp16 from overflowing
        # k is promoted to acc inside the multiply (exact, as a cast would be): one cast kernel less
        return (q.to(acc) * k).sum(-1) * scaling

    def gate(self, s, lse, dtype):
        """lambda = Dropout(sigmoid(s - lse)), computed in (at least) float32; returned in ``dtype``."""
        acc = torch.promote_types(lse.dtype, torch.float32)
        lam = torch.sigmoid(s.to(acc) - lse.to(acc)).to(dtype)
        return F.dropout(lam, self.lambda_dropout, self.training)

    # ------------------------------------------------------------------ value term
    def value_hidden(self, q):
        """z = tanh(q A_v + a_v): [B, H, T, d_h] -> [B, H, T, r_v]."""
        hidden = torch.einsum("bhtd,hdr->bhtr", q, self.value_A.to(q.dtype))
        return torch.tanh(hidden + self.value_a.to(q.dtype)[:, None])

    def per_head_values(self, z):
        """v~ = z B_v[h] + b_v[h] (no extension): [B, H, T, r_v] -> [B, H, T, d_h]."""
        return torch.einsum("bhtr,hrd->bhtd", z, self.value_B.to(z.dtype)) + self.value_b.to(z.dtype)[:, None]

    def extended_delta(self, z, lam):
        """Delta = sum_h lambda_h z_h B_v[h] + b_v: ([B, H, T, r_v], [B, H, T]) -> [T, B, d].

        One [T B, H r_v] x [H r_v, d] product: the sum over heads is part of the matmul.
        """
        bsz, heads, tgt_len, rank = z.shape
        weighted = (lam.unsqueeze(-1) * z).permute(2, 0, 1, 3).reshape(tgt_len, bsz, heads * rank)
        up = self.value_B.to(z.dtype).reshape(heads * rank, self.dim)
        return torch.matmul(weighted, up) + self.value_b.to(z.dtype)

    def extra_repr(self):
        value = "extended" if self.extend_value else "per-head"
        return (
            f"heads={self.heads}, key_rank={self.key_rank}, value_rank={self.value_rank} ({value}), "
            f"output={self.output}, mask_lambda={self.mask_lambda}, lambda_dropout={self.lambda_dropout}"
        )
