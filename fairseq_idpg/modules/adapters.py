"""Bottleneck adapters: the Houlsby adapter, the parallel FFN adapter and Compacter.

Each module computes only the adapter's *contribution* f(x) ([..., d] -> [..., d]); where it
is added (after a sublayer, or in parallel with the FFN) is the layer's business
(``adapters_layer.AdaptedEncoderLayer``).

- ``BottleneckAdapter`` (Houlsby et al. 2019; He et al. 2021's parallel adapter):

      f(x) = s * (W_up Dropout(ReLU(W_down x + b_d)) + b_u)     W_down: [r, d], W_up: [d, r]

  2 d r + r + d parameters. ``init="houlsby"``: weights ~ 0.01 * fmod(N(0, 1), 2) (Houlsby
  section 3.6: N(0, 1e-2) truncated at two standard deviations), biases 0, so f is close to 0
  and the layer close to the frozen one. ``init="lora"`` (the parallel FFN adapter of MAM,
  SPEC section 3 and the authors' ``ffn_adapter_init_option=lora``): W_down kaiming-uniform
  (a = sqrt(5)), W_up and both biases 0, so f = 0 exactly at the start. ReLU as in the
  authors' ``Adapter_Layer`` (the code behind the inducer paper's adapter baselines).
- ``CompacterAdapter`` (Karimi Mahabadi et al. 2021, in the IDPG paper's configuration,
  appendix A.1.2): the same bottleneck with both projections PHM layers
  (``phm.PHMLinear``, W = sum_i kron(A_i, s_i t_i), low rank 1) and GELU (Compacter's
  ``gelu_new``). One A set [n, n, n] per adapter, shared by its down- and up-projection:
  that is what the appendix counts (``4^3 x 24 x 2``). Per adapter n^3 + 2 k (d + r) + r + d
  parameters (k = PHM rank); n = 4, r = 16, k = 1, 2 adapters per layer of roberta-large:
  48 x 3,184 = 152,832, the IDPG Table 2 count. The original Compacter shares one A set
  across all layers; the IDPG count does not, and that count is the target here.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .phm import PHMLinear


@torch.no_grad()
def truncated_normal_(tensor, std):
    """``std * fmod(N(0, 1), 2)``: a Gaussian truncated (folded) at two standard deviations."""
    tensor.copy_(torch.fmod(torch.randn_like(tensor), 2.0) * std)
    return tensor


def check_bottleneck(flag, bottleneck, dim):
    """Build-time check: a bottleneck needs 1 <= r <= d."""
    if not 1 <= bottleneck <= dim:
        raise ValueError(f"{flag} must be between 1 and the model dimension {dim}, got {bottleneck}")


class BottleneckAdapter(nn.Module):
    """``f(x) = s * (W_up Dropout(ReLU(W_down x + b_d)) + b_u)``; shapes [..., dim] -> [..., dim]."""

    def __init__(self, dim, bottleneck, scale=1.0, dropout=0.0, init="houlsby"):
        super().__init__()
        check_bottleneck("the adapter bottleneck", bottleneck, dim)
        self.scale = float(scale)
        self.down = nn.Linear(dim, bottleneck)
        self.up = nn.Linear(bottleneck, dim)
        self.dropout = nn.Dropout(dropout)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.bias)
        if init == "houlsby":
            truncated_normal_(self.down.weight, 0.01)
            truncated_normal_(self.up.weight, 0.01)
        elif init == "lora":
            nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
            nn.init.zeros_(self.up.weight)
        else:
            raise ValueError(f"adapter init must be 'houlsby' or 'lora', got {init!r}")

    def forward(self, x):
        h = self.dropout(F.relu(self.down(x)))
        return self.up(h) * self.scale

    def extra_repr(self):
        return f"scale={self.scale}"


class CompacterAdapter(nn.Module):
    """``f(x) = PHM_up(GELU(PHM_down(x)))`` with one shared A set; shapes [..., dim] -> [..., dim].

    Init: A ~ N(0, 0.01^2) (Compacter's ``phm_c_init=normal``, ``phm_init_range=0.01``),
    s_i, t_i Glorot-uniform per Kronecker term (``hypercomplex_nonlinearity=glorot-uniform``),
    biases 0.
    """

    def __init__(self, dim, bottleneck, n=4, rank=1, dropout=0.0):
        super().__init__()
        check_bottleneck("the adapter bottleneck", bottleneck, dim)
        self.A = nn.Parameter(torch.empty(n, n, n).normal_(0, 0.01))
        self.down = PHMLinear(dim, bottleneck, n, shared_A=self.A, rank=rank)
        self.up = PHMLinear(bottleneck, dim, n, shared_A=self.A, rank=rank)
        self.dropout = nn.Dropout(dropout)
        for phm in (self.down, self.up):
            for factor in (phm.s, phm.t) if rank > 0 else (phm.B,):
                for term in factor:  # Glorot per Kronecker term (init only, not in forward)
                    nn.init.xavier_uniform_(term)
            nn.init.zeros_(phm.bias)

    def forward(self, x):
        return self.up(self.dropout(F.gelu(self.down(x))))
