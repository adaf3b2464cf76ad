"""The IDPG prompt generator G (IDPG section 3.1, Eq. 1-4).

Row-vector convention (y = x W + b):

    u   = Dropout(M(x))                       [B, d_in]     ``prepare``      (M(x): Eq. 1's input)
    h   = Dropout(GELU(u W1 + b1))            W1: [d_in, m], b1: [m]
    P_k = (h W2 + c_k).view(B, t, d)          W2: [m, t*d],  c_k: [t*d]       ``forward``

- ``kind="dnn"``: W1, W2 dense, N(0, 0.02^2); b1 = 0 (the authors' ``init_bert_params``).
- ``kind="phm"``: W1, W2 are PHM layers (Eq. 4: W = sum_i kron(A_i, B_i), ``modules/phm.py``);
  A, B, b1 ~ N(0, 0.05^2). ``phm_a_sets`` = 1: one A set shared by W1 and W2 (S-IDPG-PHM,
  n^3 once); 2: one A set per generator layer (M-IDPG-PHM, 2 n^3). n must divide d_in, m, t*d.
- c_k ~ N(0, 0.02^2) (the authors' effective start; ``bias_init``: ``LayerBiases``, K biases, optionally
  low-rank). With W1 = W2 = 0 the
  generator returns exactly c_k for every example: prompt tuning (K = 1) or P-tuning v2 (K = L)
  (IDPG section 3.1, "by setting W to a zero matrix and only training the bias, IDPG would
  degenerate into the traditional prompt tuning"); those static prompts themselves are
  ``soft_prompts.FullPrompt`` (``--arch roberta_prompt``).

Appendix A.5.1 ablations (Table 7), single-layer generators:
``residual``: P_j = G_j + u (the sentence representation added to each generated token; needs
d_in = d); ``layer_norm``: P = LN(G); both: P = LN(LN(u) + LN(G)) ("we apply LayerNorm to each
embedding first, then after the add-up, use LayerNorm again").

The dense weights are formed once per model forward (``weights()``) and reused for every layer
of a multi-layer model (the PHM Kronecker sums are the costly part of a PHM layer).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_idpg.errors import ConfigError

from ..phm import PHMLinear
from .layer_biases import LayerBiases

KINDS = ("dnn", "phm")


class PromptGenerator(nn.Module):
    """G: [B, d_in] -> [B, t, d] prompts; see the module docstring.

    Args:
        input_dim: d_in (d for RoBERTa's M(x), 300 for GloVe).
        embed_dim: d.  prompt_length: t.  hidden_dim: m.
        kind: "dnn" or "phm".
        phm_n: n of Eq. 4.  phm_a_sets: 1 (shared by W1, W2) or 2 (one per layer of G).
        num_biases: K output biases c_0..c_{K-1}.  layer_bias_rank: r (see ``LayerBiases``).
        dropout: the generator's dropout (on M(x) and on h).
        residual, layer_norm: the A.5.1 ablations.
        bias_init: how c starts (``layer_biases.INITS``).
    """

    def __init__(
        self,
        input_dim,
        embed_dim,
        prompt_length,
        hidden_dim=16,
        kind="phm",
        phm_n=16,
        phm_a_sets=2,
        num_biases=1,
        layer_bias_rank=0,
        dropout=0.1,
        residual=False,
        layer_norm=False,
        bias_init="normal",
    ):
        super().__init__()
        if kind not in KINDS:
            raise ConfigError(f"--idpg-generator must be one of {', '.join(KINDS)}, got {kind!r}")
        self.kind, self.input_dim, self.embed_dim, self.t = kind, input_dim, embed_dim, prompt_length
        out = prompt_length * embed_dim
        if kind == "dnn":
            self.W1 = nn.Parameter(torch.empty(input_dim, hidden_dim).normal_(0, 0.02))
            self.b1 = nn.Parameter(torch.zeros(hidden_dim))
            self.W2 = nn.Parameter(torch.empty(hidden_dim, out).normal_(0, 0.02))
        else:
            self.phm1 = PHMLinear(input_dim, hidden_dim, phm_n, bias=True)
            shared = self.phm1 if phm_a_sets == 1 else None
            self.phm2 = PHMLinear(hidden_dim, out, phm_n, A_from=shared, bias=False)
        self.biases = LayerBiases(num_biases, out, rank=layer_bias_rank, init=bias_init)
        self.dropout = nn.Dropout(dropout)
        self.residual = residual
        if layer_norm:
            self.norm = nn.LayerNorm(embed_dim)
            if residual:
                self.norm_input = nn.LayerNorm(embed_dim)
                self.norm_generated = nn.LayerNorm(embed_dim)
        else:
            self.norm = None

    def weights(self):
        """Dense (W1 [d_in, m], b1 [m], W2 [m, t*d])."""
        if self.kind == "dnn":
            return self.W1, self.b1, self.W2
        return self.phm1.weight(), self.phm1.bias, self.phm2.weight()

    def prepare(self, mx):
        """u = Dropout(M(x)), computed once per forward (the layer-0 input of every layer)."""
        return self.dropout(mx)

    def forward(self, x, index=0, weights=None, biases=None):
        """Prompt P_index: [B, t, d] from the generator input x [B, d_in] (already dropped out
        for M(x); a layer's ``<s>`` state as is).

        ``weights`` / ``biases``: from ``weights()`` / ``self.biases()`` (or its rows, unbound) when the
        caller reuses them across layers."""
        biases = self.biases() if biases is None else biases
        c = biases[index]
        W1, b1, W2 = self.weights() if weights is None else weights
        dtype = x.dtype
        h = self.dropout(F.gelu(torch.addmm(b1.to(dtype), x, W1.to(dtype))))
        p = torch.addmm(c.to(dtype), h, W2.to(dtype)).view(x.size(0), self.t, self.embed_dim)
        if self.residual and self.norm is not None:
            return self.norm(self.norm_input(x).unsqueeze(1) + self.norm_generated(p))
        if self.residual:
            return p + x.unsqueeze(1)
        if self.norm is not None:
            return self.norm(p)
        return p

    def extra_repr(self):
        return f"kind={self.kind}, input_dim={self.input_dim}, t={self.t}, d={self.embed_dim}, residual={self.residual}"
