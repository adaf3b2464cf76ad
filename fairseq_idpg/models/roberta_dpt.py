"""``--arch roberta_dpt``: decomposed prompt tuning (DPT, paper 002) on a frozen RoBERTa, its rank
probe, residual prompt tuning, deep DPT, and vanilla prompt tuning as the reference (SPEC section 2).

The paper ran T5 only and names encoder-only models as future work; on RoBERTa the l prompt
vectors are inserted into the token embeddings at ``--prompt-position`` (0: right after ``<s>``)
with ordinary consecutive positions, before the learned positions, the embedding LayerNorm and
dropout (``modules/prompted_encoder.py``, the one implementation shared with IDPG); the
classification head reads ``<s>``. Every backbone tensor is frozen; the prompt and the head train.

``--dpt-preset`` picks the parameterisation of P (``modules/low_rank_prompt.py``); an explicit
``--dpt-prompt`` / ``--dpt-deep`` overrides the preset:

=====================  ==================================================  ======================
preset                 P                                                    trainable (no head)
=====================  ==================================================  ======================
dpt                    A B  (Eq. 5), A [l, b], B [b, d]                     l b + b d
dpt-rank-probe         U ReLU(diag(s)) V  (Eq. 3), r = l by default         l r + r + r d
residual-prompt        P + LN(W_up ReLU(W_down P))  (bottleneck m = 400)    l d + 2 d m + m + 3 d
deep-dpt               A_k B_k for k = 0 .. L-1 (beyond the paper)          L (l b + b d)
prompt-tuning          P [l, d] itself (the paper's vanilla PT)             l d
deep-prompt-tuning     P_k [l, d], k = 0 .. L-1 (P-tuning v2, additive)     L l d
=====================  ==================================================  ======================

Deep variants use the P-tuning v2 / M-IDPG additive scheme: P_0 is inserted at the input and
P_k is added to the hidden states at the prompt slots after layer k = 1 .. L-1 (nothing after
the last layer). The rank probe logs the number of positive entries of s as ``prompt_rank``
at every validation of fairseq-train (``scripts/plot_rank_probe.py`` plots it).

Build-time checks (one line naming the flag): a low-rank prompt needs b < min(l, d), the probe
r <= min(l, d); the l prompt vectors must leave room for an input within ``--max-positions``
(the task then truncates inputs to ``--max-positions`` - l).
"""
import logging

from fairseq.logging import metrics
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture, roberta_large_architecture

from fairseq_idpg.methods import register_method
from fairseq_idpg.models.frozen_roberta import FrozenBackboneRobertaModel
from fairseq_idpg.modules.low_rank_prompt import (
    INITS,
    FullPrompt,
    LowRankPrompt,
    RankProbePrompt,
    ResidualPrompt,
)
from fairseq_idpg.modules.prompt_insertion import MIN_INPUT_TOKENS, check_position, task_is_pair
from fairseq_idpg.modules.prompted_encoder import prompted_features

logger = logging.getLogger(__name__)

PARAMETERISATIONS = ("low-rank", "rank-probe", "residual", "full")
DEEP_PARAMETERISATIONS = ("low-rank", "full")
PRESETS = {
    "dpt": {"dpt_prompt": "low-rank", "dpt_deep": False},
    "dpt-rank-probe": {"dpt_prompt": "rank-probe", "dpt_deep": False},
    "residual-prompt": {"dpt_prompt": "residual", "dpt_deep": False},
    "deep-dpt": {"dpt_prompt": "low-rank", "dpt_deep": True},
    "prompt-tuning": {"dpt_prompt": "full", "dpt_deep": False},
    "deep-prompt-tuning": {"dpt_prompt": "full", "dpt_deep": True},
}
DEFAULTS = {  # SPEC section 2: l = 100, b = 10; residual PT bottleneck 400; uniform(-0.5, 0.5)
    "dpt_length": 100,
    "dpt_bottleneck": 10,
    "dpt_init": "uniform",
    "dpt_init_scale": 0.5,
    "dpt_probe_s_init": 0.02,
    "dpt_residual_bottleneck": 400,
    "prompt_position": 0,
}
RANK_LOG_KEY = "prompt_rank"
RANK_LOG_PRIORITY = 30  # printed after loss, accuracy and the GLUE metrics


