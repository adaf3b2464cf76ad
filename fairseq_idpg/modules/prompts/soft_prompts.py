"""Static soft prompts as parameterised l x d matrices: prompt tuning, P-tuning v2, DPT and its baselines.

Each module's ``forward()`` takes no input and returns the prompt ``P`` [l, d], or [n, l, d] for a
stack of n prompts, one per layer (P-tuning v2 with full prompts, deep DPT with low-rank ones), to
be inserted by ``encoder.prompted_features``. Counts (no classification head):

===================  ===============================================  ========================
module               P                                                trainable
===================  ===============================================  ========================
``FullPrompt``       P itself (prompt tuning, Lester et al. 2021)     l d              (x n)
``LowRankPrompt``    P = A B, A [l, b], B [b, d]  (DPT Eq. 5)          l b + b d        (x n)
``RankProbePrompt``  P = U ReLU(diag(s)) V  (DPT Eq. 3)                l r + r + r d
``ResidualPrompt``   P' = P + LN(W_up ReLU(W_down P + b_d) + b_u)      l d + 2 d m + m + 3 d
===================  ===============================================  ========================

Initialisation: U(-scale, scale) with scale 0.5 for every prompt tensor and factor, as in the
authors' DPT code (``init_prefix_weights``) and IDPG's prompt biases c, so that prompt tuning
keeps one distribution whichever paper's preset builds it; N(0, scale^2) is the option matching
DPT's "Gaussian". The rank probe's s starts at a positive constant. The residual
reparameterisation's MLP keeps PyTorch's Linear/LayerNorm initialisation (Razdaibiedina et al.
2023, the baseline of DPT Table 1).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

INITS = ("uniform", "normal")


def init_prompt_(tensor, init="uniform", scale=0.5):
    """U(-scale, scale) (authors' DPT code) or N(0, scale^2) (the paper's "Gaussian"), in place."""
    if init == "uniform":
        return nn.init.uniform_(tensor, -scale, scale)
    if init == "normal":
        return nn.init.normal_(tensor, 0.0, scale)
    raise ValueError(f"prompt init must be one of {', '.join(INITS)}, got {init!r}")


def _stack_shape(stack):
    """Leading shape of a stack of prompts: () for one prompt, (n,) for n (one per layer)."""
    return (stack,) if stack else ()


class FullPrompt(nn.Module):
    """Prompt tuning: P [l, d] is the parameter itself, l d values. A stack [n, l, d] is P-tuning
    v2 in IDPG's additive form (IDPG section 4.1): P_0 inserted, P_k added after layer k.

    Also the export format of every other parameterisation (``scripts/export_dpt_prompt.py``).
    """

    def __init__(self, length, dim, stack=0, init="uniform", scale=0.5):
        super().__init__()
        self.weight = nn.Parameter(init_prompt_(torch.empty(*_stack_shape(stack), length, dim), init, scale))

    def forward(self):
        return self.weight


class LowRankPrompt(nn.Module):
    """DPT (Eq. 5): P = A @ B with A [l, b], B [b, d]: rank <= b, l b + b d parameters.

    With ``stack`` = n, A [n, l, b] and B [n, b, d] give n independent prompts [n, l, d] in one
    batched matmul (deep DPT: one low-rank prompt per layer).
    """

    def __init__(self, length, dim, bottleneck, stack=0, init="uniform", scale=0.5):
        super().__init__()
        lead = _stack_shape(stack)
        self.A = nn.Parameter(init_prompt_(torch.empty(*lead, length, bottleneck), init, scale))
        self.B = nn.Parameter(init_prompt_(torch.empty(*lead, bottleneck, dim), init, scale))

    def forward(self):
        return torch.matmul(self.A, self.B)


class RankProbePrompt(nn.Module):
    """The rank probe of DPT section 2.2 (Eq. 3): P = U ReLU(diag(s)) V.

    U [l, r], V [r, d] and s [r] train; s starts positive (``s_init``). The number of positive
    entries of s upper-bounds the rank of P (paper appendix A.1); entries that cross zero stay
    at zero gradient through the ReLU, so the count only falls (paper Figure 3).
    """

    def __init__(self, length, dim, rank, init="uniform", scale=0.5, s_init=0.02):
        super().__init__()
        if not s_init > 0:
            raise ValueError(f"rank probe: s must start positive, got s_init={s_init}")
        self.U = nn.Parameter(init_prompt_(torch.empty(length, rank), init, scale))
        self.s = nn.Parameter(torch.full((rank,), float(s_init)))
        self.V = nn.Parameter(init_prompt_(torch.empty(rank, dim), init, scale))

    def forward(self):
        # U diag(relu(s)) V without forming the diagonal matrix: scale U's columns
        return torch.matmul(self.U * F.relu(self.s), self.V)

    def num_positive(self):
        """Number of positive entries of s (an int; the probe's estimate of the rank)."""
        return int(self.s.detach().gt(0).sum())


class ResidualPrompt(nn.Module):
    """Residual prompt tuning (Razdaibiedina et al. 2023; DPT's baseline, bottleneck m = 400):

        P' = P + LayerNorm(W_up ReLU(W_down P + b_down) + b_up)     P [l, d], W_down [d, m], W_up [m, d]

    The reparameterisation MLP is shared by the l prompt vectors (row-wise).
    l d + d m + m + m d + d + 2 d parameters (925,072 for l = 100, d = 1024, m = 400: the
    paper's "925K").
    """

    def __init__(self, length, dim, bottleneck=400, init="uniform", scale=0.5):
        super().__init__()
        self.weight = nn.Parameter(init_prompt_(torch.empty(length, dim), init, scale))
        self.down = nn.Linear(dim, bottleneck)
        self.up = nn.Linear(bottleneck, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self):
        P = self.weight
        return P + self.norm(self.up(F.relu(self.down(P))))
