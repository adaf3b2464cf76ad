"""DoRA (Liu et al. 2024, "DoRA: Weight-Decomposed Low-Rank Adaptation", Eq. 5 and section 4.3): LoRA whose
updated weight is split into a trained magnitude and a direction,

    W' = m * (W_0 + s B A) / ||W_0 + s B A||_c            m: [out], one per output feature; s = alpha / r

with ``||.||_c`` the norm of each of W's vectors along its input axis (the paper's "column" norm, of W as
[in, out]; PEFT's ``torch.linalg.norm(W, dim=1)`` of W as [out, in]: one norm per output feature), m initialised
to ``||W_0||_c`` so the model starts as the frozen one. As the paper's section 4.3 suggests, and PEFT does, the
norm is a constant for the backward (detached): the gradient reaches A and B through the direction's numerator
only, and m through its product.

The projection's output, as PEFT's ``use_dora`` computes it (``DoraLinearLayer.forward``), with
k = m / ||W_0 + s B A||_c and x_d = Dropout(x):

    y' = W_0 x + b + (k - 1) * (W_0 x_d) + k * s B A x_d

which is W' x + b with dropout off (eval, or ``--lora-dropout 0``); with dropout on in training the frozen
weight sees x itself and the magnitude's correction the dropped x_d (PEFT's choice; Eq. 5 has no dropout
term). Under PiSSA (``--lora-init pissa``) W_0 is the residual W - s B_0 A_0 throughout (``lora.py``).

Trained: A, B and m; ``2 d r + d`` per d x d projection. The block reads the frozen projection it is attached
to (a reference, not a submodule: the backbone's tensors stay the backbone's, shared and never saved here).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_idpg.modules.attention.lora import LoRA


class DoRA(LoRA):
    """DoRA on the frozen ``base`` projection (module docstring). Shapes: x [..., in] -> y [..., out]."""

    def __init__(self, base: nn.Linear, rank, alpha=32.0, dropout=0.0, init="kaiming"):
        super().__init__(base.in_features, base.out_features, rank, alpha, dropout, init)
        object.__setattr__(self, "base", base)  # a plain reference: not a submodule, not in the state dict
        self.magnitude = nn.Parameter(torch.empty(base.out_features))
        if not base.weight.is_meta:  # (a meta build has no values; its norms would import torch's compiler)
            self.start_magnitude()

    @torch.no_grad()
    def start_magnitude(self):
        """m = ||W_0 + s B A||_c: the frozen weight's norms at the start (B A = 0, or B_0 A_0 under PiSSA)."""
        self.magnitude.copy_(self.weight_norm())

    @torch.no_grad()
    def start_from(self, linear: nn.Linear):
        super().start_from(linear)
        if not linear.weight.is_meta:
            self.start_magnitude()

    def residual_weight(self):
        """The frozen part W_0 [out, in]: the projection's weight (less s B_0 A_0 under PiSSA)."""
        weight = self.base.weight
        if self.A0 is None:
            return weight
        return weight - self.scaling * (self.B0.to(weight) @ self.A0.to(weight))

    def weight_norm(self):
        """||W_0 + s B A||_c [out], in float32, detached (section 4.3)."""
        with torch.no_grad():
            weight = self.residual_weight().float() + self.scaling * (self.B.float() @ self.A.float())
            return torch.linalg.vector_norm(weight, dim=1)

    def scale(self, dtype):
        """k = m / ||W_0 + s B A||_c [out] in ``dtype``."""
        return (self.magnitude.float() / self.weight_norm()).to(dtype)

    def forward(self, x):
        raise TypeError("DoRA rescales the projection's output: its slot calls project(x, W x + b)")

    def project(self, x, y):
        """The ``q`` / ``v`` slot: y = W x + b (the frozen projection's output) -> y' (module docstring)."""
        k = self.scale(x.dtype)
        x_d = self.dropout(x)
        update = F.linear(F.linear(x_d, self.A.to(x.dtype)), self.B.to(x.dtype)) * self.scaling
        correction = 0.0  # PiSSA: W x - s B_0 A_0 x is the residual's output
        if self.A0 is not None:
            correction = F.linear(F.linear(x, self.A0.to(x.dtype)), self.B0.to(x.dtype)) * self.scaling
        if self.training and self.dropout.p > 0:  # the frozen weight's output on the dropped input (PEFT)
            frozen = F.linear(x_d, self.residual_weight().to(x.dtype))
        else:
            bias = self.base.bias
            frozen = y - correction - (0.0 if bias is None else bias.to(x.dtype))
        return y - correction + (k - 1) * frozen + k * update

    def delta_weight(self):
        """W' - W [out, in]: what merging adds to the projection's weight (its bias stays)."""
        weight = self.base.weight
        merged = self.scale(weight.dtype)[:, None] * (self.residual_weight() + self.scaling * (self.B @ self.A))
        return merged - weight
