"""LoRA (Hu et al. 2021): a trainable low-rank update of a frozen linear map.

    y = x W^T + b + (alpha / r) * Dropout(x) A^T B^T       A: [r, in],  B: [out, r]

Where it is used: inducer-tuning + LoRA puts it on W_q only (inducer-tuning section 4.5,
Eq. 10; r = 4, alpha = 32, dropout 0.1, Table 5); the LoRA baseline on W_q and W_v (r = 16,
alpha = 32, dropout 0.1: the LoRA block of the inducer-tuning authors' NLU script). Initialisation as in
loralib: A kaiming-uniform(a = sqrt(5)), B = 0, so the frozen model's output is unchanged at
the start. ``in * r + r * out`` parameters (2 d r on a d x d projection), no bias.

``LoRA`` computes only the update; the frozen ``nn.Linear`` stays untouched (its weight is a
backbone tensor). ``LoRA.merge_into`` folds the update into the weight for inference
(``W + (alpha / r) B A``), which gives the same outputs with dropout off.

``init="pissa"`` (PiSSA, Meng et al. 2024; ``pissa.py``): ``start_from(W)``, called once the backbone is loaded,
sets A and B to the principal factors A_0, B_0 of W and keeps them as frozen buffers (not saved: recomputed from
the backbone at every build), so that the frozen part is the residual W - s B_0 A_0:

    y = W x + b - s B_0 A_0 x + s B A Dropout(x)      (= W_res x + b + s B A Dropout(x))
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_idpg.errors import ConfigError
from fairseq_idpg.modules.attention.pissa import principal_factors

INITS = ("kaiming", "pissa")  # loralib's A kaiming-uniform and B = 0; PiSSA's principal factors


class LoRA(nn.Module):
    """The low-rank update ``(alpha / r) * Dropout(x) A^T B^T``.

    Shapes: x [..., in_features] -> [..., out_features].
    """

    def __init__(self, in_features, out_features, rank, alpha=32.0, dropout=0.0, init="kaiming"):
        super().__init__()
        if rank < 1:
            raise ConfigError(f"LoRA rank must be >= 1, got {rank}")
        if init not in INITS:
            raise ConfigError(f"LoRA init must be one of {', '.join(INITS)}, got {init!r}")
        self.in_features, self.out_features, self.rank, self.alpha = in_features, out_features, rank, alpha
        self.scaling = alpha / rank
        self.init = init
        self.A = nn.Parameter(torch.empty(rank, in_features))
        self.B = nn.Parameter(torch.zeros(out_features, rank))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # drawn for PiSSA too: the other blocks' draws stay
        self.dropout = nn.Dropout(dropout)
        # PiSSA's frozen start A_0, B_0 (``start_from``); None: the frozen part is W itself
        self.register_buffer("A0", None, persistent=False)
        self.register_buffer("B0", None, persistent=False)

    @torch.no_grad()
    def start_from(self, linear: nn.Linear):
        """Where training starts, once ``linear`` (the frozen projection) holds the backbone's weights: PiSSA's
        principal factors of its weight (module docstring); nothing for loralib's init."""
        if self.init != "pissa" or linear.weight.is_meta:
            return
        a, b = principal_factors(linear.weight, self.rank, self.scaling)
        self.A.copy_(a)
        self.B.copy_(b)
        self.A0, self.B0 = a.to(self.A), b.to(self.B)

    def unscaled(self, x):
        """``Dropout(x) A^T B^T`` (minus PiSSA's ``x A_0^T B_0^T``), before the scaling alpha / r."""
        h = F.linear(F.linear(self.dropout(x), self.A.to(x.dtype)), self.B.to(x.dtype))
        if self.A0 is not None:
            h = h - F.linear(F.linear(x, self.A0.to(x.dtype)), self.B0.to(x.dtype))
        return h

    def forward(self, x):
        return self.unscaled(x) * self.scaling

    def project(self, x, y):
        """The ``q`` / ``v`` slot of ``AugmentedSelfAttention``: y = W x + b + (alpha / r) B A x; the scaling is
        the add's ``alpha`` (one kernel, where a multiply and an add were two launches)."""
        return torch.add(y, self.unscaled(x), alpha=self.scaling)

    def delta_weight(self):
        """The update as a dense matrix [out_features, in_features] (the ``nn.Linear`` layout):
        (alpha / r) (B A - B_0 A_0) under PiSSA."""
        product = self.B @ self.A
        if self.A0 is not None:
            product = product - self.B0.to(product) @ self.A0.to(product)
        return product * self.scaling

    @torch.no_grad()
    def merge_into(self, linear: nn.Linear):
        """Fold the update into ``linear.weight`` in place (inference; the update is then part of W)."""
        linear.weight.add_(self.delta_weight().to(linear.weight.dtype))

    def extra_repr(self):
        init = "" if self.init == "kaiming" else f", init={self.init}"
        return f"in={self.in_features}, out={self.out_features}, rank={self.rank}, alpha={self.alpha}{init}"
