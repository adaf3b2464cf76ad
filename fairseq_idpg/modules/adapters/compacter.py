"""``CompacterAdapter`` (Karimi Mahabadi et al. 2021, in the IDPG paper's configuration, IDPG
appendix A.1.2): the bottleneck adapter of ``bottleneck.py`` with both projections PHM layers
(``phm.PHMLinear``, W = sum_i kron(A_i, s_i t_i), low rank 1) and exact GELU (Compacter's released
config names ``gelu_new``, the tanh approximation, which differs by at most 4.7e-4; the IDPG paper
does not say which its baseline used).

    f(x) = PHM_up(Dropout(GELU(PHM_down(x))))          [..., d] -> [..., d]

One A set [n, n, n] per adapter, shared by its down- and up-projection: that is what the appendix
counts (``4^3 x 24 x 2``). Per adapter n^3 + 2 k (d + r) + r + d parameters (k = PHM rank);
n = 4, r = 16, k = 1, 2 adapters per layer of roberta-large: 48 x 3,184 = 152,832, the IDPG
Table 2 count. The original Compacter shares one A set across all layers; the IDPG count does
not, and that count is the target here.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_idpg.errors import ConfigError

from ..phm import PHMLinear
from .bottleneck import check_bottleneck


class CompacterAdapter(nn.Module):
    """``f(x) = PHM_up(GELU(PHM_down(x)))`` with one shared A set; shapes [..., dim] -> [..., dim].

    Init (``init``): ``"idpg"`` (default), where the IDPG authors' Compacter really starts: A, s_i, t_i and
    the down-projection's bias ~ N(0, 0.05^2) (their encoder's draws, which their model's
    ``init_bert_params`` leaves: they are plain Parameters), the up-projection's bias ~ N(0, 0.02^2) (an
    nn.Embedding there, redrawn by ``init_bert_params``). ``"compacter"``: Compacter's own config,
    A ~ N(0, 0.01^2) (``phm_c_init=normal``, ``phm_init_range=0.01``), s_i, t_i Glorot-uniform per
    Kronecker term (``hypercomplex_nonlinearity=glorot-uniform``), biases 0.
    """

    def __init__(self, dim, bottleneck, n=4, rank=1, dropout=0.0, init="idpg"):
        super().__init__()
        check_bottleneck("the adapter bottleneck", bottleneck, dim)
        self.A = nn.Parameter(torch.empty(n, n, n).normal_(0, 0.01))
        self.down = PHMLinear(dim, bottleneck, n, A_from=self, rank=rank)
        self.up = PHMLinear(bottleneck, dim, n, A_from=self, rank=rank)
        self.dropout = nn.Dropout(dropout)
        if init == "idpg":  # PHMLinear draws A, s, t and the biases N(0, 0.05^2) already
            with torch.no_grad():
                self.A.normal_(0, 0.05)
                self.up.bias.normal_(0, 0.02)
        elif init == "compacter":
            for phm in (self.down, self.up):
                for factor in (phm.s, phm.t) if rank > 0 else (phm.B,):
                    for term in factor:  # Glorot per Kronecker term (init only, not in forward)
                        nn.init.xavier_uniform_(term)
                nn.init.zeros_(phm.bias)
        else:
            raise ConfigError(f"Compacter init must be 'idpg' or 'compacter', got {init!r}")

    def forward(self, x):
        return self.up(self.dropout(F.gelu(self.down(x))))