def apply_dpt_defaults(args):
    """Fill the DPT flags left unset: the preset's parameterisation, then ``DEFAULTS``.

    Idempotent (fairseq calls the architecture at parse time; ``build_model`` calls it again
    for models built from a plain namespace or a stored config).
    """
    unset = lambda key: getattr(args, key, None) is None  # noqa: E731  (argparse leaves None)
    if unset("dpt_preset"):
        args.dpt_preset = "dpt"
    if args.dpt_preset not in PRESETS:
        raise ValueError(f"--dpt-preset must be one of {', '.join(PRESETS)}, got {args.dpt_preset!r}")
    for key, value in {**PRESETS[args.dpt_preset], **DEFAULTS}.items():
        if unset(key):
            setattr(args, key, value)
    dim = getattr(args, "encoder_embed_dim", None)
    if unset("dpt_probe_rank") and dim:
        args.dpt_probe_rank = min(args.dpt_length, dim)  # the full rank (paper: 100 = l)


def check_dpt_args(args, dim, num_layers, max_positions):
    """Raise ValueError (one line naming the flag) for settings that cannot work."""
    kind, l = args.dpt_prompt, args.dpt_length
    if kind not in PARAMETERISATIONS:
        raise ValueError(f"--dpt-prompt must be one of {', '.join(PARAMETERISATIONS)}, got {kind!r}")
    if l < 1:
        raise ValueError(f"--dpt-length must be >= 1, got {l}")
    room = max_positions - MIN_INPUT_TOKENS
    if l > room:
        raise ValueError(
            f"--dpt-length {l} does not fit --max-positions {max_positions}: prompt and input share the "
            f"positions, and at most {room} prompt vectors leave room for an input"
        )
    full_rank = min(l, dim)
    if kind == "low-rank" and not 1 <= args.dpt_bottleneck < full_rank:
        raise ValueError(
            f"--dpt-bottleneck {args.dpt_bottleneck} must be in [1, {full_rank - 1}]: a low-rank prompt needs "
            f"b < min(--dpt-length {l}, encoder dim {dim}) (--dpt-prompt full trains an unconstrained prompt)"
        )
    if kind == "rank-probe" and not 1 <= args.dpt_probe_rank <= full_rank:
        raise ValueError(
            f"--dpt-probe-rank {args.dpt_probe_rank} must be in [1, {full_rank}]: the rank of an "
            f"l x d prompt is at most min(--dpt-length {l}, encoder dim {dim})"
        )
    if kind == "rank-probe" and not args.dpt_probe_s_init > 0:
        raise ValueError(f"--dpt-probe-s-init must be > 0 (the probe counts the entries of s that stay positive), got {args.dpt_probe_s_init}")
    if kind == "residual" and args.dpt_residual_bottleneck < 1:
        raise ValueError(f"--dpt-residual-bottleneck must be >= 1, got {args.dpt_residual_bottleneck}")
    if args.dpt_deep and kind not in DEEP_PARAMETERISATIONS:
        raise ValueError(f"--dpt-deep needs --dpt-prompt {' or '.join(DEEP_PARAMETERISATIONS)}, got {kind}")
    if args.dpt_deep and num_layers < 2:
        raise ValueError(f"--dpt-deep needs at least 2 encoder layers, got --encoder-layers {num_layers}")
    if args.dpt_init not in INITS:
        raise ValueError(f"--dpt-init must be one of {', '.join(INITS)}, got {args.dpt_init!r}")
    if not args.dpt_init_scale > 0:
        raise ValueError(f"--dpt-init-scale must be > 0, got {args.dpt_init_scale}")
    check_position(args.prompt_position, is_pair=True)  # the range; pairs are checked against the task


