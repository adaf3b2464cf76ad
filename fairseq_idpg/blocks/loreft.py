"""LoReFT (Wu et al. 2024, "ReFT: Representation Finetuning for Language Models", Eq. 2): a
low-rank edit of a layer's output hidden states at a few positions,

    Phi(h) = h + R^T (W h + b - R h)        R: [r, d], rows orthonormal (R R^T = I_r); W: [r, d]; b: [r]

applied to the output of every layer (after its final LayerNorm: pyreft's component
``roberta.encoder.layer[l].output``) at the first ``n`` and last ``m`` non-padding tokens (``--loreft-positions
f1``: the paper's GLUE setting, the ``<s>`` token the head reads; gathered, edited and scattered back, k = n + m
rows per sequence), the other tokens unchanged. Phi moves h only inside the r-dimensional subspace spanned by
R's rows, to W h + b there.

R stays orthonormal through an orthogonal parametrisation (as pyreft's ``LowRankRotateLayer`` under
``torch.nn.utils.parametrizations.orthogonal``): the trained tensor A [d, r] holds Householder reflectors
below its diagonal and R^T = householder_product(A) * sign(diag A), torch's ``householder`` map. Unlike
pyreft we do not use torch's trivialisation, which keeps a frozen d x d orthogonal ``base`` per layer
(4 MiB at d = 1024, 24 of them at roberta.large) and multiplies it in: the forward, and the gradients
with respect to R, W and b, are the same on the same R (scripts/loreft_reference_check.py), while the
optimiser moves R along other coordinates (pyreft's reflectors start at -I under the base, ours are R's own),
so the two trajectories part after the first update (measured in docs/inducer.md). The map is computed in
float32 (torch's ``householder_product`` has no fp16 or bf16 kernel on the CPU) and cast to h's dtype.

Dropout: pyreft's ``LoreftIntervention`` applies Dropout(p) to the whole intervened state h + R^T(...)
(``--loreft-dropout``, its GLUE command's 0.05); Eq. 2 has no dropout term.

Parameters per layer: R d r (A's tensor: d x r, as pyreft counts it) + W d r + b r = r (2 d + 1); with
r = 1 on all 24 layers of roberta.large (d = 1024): 24 x 2,049 = 49,176, 0.0138% of its 355,359,744
parameters, the paper's 0.014% (Table 4); roberta-base 12 x 1,537 = 18,444, 0.015%.
"""

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from fairseq_idpg.blocks import Attachment, BlockConfig, register_block
from fairseq_idpg.errors import ConfigError
from fairseq_idpg.options import option


class HouseholderRows(nn.Module):
    """The parametrisation R = (householder_product(A) * sign(diag A))^T: a [d, r] tensor A of Householder
    reflectors (below the diagonal) -> R [r, d] with orthonormal rows; ``right_inverse`` takes such an R back
    to its reflectors (QR), so assigning R sets it exactly. torch's ``householder`` map without the
    trivialisation (module docstring), computed in float32."""

    def forward(self, A):
        if A.is_meta:  # a meta build (counts) has no values to compute from
            return A.new_empty(A.shape[::-1])
        reflectors = A.float().tril(diagonal=-1)
        tau = 2.0 / (1.0 + (reflectors * reflectors).sum(dim=-2))
        Q = torch.linalg.householder_product(reflectors, tau) * A.float().diagonal().sign().unsqueeze(-2)
        return Q.T.to(A.dtype)

    @torch.no_grad()
    def right_inverse(self, R):
        if R.is_meta:
            return R.new_empty(R.shape[::-1])
        A, tau = torch.geqrf(R.T.float())
        A.diagonal().sign_()  # diag(A) holds the signs that make R's QR one with diag > 0
        A.diagonal()[tau == 0.0] *= -1  # LAPACK's zero tau: no reflection there
        return A.to(R.dtype)


