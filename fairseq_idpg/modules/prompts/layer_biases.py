"""The output biases c_0 .. c_{K-1} of the IDPG generator (IDPG sections 3.1 and 3.2.2), full or low-rank.

In the generator ``P_l = h W2 + c_l`` (IDPG section 3.1: "the bias term t x d in the second layer
of G is a task-specific prompt"), c_0 is the input-layer prompt and, in the multi-layer
"M version" (IDPG section 4.5.3), c_1 .. c_{L-1} are the per-layer biases of the prompts added
after layers 1 .. L-1. With zero generator weights the biases are exactly the prompts of prompt
tuning (K = 1) or of P-tuning v2 (K = L), ``soft_prompts.FullPrompt`` of the same values.

Low-rank option (beyond the paper): at roberta-large size the layer biases are 117,760 of
M-IDPG-PHM's 137,232 parameters. With ``rank`` r > 0 they are

    C = U V,   C = [c_1; ..; c_{K-1}]: [K-1, t*d],   U: [K-1, r],   V: [r, t*d]

i.e. every layer's bias is a mixture of r shared basis prompts. Why this factorisation and
not one per layer: a single c_l is a [t, d] matrix with t = 5, whose rank is already <= 5, so
a per-layer factorisation t r + r d saves little (r = 4: 4,116 vs 5,120); the redundancy is
*across* layers (23 prompts of the same shape, trained by the same generator), which a shared
basis removes: (K-1) r + r t d parameters instead of (K-1) t d. c_0 stays full: it is the
prompt-tuning part of IDPG (zero generator weights reduce to prompt tuning with it).

Init (``INITS``, ``--idpg-bias-init``): ``normal``, c ~ N(0, 0.02^2), by default: where the authors'
whole model starts c. Their encoder draws its bias tables (``nn.Embedding``) U(-0.5, 0.5), but their
``RobertaModel.__init__`` then applies fairseq's ``init_bert_params`` to the whole model, which redraws
every ``nn.Embedding`` N(0, 0.02^2) and zeroes every ``nn.Linear`` bias; the RoBERTa checkpoint holds no
generator keys, so the redrawn values are what trains (docs/idpg.md, "Where training starts").
``uniform``: U(-0.5, 0.5), their encoder's own draw (the start of runs made before this was found).
``zero``: c = 0, S-IDPG-DNN's start (its c is the bias of an ``nn.Linear`` in their code).
Low-rank: V drawn as c, U ~ N(0, 1/r), so an entry of C has the variance of a full c at any rank.
"""

import math

import torch
import torch.nn as nn

from fairseq_idpg.errors import ConfigError

INITS = ("normal", "uniform", "zero")
AUTHORS_STD = 0.02  # init_bert_params' N(0, 0.02^2)
UNIFORM_SCALE = 0.5  # their encoder's U(-0.5, 0.5)


def init_bias_(tensor, init="normal"):
    """Draw output biases in place (``INITS``; the module docstring)."""
    if init == "normal":
        return nn.init.normal_(tensor, 0.0, AUTHORS_STD)
    if init == "uniform":
        return nn.init.uniform_(tensor, -UNIFORM_SCALE, UNIFORM_SCALE)
    if init == "zero":
        return nn.init.zeros_(tensor)
    raise ConfigError(f"--idpg-bias-init must be one of {', '.join(INITS)}, got {init!r}")


class LayerBiases(nn.Module):
    """K output biases of length ``size`` (= t*d); ``forward()`` returns them all, [K, size].

    Args:
        count: K (1 for single-layer / shared, L for the per-layer "M version").
        size: t*d.
        rank: 0 for full biases; r > 0 for c_1..c_{K-1} = U V (needs K > 1).
        init: how c (low rank: V) starts, one of ``INITS``.
    """

    def __init__(self, count, size, rank=0, init="normal"):
        super().__init__()
        if rank < 0 or (rank > 0 and count < 2):
            raise ConfigError(f"--idpg-layer-bias-rank {rank}: a low rank needs per-layer biases (K={count})")
        self.count, self.size, self.rank = count, size, rank
        self.first = nn.Parameter(init_bias_(torch.empty(size), init))  # c_0
        if count > 1 and rank == 0:
            self.rest = nn.Parameter(init_bias_(torch.empty(count - 1, size), init))
        elif count > 1:
            self.mix = nn.Parameter(torch.empty(count - 1, rank).normal_(0, 1 / math.sqrt(rank)))  # U
            self.basis = nn.Parameter(init_bias_(torch.empty(rank, size), init))  # V

    def forward(self):
        """All biases [K, size] (one matmul for the low-rank ones, once per model forward)."""
        if self.count == 1:
            return self.first.unsqueeze(0)
        rest = self.rest if self.rank == 0 else self.mix @ self.basis
        return torch.cat([self.first.unsqueeze(0), rest], dim=0)

    @staticmethod
    def num_parameters(count, size, rank=0):
        """The formula: t d + (K-1) t d, or t d + (K-1) r + r t d with a rank."""
        if count == 1:
            return size
        return size + ((count - 1) * size if rank == 0 else (count - 1) * rank + rank * size)

    def extra_repr(self):
        return f"count={self.count}, size={self.size}, rank={self.rank}"