def build_prompt(args, dim, num_layers):
    """The prompt module of ``args``: forward() -> P [l, d], or [L, l, d] with ``--dpt-deep``."""
    l, init, scale = args.dpt_length, args.dpt_init, args.dpt_init_scale
    stack = num_layers if args.dpt_deep else 0
    if args.dpt_prompt == "low-rank":
        return LowRankPrompt(l, dim, args.dpt_bottleneck, stack=stack, init=init, scale=scale)
    if args.dpt_prompt == "full":
        return FullPrompt(l, dim, stack=stack, init=init, scale=scale)
    if args.dpt_prompt == "rank-probe":
        return RankProbePrompt(l, dim, args.dpt_probe_rank, init=init, scale=scale, s_init=args.dpt_probe_s_init)
    return ResidualPrompt(l, dim, args.dpt_residual_bottleneck, init=init, scale=scale)


@register_model("roberta_dpt")
class RobertaDPTModel(FrozenBackboneRobertaModel):
    """Frozen RoBERTa + a DPT-family soft prompt (see the module docstring)."""

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        apply_dpt_defaults(args)
        enc = encoder.sentence_encoder
        dim, num_layers = enc.embed_tokens.embedding_dim, len(enc.layers)
        check_dpt_args(args, dim, num_layers, args.max_positions)
        self.prompt = build_prompt(args, dim, num_layers)
        self.position = args.prompt_position
        self.deep = bool(args.dpt_deep)
        # the task reserves these positions when it truncates inputs (peft_sentence_prediction)
        self.num_inserted_tokens = args.dpt_length

    @staticmethod
    def add_args(parser):
        FrozenBackboneRobertaModel.add_args(parser)
        # no argparse defaults: the preset, then DEFAULTS, fill what is not given (apply_dpt_defaults)
        group = parser.add_argument_group("DPT: decomposed prompt tuning, rank probe, residual and deep prompts")
        group.add_argument("--dpt-preset", choices=list(PRESETS), help="parameterisation of the prompt (default dpt)")
        group.add_argument("--dpt-prompt", choices=PARAMETERISATIONS, help="P = A B (low-rank), U ReLU(diag(s)) V (rank-probe), P + LN(MLP(P)) (residual), or P itself (full); overrides the preset")
        group.add_argument("--dpt-deep", action="store_true", default=None, help="a prompt per layer: inserted at the input, added at the prompt slots after layers 1..L-1")
        group.add_argument("--dpt-length", type=int, metavar="L", help="prompt length l (default 100)")
        group.add_argument("--dpt-bottleneck", type=int, metavar="B", help="rank b of P = A B, below min(l, d) (default 10)")
        group.add_argument("--dpt-init", choices=INITS, help="uniform(-s, s) (authors' code, default) or normal(0, s^2) (the paper's Gaussian)")
        group.add_argument("--dpt-init-scale", type=float, metavar="S", help="s of --dpt-init (default 0.5)")
        group.add_argument("--dpt-probe-rank", type=int, metavar="R", help="rank probe: size r of s (default min(l, d))")
        group.add_argument("--dpt-probe-s-init", type=float, metavar="V", help="rank probe: initial (positive) value of every s_i (default 0.02)")
        group.add_argument("--dpt-residual-bottleneck", type=int, metavar="M", help="residual prompt: MLP bottleneck m (default 400)")
        group.add_argument("--prompt-position", type=int, metavar="N", help="insertion position 0-4 (SPEC section 0; default 0, right after <s>)")

    @classmethod
    def build_model(cls, args, task):
        from omegaconf import OmegaConf

        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)
        apply_dpt_defaults(args)
        is_pair = task_is_pair(task)
        if is_pair is not None:
            check_position(args.prompt_position, is_pair)
        return super().build_model(args, task)

    # ------------------------------------------------------------------ forward
    def prompts(self):
        """(P_0 [l, d] inserted at the input, ``layer_prompts`` fn for the deep variants or None)."""
        P = self.prompt()
        if not self.deep:
            return P, None
        return P[0], lambda layer, x: P[layer]  # P [L, l, d]: P[k] is added after layer k

    def forward(self, src_tokens, features_only=False, return_all_hiddens=False, classification_head_name=None, **kwargs):
        """Like ``RobertaModel.forward``: (logits or features [B, T + l, C] or LM output, extra).

        ``extra``: ``inner_states`` (the final layer only, T x B x C) and ``prompt_slots`` [B, T + l].
        """
        total = src_tokens.size(1) + self.num_inserted_tokens
        if total > self.args.max_positions:
            raise ValueError(
                f"{src_tokens.size(1)} input tokens + --dpt-length {self.num_inserted_tokens} exceed "
                f"--max-positions {self.args.max_positions} (peft_sentence_prediction truncates inputs to fit)"
            )
        if not self.training and isinstance(self.prompt, RankProbePrompt):
            # lands in the active validation aggregator of fairseq-train; the value is the same
            # for every batch of a validation, so the weighted average is that value exactly
            metrics.log_scalar(RANK_LOG_KEY, self.prompt.num_positive(), weight=1, priority=RANK_LOG_PRIORITY, round=0)
        prompt, layer_prompts = self.prompts()
        features, slots = prompted_features(
            self.encoder.sentence_encoder, src_tokens, prompt, self.position, layer_prompts=layer_prompts
        )
        if classification_head_name is not None:
            x = self.classification_heads[classification_head_name](features)
        elif features_only:
            x = features
        else:
            x = self.encoder.output_layer(features, **kwargs)
        return x, {"inner_states": [features.transpose(0, 1)], "prompt_slots": slots}


