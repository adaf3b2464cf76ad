"""``--arch roberta_prompt``: static soft prompts on a frozen RoBERTa: prompt tuning, P-tuning v2,
decomposed prompt tuning (DPT) with its rank probe, residual prompt tuning and deep DPT.

One prompt P [l, d] (``--prompt-length`` l) is inserted at ``--prompt-position`` (0: right after
``<s>``; ``prompted_roberta.py`` owns the insertion and the forward pass); with ``--prompt-deep``
a stack P_0..P_{L-1} [L, l, d] is used in IDPG's P-tuning v2 scheme (IDPG section 4.1, appendix
A.1.2): P_0 inserted at the input, P_k added to the hidden states at the prompt slots after layer
k = 1..L-1 (nothing after the last layer). ``--prompt-matrix`` says how P is parameterised: one
choice per parameterisation registered in ``modules/prompts/`` (``register_prompt_matrix``, read
when parsing and building); those of ``soft_prompts.py``:

=========== ==================================================  ===================================
matrix      P                                                   trainable (no head), x L when deep
=========== ==================================================  ===================================
full        P itself (prompt tuning, Lester et al. 2021)        l d
low-rank    A B (DPT Eq. 5), A [l, b], B [b, d]                 l b + b d
rank-probe  U ReLU(diag(s)) V (DPT Eq. 3), r = min(l, d)        l r + r + r d      (not deep)
residual    P + LN(W_up ReLU(W_down P)) (bottleneck m = 400)    l d + 2 d m + m + 3 d  (not deep)
=========== ==================================================  ===================================

Presets (``--prompt-preset NAME``; explicit flags win) are the method records of this architecture
(``fairseq_idpg/methods.py``: ``--prompt-matrix``, ``--prompt-length``, ``--prompt-deep``; the name
says the length; docs/dpt.md lists them), plus ``deep-prompt-tuning-100``, the export of deep-dpt
(full, 100, deep), which no method trains. The default is ``dpt``.

Every prompt tensor starts U(-0.5, 0.5) by default (``--prompt-init``, ``--prompt-init-scale``), as
the authors' DPT code does; IDPG Table 1's prompt records (``prompt-tuning-5``, ``-134``, ``p-tuning-v2-5``)
start N(0, 0.02^2), where the IDPG authors' whole model starts its prompts (their ``init_bert_params``).
``--prompt-init vocab`` starts P from l rows of
the frozen token embeddings once the backbone is loaded (Lester et al. 2021 section 3; PEFT's
RANDOM_DISCRETE; DPT: their best rank-b approximation A B; ``--prompt-init-top-tokens N`` draws
from the first N ordinary dictionary entries, Lester's 5,000 most frequent for RoBERTa's
frequency-sorted dict.txt); ``--prompt-init zero`` starts P = 0 (DPT: B = 0, LoRA-style). Why and
with which learning rates: docs/long-prompts.md. DPT ran T5 only; on RoBERTa the prompt goes in like
prompt tuning's. The rank probe logs the number of positive entries of s as ``prompt_rank`` at
every validation of fairseq-train (``scripts/plot_rank_probe.py`` plots it).
"""

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from fairseq.logging import metrics
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture, roberta_large_architecture

from fairseq_idpg.errors import ConfigError
from fairseq_idpg.methods import presets_of
from fairseq_idpg.models.prompted_roberta import PromptedRobertaModel
from fairseq_idpg.modules.prompts.soft_prompts import INITS, PROMPT_MATRICES, RankProbePrompt, sample_vocab_rows
from fairseq_idpg.options import NON_NEGATIVE, POSITIVE, Options, check_at_least, option

PRESET_OPTION = "prompt_preset"
# the one preset without a method: what scripts/export_dpt_prompt.py turns deep-dpt into (P_k = A_k B_k stored)
EXPORT_PRESETS = {"deep-prompt-tuning-100": {"prompt_matrix": "full", "prompt_length": 100, "prompt_deep": True}}
RANK_LOG_KEY = "prompt_rank"
RANK_LOG_PRIORITY = 30  # printed after loss, accuracy and the GLUE metrics


