"""VeRA (Kopiczko et al. 2024, "VeRA: Vector-based Random Matrix Adaptation", section 3, Eq. 2): one pair of
frozen random matrices shared by every adapted projection, and per projection two trained vectors,

    y = W x + b_W + Lambda_b B Lambda_d A Dropout(x)
      = W x + b_W + b * (B (d * (A Dropout(x))))       (* elementwise)

    A: [r, d_in], B: [d_out, r]       frozen, random, one pair for the whole model (``SharedProjections``)
    d: [r], b: [d_out]                trained, per layer and projection (``VeRA``)

as Hugging Face PEFT's ``tuners/vera`` computes it (``VeraLayer``): A and B kaiming-uniform with gain sqrt(2),
U(-sqrt(6 / fan_in), sqrt(6 / fan_in)) (fan_in: d_in for A, r for B), drawn in that order on the CPU from a
``torch.Generator`` seeded with ``projection_prng_key`` (ours ``--vera-seed``), sized for the largest adapted
projection (every q and v of RoBERTa is d x d); d starts at ``d_initial`` (0.1, the paper's Table 8 and PEFT's
default) and b at zero, so the model starts as the frozen one (the paper's section 3.2). Dropout on the input
(PEFT's ``vera_dropout``; 0 by default there and here).

A and B are rebuilt bit for bit from the seed whenever the model is built, so they are non-persistent buffers:
no checkpoint holds them. One module owns them (the model's ``vera_projections``) and every ``VeRA`` holds a
plain reference to it, so ``.to`` / ``.half()`` convert one pair, not one per projection.

Trained: ``r + d_out`` per adapted projection: 2 x 24 x (256 + 1024) = 61,440 on roberta-large with r = 256 on
W_q and W_v (the paper's Table 1 row, 0.061M; PEFT's count of ``VeraConfig(r=256, target_modules=["query",
"value"])``). ``merge_into`` folds the update into the frozen weight (the paper's section 3: no added latency).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_idpg.errors import ConfigError


def kaiming_uniform(shape, generator):
    """A float32 CPU tensor ``shape`` [out, in] drawn U(-bound, bound), bound = sqrt(3) gain / sqrt(fan_in) with
    gain sqrt(2) (kaiming-uniform, a = 0), from ``generator``: PEFT's draw of vera_A and vera_B, value for value."""
    std = math.sqrt(2) / math.sqrt(shape[1])
    bound = math.sqrt(3.0) * std  # computed in this order: the bound, and so each value, is PEFT's to the bit
    return torch.empty(shape, device="cpu").uniform_(-bound, bound, generator=generator)


class SharedProjections(nn.Module):
    """The frozen random A [rank, in_features] and B [out_features, rank] of every ``VeRA`` of a model, drawn from
    ``seed`` alone (not the global random state): A first, then B, as PEFT draws them."""

    def __init__(self, in_features, out_features, rank, seed):
        super().__init__()
        if rank < 1:
            raise ConfigError(f"--vera-rank must be >= 1, got {rank}")
        generator = torch.Generator(device="cpu").manual_seed(seed)
        A = kaiming_uniform((rank, in_features), generator)
        B = kaiming_uniform((out_features, rank), generator)
        # a meta build (counts) keeps shapes only; elsewhere the model's device, once moved
        device = torch.empty(0).device
        self.register_buffer("A", A.to(device), persistent=False)
        self.register_buffer("B", B.to(device), persistent=False)
        self.rank, self.seed = rank, seed

    def extra_repr(self):
        return f"A={tuple(self.A.shape)}, B={tuple(self.B.shape)}, seed={self.seed}"


class VeRA(nn.Module):
    """VeRA on one frozen projection (module docstring). Shapes: x [..., in_features] -> [..., out_features]."""

    def __init__(self, shared: SharedProjections, in_features, out_features, d_initial=0.1, dropout=0.0):
        super().__init__()
        if shared.A.size(1) < in_features or shared.B.size(0) < out_features:
            raise ConfigError(
                f"VeRA: the shared projections {tuple(shared.A.shape)}, {tuple(shared.B.shape)} are smaller than a "
                f"{out_features} x {in_features} projection"
            )
        object.__setattr__(self, "shared", shared)  # a plain reference: not a submodule, not in the state dict
        self.in_features, self.out_features = in_features, out_features
        self.d = nn.Parameter(torch.full((shared.rank,), float(d_initial)))
        self.b = nn.Parameter(torch.zeros(out_features))
        self.dropout = nn.Dropout(dropout)

    def factors(self, dtype):
        """(A [r, in], B [out, r]) of this projection, in ``dtype``: the shared pair sliced as PEFT slices it."""
        A, B = self.shared.A, self.shared.B
        return A[:, : self.in_features].to(dtype), B[: self.out_features].to(dtype)

    def forward(self, x):
        """The update b * (B (d * (A Dropout(x)))) [..., out]."""
        A, B = self.factors(x.dtype)
        return F.linear(F.linear(self.dropout(x), A) * self.d.to(x.dtype), B) * self.b.to(x.dtype)

    def project(self, x, y):
        """The ``q`` / ``v`` slot: y = W x + b_W (the frozen projection's output) -> y + the update."""
        return y + self(x)

    def delta_weight(self):
        """The update as a dense matrix [out, in] (the ``nn.Linear`` layout): Lambda_b B Lambda_d A."""
        A, B = self.factors(self.d.dtype)
        return (self.b[:, None] * B) @ (self.d[:, None] * A)

    @torch.no_grad()
    def merge_into(self, linear: nn.Linear):
        """Fold the update into ``linear``'s weight (W + Lambda_b B Lambda_d A): the same outputs, dropout off."""
        linear.weight.add_(self.delta_weight().to(linear.weight.dtype))

    def extra_repr(self):
        return f"in={self.in_features}, out={self.out_features}, rank={self.shared.rank}"
