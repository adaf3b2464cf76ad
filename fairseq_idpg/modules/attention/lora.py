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
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_idpg.errors import ConfigError


class LoRA(nn.Module):
    """The low-rank update ``(alpha / r) * Dropout(x) A^T B^T``.

    Shapes: x [..., in_features] -> [..., out_features].
    """

    def __init__(self, in_features, out_features, rank, alpha=32.0, dropout=0.0):
        super().__init__()
        if rank < 1:
            raise ConfigError(f"LoRA rank must be >= 1, got {rank}")
        self.in_features, self.out_features, self.rank, self.alpha = in_features, out_features, rank, alpha
        self.scaling = alpha / rank
        self.A = nn.Parameter(torch.empty(rank, in_features))
        self.B = nn.Parameter(torch.zeros(out_features, rank))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))
        self.dropout = nn.Dropout(dropout)

    def unscaled(self, x):
        """``Dropout(x) A^T B^T``, before the scaling alpha / r."""
        h = F.linear(self.dropout(x), self.A.to(x.dtype))
        return F.linear(h, self.B.to(x.dtype))

    def forward(self, x):
        return self.unscaled(x) * self.scaling

    def project(self, x, y):
        """The ``q`` / ``v`` slot of ``AugmentedSelfAttention``: y = W x + b + (alpha / r) B A x; the scaling is
        the add's ``alpha`` (one kernel, where a multiply and an add were two launches)."""
        return torch.add(y, self.unscaled(x), alpha=self.scaling)

    def delta_weight(self):
        """The update as a dense matrix [out_features, in_features] (the ``nn.Linear`` layout)."""
        return (self.B @ self.A) * self.scaling

    @torch.no_grad()
    def merge_into(self, linear: nn.Linear):
        """Fold the update into ``linear.weight`` in place (inference; the update is then part of W)."""
        linear.weight.add_(self.delta_weight().to(linear.weight.dtype))

    def extra_repr(self):
        return f"in={self.in_features}, out={self.out_features}, rank={self.rank}, alpha={self.alpha}"