def _dpt_architecture(args):
    apply_dpt_defaults(args)


@register_model_architecture("roberta_dpt", "roberta_dpt")
def roberta_dpt_architecture(args):
    base_architecture(args)  # roberta-base sizes unless the --encoder-* flags say otherwise
    _dpt_architecture(args)


@register_model_architecture("roberta_dpt", "roberta_dpt_base")
def roberta_dpt_base_architecture(args):
    roberta_dpt_architecture(args)


@register_model_architecture("roberta_dpt", "roberta_dpt_large")
def roberta_dpt_large_architecture(args):
    roberta_large_architecture(args)
    _dpt_architecture(args)


# ---------------------------------------------------------------------- methods (scripts/run.sh --method)
# SPEC section 2 (T5): AdamW, lr 0.3, linear decay with 10% warmup. Kept: the linear
# (polynomial) decay with 10% warmup and the recipe's Adam with decoupled weight decay. Not kept:
# lr 0.3, tuned for T5 prompts alone; here the classification head trains with the same lr, so
# the lr is the top of IDPG's prompt-tuning grid for RoBERTa (SPEC section 1; docs/dpt.md).
DPT_LR = 5e-3
for _name, _description in (
    ("dpt", "DPT (paper 002): P = A B, l = 100, b = 10"),
    ("dpt-rank-probe", "DPT section 2.2 rank probe: P = U ReLU(diag(s)) V, logs prompt_rank"),
    ("residual-prompt", "residual prompt tuning (DPT's baseline), l = 100, bottleneck 400"),
    ("deep-dpt", "deep DPT: a low-rank prompt A_k B_k at every layer (P-tuning v2 scheme)"),
    ("prompt-tuning-l100", "vanilla prompt tuning with DPT's l = 100 (the paper's PT baseline)"),
):
    _preset = "prompt-tuning" if _name == "prompt-tuning-l100" else _name
    register_method(
        _name,
        ["--arch", "roberta_dpt", "--dpt-preset", _preset, "--save-trainable-only"],
        lr=DPT_LR,
        scheduler="polynomial_decay",
        warmup=0.1,
        description=_description,
    )