@dataclass
class PromptOptions(Options):
    """The options of ``roberta_prompt`` (``--prompt-preset`` apart); DPT section 3: b = 10; residual prompt
    tuning's bottleneck 400; U(-0.5, 0.5)."""

    title: ClassVar[str] = "Soft prompt"

    prompt_matrix: str = option(
        "low-rank",
        "P itself (full), A B (low-rank), U ReLU(diag(s)) V (rank-probe), P + LN(MLP(P)) (residual), "
        "or another registered parameterisation (modules/prompts/)",
        choices=PROMPT_MATRICES,  # the registry itself: read when parsing, so later registrations count
    )
    prompt_length: int = option(100, "prompt length l", metavar="L")
    prompt_deep: bool = option(
        False, "a prompt per layer (P-tuning v2): inserted at the input, added at the prompt slots after 1..L-1"
    )
    prompt_init: str = option(
        "uniform",
        "uniform(-s, s) (default), normal(0, s^2), vocab (rows of the frozen token embeddings; "
        "DPT: their rank-b SVD) or zero (P = 0; DPT: B = 0, LoRA-style)",
        choices=INITS,
    )
    prompt_init_scale: float = option(0.5, "s of --prompt-init (default 0.5)", metavar="S", check=POSITIVE)
    prompt_init_top_tokens: int = option(
        0,  # --prompt-init vocab: every ordinary token
        "--prompt-init vocab: draw from the first N ordinary dictionary entries (0: all, default; "
        "Lester et al. use the 5000 most frequent, the first 5000 of RoBERTa's dict.txt)",
        metavar="N",
        check=NON_NEGATIVE,
    )
    dpt_bottleneck: int = option(10, "rank b of P = A B, below min(l, d) (10)", "DPT", metavar="B")
    # derived: configure makes it min(l, d) when unset
    dpt_probe_rank: Optional[int] = option(
        None, "rank probe: size r of s (min(l, d))", "DPT", metavar="R", derived=True
    )
    dpt_probe_s_init: float = option(0.02, "rank probe: initial s_i > 0 (0.02)", "DPT", metavar="V")
    residual_prompt_bottleneck: int = option(
        400, "bottleneck m of the prompt's MLP (400)", "Residual prompt", metavar="M"
    )


DEFAULTS = PromptOptions.defaults()  # what a preset leaves open


def presets():
    """``{name: settings}`` of ``--prompt-preset``: the records of ``fairseq_idpg.methods``, then the export's."""
    return {**presets_of(PRESET_OPTION), **EXPORT_PRESETS}


def full_preset(length, deep):
    """The preset that trains P itself (``--prompt-matrix full``) with this depth, of this length
    when there is one (an explicit ``--prompt-length`` wins over a preset's either way)."""
    every = presets()
    full = [name for name, p in every.items() if p["prompt_matrix"] == "full" and p["prompt_deep"] == bool(deep)]
    return next((name for name in full if every[name]["prompt_length"] == length), full[-1])


def build_prompt(args, dim, num_layers):
    """The prompt module of ``args``: ``forward()`` -> P [l, d], or [L, l, d] with ``--prompt-deep``."""
    return PROMPT_MATRICES[args.prompt_matrix].build(args, dim, num_layers if args.prompt_deep else 0)


def deep_matrices():
    """The ``--prompt-matrix`` choices that build a stack of L prompts (``--prompt-deep``)."""
    return [name for name, matrix in PROMPT_MATRICES.items() if matrix.deep]