class LoReFT(nn.Module):
    """Phi(h) = h + R^T (W h + b - R h) at the selected positions (module docstring). ``R`` [r, d] (orthonormal
    rows, parametrised by ``rotation``), ``W`` [r, d] and ``b`` [r] (``source``, an nn.Linear, pyreft's
    ``learned_source``). Starts: R a random orthonormal [r, d] (torch's ``orthogonal_``), W and b nn.Linear's.
    Call: h [T, B, d], padding mask [B, T] (True at padding) or None -> [T, B, d]."""

    def __init__(self, dim, rank, first=1, last=0, dropout=0.0):
        super().__init__()
        self.first, self.last = first, last
        self.rotation = nn.Module()
        self.rotation.weight = nn.Parameter(torch.empty(rank, dim))
        if not self.rotation.weight.is_meta:  # (a meta build draws nothing: its fills import torch's compiler)
            torch.nn.init.orthogonal_(self.rotation.weight)
        parametrize.register_parametrization(self.rotation, "weight", HouseholderRows())
        self.source = nn.Linear(dim, rank)
        self.dropout = nn.Dropout(dropout)

    @property
    def R(self):
        return self.rotation.weight

    def positions(self, h, padding_mask):
        """([k, B] long, [k, B] bool), k = first + last: each row's first ``first`` and last ``last`` real tokens
        (padding on either side, the real tokens contiguous) and whether each slot is one to edit (a real token,
        and a last-slot not already a first-slot: a short row edits each token once)."""
        length, bsz = h.shape[:2]
        if padding_mask is None:
            lengths = torch.full((bsz,), length, dtype=torch.long, device=h.device)
            start = torch.zeros_like(lengths)
        else:
            real = ~padding_mask.to(torch.bool)
            lengths = real.long().sum(1)
            start = (real.long().cumsum(1) == 0).long().sum(1)  # the leading padding (left-padded rows)
        slot = torch.arange(self.first + self.last, device=h.device)[:, None]  # [k, 1]
        is_last = slot >= self.first
        within = torch.where(is_last, lengths - self.last + slot - self.first, slot)  # index among the real tokens
        valid = (within >= 0) & (within < lengths) & (~is_last | (within >= self.first))
        return (start + within).clamp(0, length - 1), valid

    def edit(self, h):
        """Dropout(h + R^T (W h + b - R h)): [..., d] -> [..., d]."""
        R = self.R.to(h.dtype)
        delta = (self.source(h.to(self.source.weight.dtype)).to(h.dtype) - h @ R.T) @ R
        return self.dropout(h + delta)

    def forward(self, h, padding_mask=None):
        # only the chosen positions are gathered and edited (their change scattered back): no [T, B, d] work
        index, valid = self.positions(h, padding_mask)
        index = index[..., None].expand(-1, -1, h.shape[-1])
        chosen = h.gather(0, index)  # [k, B, d]
        change = (self.edit(chosen) - chosen) * valid[..., None].to(h.dtype)
        return h.scatter_add(0, index, change)


def parse_positions(text):
    """``"f1"``, ``"l2"``, ``"f1+l1"`` -> (first, last); ValueError on another form."""
    first = last = 0
    for part in text.split("+"):
        if len(part) < 2 or part[0] not in "fl" or not part[1:].isdigit():
            raise ValueError(part)
        if part[0] == "f":
            first += int(part[1:])
        else:
            last += int(part[1:])
    if first + last == 0:
        raise ValueError(text)
    return first, last


@register_block("loreft", "LoReFT (Wu et al. 2024, ReFT Eq. 2)", slots=("layer_output",))
@dataclass
class LoReFTConfig(BlockConfig):
    loreft_rank: int = option(0, "rank r of the intervention on every layer's output (0: off)", metavar="R", size=True)
    loreft_positions: str = option(
        "f1", "positions: first n and/or last m non-padding tokens, as fN, lM or fN+lM (f1)", metavar="P"
    )
    loreft_layers: str = option("all", "layers intervened: all, or indices as 0;5;11 (all)", metavar="L")
    loreft_dropout: float = option(0.05, "dropout on the intervened states (0.05)", metavar="P", check=">= 0")

    def active(self):
        return self.loreft_rank > 0

    def layer_indices(self, layers):
        if self.loreft_layers == "all":
            return set(range(layers))
        try:
            chosen = {int(i) for i in self.loreft_layers.split(";")}
        except ValueError:
            chosen = {-1}
        if not chosen <= set(range(layers)):
            raise ConfigError(
                f"--loreft-layers must be 'all' or layer indices in [0, {layers}) joined by ';' "
                f"(got {self.loreft_layers!r})"
            )
        return chosen

    def check(self, encoder):
        if not self.active():
            return
        try:
            parse_positions(self.loreft_positions)
        except ValueError:
            raise ConfigError(f"--loreft-positions must be fN, lM or fN+lM (got {self.loreft_positions!r})") from None
        if self.loreft_rank > encoder.dim:
            raise ConfigError(f"--loreft-rank {self.loreft_rank} must be <= --encoder-embed-dim {encoder.dim}")
        if self.loreft_dropout >= 1:
            raise ConfigError(f"--loreft-dropout must be in [0, 1) (got {self.loreft_dropout})")
        self.layer_indices(encoder.layers)

    def layer_blocks(self, index, encoder, model):
        if index not in self.layer_indices(encoder.layers):
            return []
        first, last = parse_positions(self.loreft_positions)
        block = LoReFT(encoder.dim, self.loreft_rank, first, last, self.loreft_dropout)
        return [Attachment("layer_output", "loreft", block)]
