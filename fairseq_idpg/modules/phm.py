"""Parameterized hypercomplex multiplication (PHM) layer (IDPG Eq. 4; Compacter).

    y = x W + b,   W = sum_{i=1..n} kron(A_i, B_i)
    A_i: [n, n],   B_i: [in/n, out/n]      (row-vector convention, W: [in, out])

``n`` must divide both dimensions. The A set may be owned by the layer or shared (pass
the same ``nn.Parameter`` to several layers: IDPG's "one A set" generators, Compacter's
shared A). ``rank`` > 0 factorises each B_i as ``s_i t_i`` (s_i: [in/n, rank],
t_i: [rank, out/n]), Compacter's low-rank PHM. W is formed once per forward with one
einsum, then one matmul: the cost of a dense layer, with n^3 + in*out/n parameters.
"""

import torch
import torch.nn as nn

from fairseq_idpg.errors import ConfigError


def check_divisible(n, **dims):
    for name, value in dims.items():
        if n <= 0 or value % n:
            raise ConfigError(f"PHM n={n} must divide {name}={value}")


def kron_sum(A, B):
    """``sum_i kron(A[i], B[i])`` for A: [n, n, n], B: [n, p, q] -> [n*p, n*q]."""
    n, p, q = B.shape
    return torch.einsum("iab,icd->acbd", A, B).reshape(n * p, n * q)


class PHMLinear(nn.Module):
    """``y = x W + b`` with ``W = sum_i kron(A_i, B_i)``.

    Args:
        in_features, out_features: dimensions; ``n`` must divide both.
        n: number of Kronecker terms (and the size of each A_i).
        A_from: optional module whose ``A`` [n, n, n] this layer uses instead of its own (shared between
            layers); read at every forward, so a module that swaps its tensors (``torch.func.functional_call``,
            ``fairseq_idpg/fused``) swaps it here too.
        rank: 0 for full B_i; > 0 for B_i = s_i t_i of that rank.
        bias: learn ``b`` [out_features].
        init_std: N(0, std^2) for A, B (or s, t) and b (IDPG: 0.05).
    Shapes: x [..., in_features] -> y [..., out_features].
    """

    def __init__(self, in_features, out_features, n, A_from=None, rank=0, bias=True, init_std=0.05):
        super().__init__()
        check_divisible(n, in_features=in_features, out_features=out_features)
        self.in_features, self.out_features, self.n, self.rank = in_features, out_features, n, rank
        p, q = in_features // n, out_features // n
        if A_from is None:
            self.A = nn.Parameter(torch.empty(n, n, n).normal_(0, init_std))
        else:
            if tuple(A_from.A.shape) != (n, n, n):
                raise ValueError(f"shared A has shape {tuple(A_from.A.shape)}, expected {(n, n, n)}")
            self._A_from = [A_from]  # not registered here: its owner counts and saves it
        if rank > 0:
            self.s = nn.Parameter(torch.empty(n, p, rank).normal_(0, init_std))
            self.t = nn.Parameter(torch.empty(n, rank, q).normal_(0, init_std))
        else:
            self.B = nn.Parameter(torch.empty(n, p, q).normal_(0, init_std))
        self.bias = nn.Parameter(torch.empty(out_features).normal_(0, init_std)) if bias else None

    def A_set(self):
        return self.A if "A" in self._parameters else self._A_from[0].A

    def B_set(self):
        return torch.bmm(self.s, self.t) if self.rank > 0 else self.B

    def weight(self):
        """The equivalent dense weight W [in_features, out_features]."""
        return kron_sum(self.A_set(), self.B_set())

    def forward(self, x):
        y = torch.matmul(x, self.weight().to(x.dtype))
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self):
        shared = "shared A" if "A" not in self._parameters else "own A"
        return f"in={self.in_features}, out={self.out_features}, n={self.n}, rank={self.rank}, {shared}"
