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

Initialisation (``INITS``): U(-scale, scale) with scale 0.5 for every prompt tensor and factor, as
in the authors' DPT code (``init_prefix_weights``); N(0, scale^2) is the option matching DPT's
"Gaussian", and with scale 0.02 where the IDPG authors' whole model starts its prompts (IDPG Table 1's
prompt records, ``methods.IDPG_START``). Two starts that the long-prompt recipes use (docs/long-prompts.md):

- ``vocab``: P starts as l rows of the frozen token-embedding table (``sample_vocab_rows``):
  Lester et al. 2021 section 3 / google-research/prompt-tuning ``from_sampled_vocab.gin``,
  PEFT's ``PromptTuningInit.RANDOM_DISCRETE`` (huggingface/peft#2815), Residual PT's default.
  Every module takes such a P through ``start_from_(P)``: the full and residual prompts copy it,
  DPT's factors are its best rank-b approximation (truncated SVD, split evenly between A and B),
  the rank probe's U, V its SVD. Deep stacks start P_0 there and P_1..P_{L-1} at zero, so that the
  deep model starts as the shallow one.
- ``zero``: LoRA-style (Hu et al. 2021; zrguo/MPLMM#12 for product prompts): the right factor
  (DPT's B, the probe's V) and full or residual P start at 0, the left factor U(-scale, scale),
  so that P = 0 at the start and the gradient still reaches the zero factor.

The rank probe's s starts at a positive constant. The residual reparameterisation's MLP keeps
PyTorch's Linear/LayerNorm initialisation (Razdaibiedina et al. 2023, the baseline of DPT Table 1).

``--prompt-matrix NAME`` of ``roberta_prompt`` builds what ``register_prompt_matrix`` registered
under NAME; each parameterisation registers itself in the file that defines it (the four above at
the end of this one), as fairseq's models do with ``register_model``. The model reads the registry
when it parses and builds, so a new file in this folder adds a choice once its import line is added
to ``modules/prompts/__init__.py``.
"""

from typing import Callable, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_idpg.errors import ConfigError

INITS = ("uniform", "normal", "vocab", "zero")


class PromptMatrix(NamedTuple):
    """One ``--prompt-matrix`` choice: ``build(args, dim, stack)`` -> the prompt module (``args``:
    roberta_prompt's options; ``stack``: L prompts with ``--prompt-deep``, else 0); ``deep``:
    whether it builds such a stack."""

    build: Callable
    deep: bool


PROMPT_MATRICES = {}  # --prompt-matrix NAME -> PromptMatrix, in registration order


def register_prompt_matrix(name, build, deep=False):
    """Make ``--prompt-matrix NAME`` build ``build(args, dim, stack)``; see ``PromptMatrix``."""
    if name in PROMPT_MATRICES:
        raise ValueError(f"prompt matrix {name!r} registered twice")
    PROMPT_MATRICES[name] = PromptMatrix(build, deep)


def init_prompt_(tensor, init="uniform", scale=0.5):
    """U(-scale, scale) (authors' DPT code) or N(0, scale^2) (the paper's "Gaussian"), in place.

    ``vocab`` and ``zero`` draw U(-scale, scale) here: the model overwrites P with vocabulary rows
    once the backbone is loaded (``start_from_``), and ``zero`` keeps the left factor's draw."""
    if init in ("uniform", "vocab", "zero"):
        return nn.init.uniform_(tensor, -scale, scale)
    if init == "normal":
        return nn.init.normal_(tensor, 0.0, scale)
    raise ConfigError(f"prompt init must be one of {', '.join(INITS)}, got {init!r}")


def sample_vocab_rows(embeddings, num_rows, candidates=None, generator=None):
    """``num_rows`` distinct rows of ``embeddings`` [V, d], drawn uniformly among ``candidates``
    ([V] bool, the ordinary tokens; default all), as a new tensor [num_rows, d].

    Lester et al. 2021 (section 3, "sampled vocab"; ``from_sampled_vocab.gin`` draws from the 5,000
    most frequent tokens) and PEFT's ``RANDOM_DISCRETE``. Without replacement while there are
    enough candidates, with replacement otherwise."""
    ids = torch.arange(embeddings.size(0), device=embeddings.device)
    if candidates is not None:
        ids = ids[candidates.to(embeddings.device)]
    if ids.numel() == 0:
        raise ConfigError("no vocabulary rows to sample a prompt from")
    if num_rows <= ids.numel():
        pick = torch.randperm(ids.numel(), generator=generator, device="cpu")[:num_rows]
    else:
        pick = torch.randint(ids.numel(), (num_rows,), generator=generator, device="cpu")
    return embeddings.detach()[ids[pick.to(ids.device)]].clone()


def split_low_rank(P, rank):
    """Factors (A [l, rank], B [rank, d]) of the best rank-``rank`` approximation of P [l, d]
    (Eckart-Young, truncated SVD), the singular values split evenly: A = U_r S_r^1/2, B = S_r^1/2 V_r^T.
    Computed in float32 or wider and returned in P's dtype."""
    work = P.detach().to(torch.promote_types(P.dtype, torch.float32))
    U, S, Vh = torch.linalg.svd(work, full_matrices=False)
    root = S[:rank].sqrt()
    return (U[:, :rank] * root).to(P.dtype), (root.unsqueeze(1) * Vh[:rank]).to(P.dtype)


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
        if init == "zero":
            self.zero_()

    def forward(self):
        return self.weight

    @torch.no_grad()
    def start_from_(self, P):
        """Start at P [l, d]; a stack starts P_0 = P and P_1.. = 0 (the shallow model)."""
        start = torch.zeros_like(self.weight)
        if self.weight.dim() == 3:
            start[0] = P
        else:
            start.copy_(P)
        self.weight.copy_(start)

    @torch.no_grad()
    def zero_(self):
        """P = 0 (``--prompt-init zero``)."""
        self.weight.zero_()


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
        if init == "zero":
            self.zero_()

    def forward(self):
        return torch.matmul(self.A, self.B)

    @torch.no_grad()
    def start_from_(self, P):
        """A B = the best rank-b approximation of P [l, d] (``split_low_rank``). A stack starts
        A_0 B_0 there and B_k = 0 for k >= 1 (A_k keeps its draw: P_k = 0, LoRA-style)."""
        A, B = split_low_rank(P, self.B.size(-2))
        if self.A.dim() == 3:
            self.A[0], self.B[0] = A, B
            self.B[1:] = 0
        else:
            self.A.copy_(A), self.B.copy_(B)

    @torch.no_grad()
    def zero_(self):
        """B = 0, A kept (LoRA-style): P = 0, and dL/dB = A^T dL/dP is not."""
        self.B.zero_()


class RankProbePrompt(nn.Module):
    """The rank probe of DPT section 2.2 (Eq. 3): P = U ReLU(diag(s)) V.

    U [l, r], V [r, d] and s [r] train; s starts positive (``s_init``). The number of positive
    entries of s upper-bounds the rank of P (paper appendix A.1); entries that cross zero stay
    at zero gradient through the ReLU, so the count only falls (paper Figure 3).
    """

    def __init__(self, length, dim, rank, init="uniform", scale=0.5, s_init=0.02):
        super().__init__()
        if not s_init > 0:
            raise ConfigError(f"rank probe: s must start positive, got s_init={s_init}")
        self.U = nn.Parameter(init_prompt_(torch.empty(length, rank), init, scale))
        self.s = nn.Parameter(torch.full((rank,), float(s_init)))
        self.V = nn.Parameter(init_prompt_(torch.empty(rank, dim), init, scale))
        if init == "zero":
            self.zero_()

    def forward(self):
        # U diag(relu(s)) V without forming the diagonal matrix: scale U's columns
        return torch.matmul(self.U * F.relu(self.s), self.V)

    @torch.no_grad()
    def start_from_(self, P):
        """U ReLU(diag(s)) V = P's best rank-r approximation at the current s (> 0):
        ``split_low_rank`` with U's columns divided by s."""
        U, V = split_low_rank(P, self.s.numel())
        self.U.copy_(U / F.relu(self.s).clamp_min(torch.finfo(self.s.dtype).tiny)), self.V.copy_(V)

    @torch.no_grad()
    def zero_(self):
        """V = 0, U kept (LoRA-style)."""
        self.V.zero_()

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
        if init == "zero":
            self.zero_()

    def forward(self):
        P = self.weight
        return P + self.norm(self.up(F.relu(self.down(P))))

    @torch.no_grad()
    def start_from_(self, P):
        """The skip path's P starts at P (the MLP's LayerNorm output is added on top of it)."""
        self.weight.copy_(P)

    @torch.no_grad()
    def zero_(self):
        """The skip path's P = 0 (the MLP still adds LN(MLP(0)) = LN(b_up + ...))."""
        self.weight.zero_()


# ---------------------------------------------------------------------------------------- --prompt-matrix
# from roberta_prompt's options: --prompt-length l, --prompt-init(-scale), --dpt-*, --residual-prompt-bottleneck
register_prompt_matrix(
    "full",
    lambda a, dim, stack: FullPrompt(a.prompt_length, dim, stack=stack, init=a.prompt_init, scale=a.prompt_init_scale),
    deep=True,
)
register_prompt_matrix(
    "low-rank",
    lambda a, dim, stack: LowRankPrompt(
        a.prompt_length, dim, a.dpt_bottleneck, stack=stack, init=a.prompt_init, scale=a.prompt_init_scale
    ),
    deep=True,
)
register_prompt_matrix(
    "rank-probe",
    lambda a, dim, stack: RankProbePrompt(
        a.prompt_length, dim, a.dpt_probe_rank, init=a.prompt_init, scale=a.prompt_init_scale, s_init=a.dpt_probe_s_init
    ),
)
register_prompt_matrix(
    "residual",
    lambda a, dim, stack: ResidualPrompt(
        a.prompt_length, dim, a.residual_prompt_bottleneck, init=a.prompt_init, scale=a.prompt_init_scale
    ),
)