@register_model("roberta_prompt")
class RobertaPromptModel(PromptedRobertaModel):
    """Frozen RoBERTa + a static soft prompt (see the module docstring)."""

    PROMPT_LENGTH = "prompt_length"
    OPTIONS, DEFAULTS = PromptOptions, DEFAULTS
    PRESET_OPTION, DEFAULT_PRESET = PRESET_OPTION, "dpt"

    @classmethod
    def presets(cls):
        return presets()  # the records', then the export's

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        self.prompt = build_prompt(args, args.encoder_embed_dim, args.encoder_layers)
        self.deep = bool(args.prompt_deep)

    @staticmethod
    def add_args(parser):
        PromptedRobertaModel.add_args(parser)
        # no argparse defaults: the preset, then DEFAULTS, fill what is not given (configure)
        group = parser.add_argument_group(PromptOptions.title)
        group.add_argument(
            "--prompt-preset", choices=presets(), help="a method's configuration (fairseq_idpg/methods.py; default dpt)"
        )
        PromptOptions.add_args(parser, group)  # and the groups DPT, Residual prompt

    @classmethod
    def configure(cls, args):
        super().configure(args)
        dim = getattr(args, "encoder_embed_dim", None)
        if getattr(args, "dpt_probe_rank", None) is None and dim:
            args.dpt_probe_rank = min(args.prompt_length, dim)  # the full rank (DPT: 100 = l)

    @classmethod
    def check_args(cls, args, task):
        """The checks of several options (each option's own: ``PromptOptions``)."""
        matrix, length, dim, num_layers = (
            args.prompt_matrix,
            args.prompt_length,
            args.encoder_embed_dim,
            args.encoder_layers,
        )
        full_rank = min(length, dim)
        if matrix == "low-rank" and not 1 <= args.dpt_bottleneck < full_rank:
            raise ConfigError(
                f"--dpt-bottleneck {args.dpt_bottleneck} must be in [1, {full_rank - 1}]: a low-rank prompt needs "
                f"b < min(--prompt-length {length}, encoder dim {dim}) (--prompt-matrix full trains an unconstrained "
                f"prompt)"
            )
        if matrix == "rank-probe" and not 1 <= args.dpt_probe_rank <= full_rank:
            raise ConfigError(
                f"--dpt-probe-rank {args.dpt_probe_rank} must be in [1, {full_rank}]: the rank of an "
                f"l x d prompt is at most min(--prompt-length {length}, encoder dim {dim})"
            )
        if matrix == "rank-probe" and not args.dpt_probe_s_init > 0:
            raise ConfigError(
                f"--dpt-probe-s-init must be > 0 (the probe counts the entries of s that stay positive), "
                f"got {args.dpt_probe_s_init}"
            )
        if matrix == "residual":
            check_at_least(args, "residual_prompt_bottleneck", 1)
        if args.prompt_deep and matrix not in deep_matrices():
            raise ConfigError(f"--prompt-deep needs --prompt-matrix {' or '.join(deep_matrices())}, got {matrix}")
        if args.prompt_deep and num_layers < 2:
            raise ConfigError(f"--prompt-deep needs at least 2 encoder layers, got --encoder-layers {num_layers}")

    @classmethod
    def build_model(cls, args, task):
        model = super().build_model(args, task)  # the backbone is loaded here
        # on the meta device (parameter counts, models/build.py) there is no table to sample from
        if args.prompt_init == "vocab" and not model.encoder.sentence_encoder.embed_tokens.weight.is_meta:
            model.start_prompt_from_vocab()
        return model

    def ordinary_tokens(self):
        """[V] bool: the dictionary entries a prompt may start from: not fairseq's specials
        (``<s> <pad> </s> <unk>``, ``<mask>``), bracketed markers (WordPiece ``[CLS]``,
        ``[unused0]``) or RoBERTa's ``madeupword`` fillers; only the first N of them with
        ``--prompt-init-top-tokens N``."""
        enc = self.encoder.sentence_encoder
        symbols = enc.dictionary.symbols
        nspecial = enc.dictionary.nspecial
        keep = [
            i >= nspecial
            and not (sym.startswith("<") and sym.endswith(">"))
            and not (sym.startswith("[") and sym.endswith("]"))
            and not sym.startswith("madeupword")
            for i, sym in enumerate(symbols)
        ]
        keep += [False] * (enc.embed_tokens.num_embeddings - len(keep))  # rows beyond the dictionary
        mask = torch.tensor(keep[: enc.embed_tokens.num_embeddings], dtype=torch.bool)
        top = self.args.prompt_init_top_tokens
        if top:
            mask &= mask.cumsum(0) <= top
        return mask

    def start_prompt_from_vocab(self):
        """``--prompt-init vocab``: P (P_0 when deep) starts at l distinct rows of the frozen token
        embeddings (``sample_vocab_rows``), through the prompt module's ``start_from_``."""
        table = self.encoder.sentence_encoder.embed_tokens.weight
        rows = sample_vocab_rows(table, self.args.prompt_length, self.ordinary_tokens())
        self.prompt.start_from_(rows)

    # ------------------------------------------------------------------ the prompts
    def prompts(self, src_tokens, **net_input):
        """(P_0 [l, d] inserted at the input, ``layer_prompts`` for the deep variants or None)."""
        P = self.prompt()
        if not self.deep:
            return P, None
        return P[0], lambda layer, x: P[layer]  # P [L, l, d]: P[k] is added after layer k

    def log_prompt_metrics(self):
        if torch._C._functorch.get_interpreter_stack() is not None:
            return  # tasks served together under vmap (the hub): no one rank to log, and no .item() there
        if not self.training and isinstance(self.prompt, RankProbePrompt):
            # lands in the active validation aggregator of fairseq-train; the value is the same
            # for every batch of a validation, so the weighted average is that value exactly
            metrics.log_scalar(RANK_LOG_KEY, self.prompt.num_positive(), weight=1, priority=RANK_LOG_PRIORITY, round=0)


@register_model_architecture("roberta_prompt", "roberta_prompt")
def roberta_prompt_architecture(args):
    base_architecture(args)  # roberta-base sizes unless the --encoder-* flags say otherwise
    RobertaPromptModel.configure(args)


@register_model_architecture("roberta_prompt", "roberta_prompt_base")
def roberta_prompt_base_architecture(args):
    roberta_prompt_architecture(args)


@register_model_architecture("roberta_prompt", "roberta_prompt_large")
def roberta_prompt_large_architecture(args):
    roberta_large_architecture(args)
    RobertaPromptModel.configure(args)
