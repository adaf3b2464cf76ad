"""``--arch roberta_blocks``: trained blocks inside the frozen RoBERTa's layers: inducer-tuning
(inducer-tuning sections 4.3-4.5) and the adapter-family baselines of its NLU table and of IDPG's
Table 1, with a trained classification head.

He et al. 2021's unified view: prefix tuning, LoRA and adapters are modifications of the
attention or FFN sublayer that compose. So this is one model with one block per concept, and a
method is a combination of blocks (``--blocks-preset``; flags given explicitly win,
``--blocks-preset inducer-lora --lora-rank 8 --inducer-output gated``):

| preset            | blocks                                                           | source                    |
|-------------------|------------------------------------------------------------------|---------------------------|
| inducer           | inducer r_k 6, r_v 4, extended value, residual output           | inducer-tuning Table 5    |
| inducer-lora      | inducer 2 / 4 + LoRA on W_q, r 4                                 | Table 5; section 4.5      |
| mam-inducer       | inducer 2 / 2 + LoRA on W_q, r 4 + parallel FFN adapter 12, s 2 | Table 5 (MAM)             |
| inducer-adaptive  | k~ = q, per-head value r_v 32                                    | Table 3 "Adaptive"        |
| inducer-extension | k~ = q, extended value r_v 5                                     | Table 3 "Extension"       |
| inducer-gating    | inducer 6 / 4 with the gated output (1 - lambda) Attn + lambda v~ | Table 3 "Gating"          |
| prefix-tuning     | key/value prefixes, l = 32, reparameterised by an MLP (m = 800)  | Li & Liang 2021           |
| lora              | LoRA on W_q and W_v, r = 16, alpha = 32, dropout 0.1             | Hu et al. 2021            |
| houlsby-adapter   | 2 adapters per layer (after attention, after FFN), r = 16        | Houlsby et al. 2019       |
| compacter         | 2 PHM adapters per layer, n = 4, r = 16, PHM rank 1              | IDPG appendix A.1.2       |
| mam-adapter       | prefixes l = 16 + parallel FFN adapter r = 16, s = 2             | He et al. 2021            |
| bitfit            | every bias of the encoder (and its LayerNorms) trains            | Ben Zaken et al. 2021     |

The Table 3 ablations get the NLU inducer-tuning budget (~0.61M on roberta-base): Table 5 sizes
them only for GPT-2 (docs/inducer.md gives the arithmetic). Sizes: ``--arch roberta_blocks``
(roberta-base) / ``roberta_blocks_large``; any other size through the ``--encoder-*`` flags
(``scripts/run.sh`` passes the checkpoint's). Bad settings fail at build time with one line
naming the flag (``check_args``).

The blocks go into the frozen encoder in place (``install_blocks``): prefixes, LoRA and the
inducer through ``modules.attention.augmented_self_attention.AugmentedSelfAttention``, the
adapters through ``modules.adapters.adapted_layer.AdaptedEncoderLayer``; BitFit through
``trains_backbone_parameter``.
"""

import logging

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture, roberta_base_architecture, roberta_large_architecture

from fairseq_idpg.models.frozen_roberta import FrozenBackboneRobertaModel
from fairseq_idpg.models.presets import check_at_least, check_choice, flag, resolve_preset
from fairseq_idpg.modules.adapters.adapted_layer import AdaptedEncoderLayer
from fairseq_idpg.modules.adapters.bottleneck import BottleneckAdapter, check_bottleneck
from fairseq_idpg.modules.adapters.compacter import CompacterAdapter
from fairseq_idpg.modules.attention.augmented_self_attention import AugmentedSelfAttention
from fairseq_idpg.modules.attention.inducer import OUTPUTS, Inducer
from fairseq_idpg.modules.attention.lora import LoRA
from fairseq_idpg.modules.attention.prefix import MLP_NAMES, PrefixEncoder, stored_prefixes

logger = logging.getLogger(__name__)
PREFIX_KEY = "prefix_encoder.kv"
PRESET = "blocks_preset"

# ---------------------------------------------------------------------- presets, as data
# value of each block option when neither the command line nor the preset sets it (= block off)
DEFAULTS = {
    # prefix tuning
    "prefix_length": 0,
    "prefix_mid_dim": 800,
    # LoRA
    "lora_rank": 0,
    "lora_alpha": 32.0,
    "lora_dropout": 0.1,
    "lora_targets": "q,v",
    # inducer-tuning
    "inducer_key_rank": 6,
    "inducer_value_rank": 0,
    "inducer_value": "extended",
    "inducer_output": "residual",
    "inducer_lambda": "masked",
    "inducer_lambda_dropout": 0.1,
    # sequential adapters
    "adapter": "none",
    "adapter_dim": 16,
    "compacter_n": 4,
    "compacter_rank": 1,
    # parallel FFN adapter
    "ffn_adapter_dim": 0,
    "ffn_adapter_scale": 2.0,
    # BitFit
    "bitfit": False,
}
# inducer-tuning's presets put a LoRA given on top of them on W_q only (section 4.5)
_INDUCER = {"lora_targets": "q", "inducer_value": "extended", "inducer_output": "residual"}
PRESETS = {
    # inducer-tuning, Table 5 (NLU rows: r_k / r_v / LoRA rank / FFN-adapter bottleneck)
    "inducer": dict(_INDUCER, inducer_key_rank=6, inducer_value_rank=4),
    "inducer-lora": dict(_INDUCER, inducer_key_rank=2, inducer_value_rank=4, lora_rank=4),
    "mam-inducer": dict(
        _INDUCER, inducer_key_rank=2, inducer_value_rank=2, lora_rank=4, ffn_adapter_dim=12, ffn_adapter_scale=2.0
    ),
    # Table 3 ablations, at the NLU budget of "inducer"
    "inducer-adaptive": dict(_INDUCER, inducer_key_rank=0, inducer_value_rank=32, inducer_value="per-head"),
    "inducer-extension": dict(_INDUCER, inducer_key_rank=0, inducer_value_rank=5),
    "inducer-gating": dict(_INDUCER, inducer_key_rank=6, inducer_value_rank=4, inducer_output="gated"),
    # the adapter family
    "prefix-tuning": {"prefix_length": 32},
    "lora": {"lora_rank": 16, "lora_targets": "q,v"},
    "houlsby-adapter": {"adapter": "houlsby", "adapter_dim": 16},
    "compacter": {"adapter": "compacter", "adapter_dim": 16, "compacter_n": 4, "compacter_rank": 1},
    "mam-adapter": {"prefix_length": 16, "ffn_adapter_dim": 16, "ffn_adapter_scale": 2.0},
    "bitfit": {"bitfit": True},
}
# options that are ranks / sizes (0: the block is off): a preset that sets one >= 1 needs it >= 1
SIZE_OPTIONS = ("prefix_length", "lora_rank", "inducer_value_rank", "adapter_dim", "ffn_adapter_dim", "compacter_rank")
ADAPTERS = ("none", "houlsby", "compacter")
INDUCER_VALUES = ("extended", "per-head")
INDUCER_LAMBDAS = ("masked", "unmasked")


# ---------------------------------------------------------------------- flags, one group per block
def add_prefix_args(parser):
    g = parser.add_argument_group("Prefix tuning (Li & Liang 2021)")
    g.add_argument("--prefix-length", type=int, metavar="L", help="virtual key/value vectors per layer (0: off)")
    g.add_argument("--prefix-mid-dim", type=int, metavar="M", help="hidden size of the reparameterisation MLP (800)")


def add_lora_args(parser):
    g = parser.add_argument_group("LoRA (Hu et al. 2021; inducer-tuning section 4.5)")
    g.add_argument("--lora-rank", type=int, metavar="R", help="rank of the update (0: off)")
    g.add_argument("--lora-alpha", type=float, help="scaling alpha: the update is (alpha / r) B A (32)")
    g.add_argument("--lora-dropout", type=float, help="dropout on the LoRA input (0.1)")
    g.add_argument("--lora-targets", metavar="q,v", help="projections that get LoRA: q, v or q,v")


def add_inducer_args(parser):
    g = parser.add_argument_group("Inducer-tuning (inducer-tuning sections 4.3-4.4)")
    g.add_argument("--inducer-value-rank", type=int, metavar="R_V", help="bottleneck of the value MLP (0: off)")
    g.add_argument(
        "--inducer-key-rank", type=int, metavar="R_K", help="bottleneck of MLP_k (k~ = q + MLP_k(q)); 0: k~ = q (6)"
    )
    g.add_argument(
        "--inducer-value",
        choices=INDUCER_VALUES,
        help="extended: value up-projection fused with W_o (section 4.4); per-head: v~ in each head",
    )
    g.add_argument(
        "--inducer-output",
        choices=OUTPUTS,
        help="residual: Attn + lambda Delta (released code); gated: (1 - lambda) Attn + lambda v~ (paper)",
    )
    g.add_argument(
        "--inducer-lambda",
        choices=INDUCER_LAMBDAS,
        help="masked: padded keys out of lambda's normaliser (default); unmasked: as the released code",
    )
    g.add_argument("--inducer-lambda-dropout", type=float, metavar="P", help="dropout on lambda (0.1)")


def add_adapter_args(parser):
    g = parser.add_argument_group("Sequential adapters (Houlsby et al. 2019; Compacter)")
    g.add_argument("--adapter", choices=ADAPTERS, help="2 adapters per layer, after attention and after the FFN")
    g.add_argument("--adapter-dim", type=int, metavar="R", help="bottleneck r (16)")
    g.add_argument("--compacter-n", type=int, metavar="N", help="Kronecker terms n of Compacter's PHM layers (4)")
    g.add_argument("--compacter-rank", type=int, metavar="K", help="rank of Compacter's factorised B_i = s_i t_i (1)")


def add_ffn_adapter_args(parser):
    g = parser.add_argument_group("Parallel FFN adapter (He et al. 2021)")
    g.add_argument(
        "--ffn-adapter-dim", type=int, metavar="R", help="bottleneck of the adapter beside each FFN (0: off)"
    )
    g.add_argument("--ffn-adapter-scale", type=float, metavar="S", help="scale s of its output (2)")


def add_bitfit_args(parser):
    g = parser.add_argument_group("BitFit (Ben Zaken et al. 2021)")
    g.add_argument("--bitfit", action="store_true", default=None, help="train every bias of the encoder")


# ---------------------------------------------------------------------- build-time checks
def lora_targets(args):
    """The projections that get LoRA: a subset of {"q", "v"} (empty when LoRA is off)."""
    return {t for t in str(args.lora_targets).split(",") if t} if args.lora_rank else set()


def check_args(args, preset):
    """One clear line per bad setting, before anything is built."""
    base_architecture(args)
    dim, heads = args.encoder_embed_dim, args.encoder_attention_heads
    if heads < 1 or dim % heads:
        raise ValueError(f"--encoder-attention-heads {heads} must divide --encoder-embed-dim {dim}")
    for key in SIZE_OPTIONS:
        value = getattr(args, key)
        if value < 0:
            raise ValueError(f"{flag(key)} must be >= 0, got {value}")
        if value == 0 and preset.get(key, 0) >= 1:
            raise ValueError(f"{flag(key)} must be >= 1 for {flag(PRESET)} {getattr(args, PRESET)} (got 0)")
    if args.prefix_length:
        check_at_least(args, "prefix_mid_dim", 1)
    if args.lora_rank and (not lora_targets(args) or lora_targets(args) - {"q", "v"}):
        raise ValueError(f"--lora-targets must be q, v or q,v, got {args.lora_targets!r}")
    check_inducer_args(args)
    check_choice(args, "adapter", ADAPTERS)
    if args.adapter != "none":
        check_bottleneck("--adapter-dim", args.adapter_dim, dim)
    if args.adapter == "compacter":
        n = args.compacter_n
        if n < 1 or dim % n or args.adapter_dim % n:
            raise ValueError(
                f"--compacter-n {n} must divide --encoder-embed-dim {dim} and --adapter-dim {args.adapter_dim}"
            )
        check_at_least(args, "compacter_rank", 1)
    if args.ffn_adapter_dim:
        check_bottleneck("--ffn-adapter-dim", args.ffn_adapter_dim, dim)
    if not (
        args.prefix_length
        or args.lora_rank
        or args.inducer_value_rank
        or args.adapter != "none"
        or args.ffn_adapter_dim
        or args.bitfit
    ):
        raise ValueError(f"nothing to train: give {flag(PRESET)} ({', '.join(PRESETS)}) or a block's flags")


def check_inducer_args(args):
    key_rank = args.inducer_key_rank
    if key_rank < 0 or key_rank == 1:
        raise ValueError(
            f"--inducer-key-rank must be 0 (k~ = q) or >= 2, got {key_rank} "
            "(the released code builds no key MLP below 2)"
        )
    if not 0.0 <= args.inducer_lambda_dropout < 1.0:
        raise ValueError(f"--inducer-lambda-dropout must be in [0, 1), got {args.inducer_lambda_dropout}")
    check_choice(args, "inducer_value", INDUCER_VALUES)
    check_choice(args, "inducer_output", OUTPUTS)
    check_choice(args, "inducer_lambda", INDUCER_LAMBDAS)


# ---------------------------------------------------------------------- installing the blocks
def install_blocks(model, args):
    """Put the configured blocks into ``model``'s frozen encoder (in place; they train)."""
    encoder = model.encoder.sentence_encoder
    dim, heads, num_layers = args.encoder_embed_dim, args.encoder_attention_heads, len(encoder.layers)
    if args.prefix_length:
        model.prefix_encoder = PrefixEncoder(num_layers, dim, args.prefix_length, args.prefix_mid_dim)
    prefix = getattr(model, "prefix_encoder", None)
    targets = lora_targets(args)

    def lora():
        return LoRA(dim, dim, args.lora_rank, args.lora_alpha, args.lora_dropout)

    def inducer():
        return Inducer(
            dim,
            heads,
            args.inducer_key_rank,
            args.inducer_value_rank,
            extend_value=args.inducer_value == "extended",
            output=args.inducer_output,
            mask_lambda=args.inducer_lambda == "masked",
            lambda_dropout=args.inducer_lambda_dropout,
        )

    def sequential_adapter():
        if args.adapter == "houlsby":
            return BottleneckAdapter(dim, args.adapter_dim, init="houlsby")
        return CompacterAdapter(dim, args.adapter_dim, args.compacter_n, args.compacter_rank)

    for i, layer in enumerate(encoder.layers):
        # attention side; built in this order (inducer, LoRA q, LoRA v), which fixes the random init
        attention = dict(inducer=inducer() if args.inducer_value_rank else None)
        attention.update(lora_q=lora() if "q" in targets else None, lora_v=lora() if "v" in targets else None)
        if prefix is not None or any(block is not None for block in attention.values()):
            AugmentedSelfAttention.convert(layer.self_attn, i, prefix=prefix, **attention)
        # layer side
        adapters = {}
        if args.adapter != "none":
            adapters.update(attn_adapter=sequential_adapter(), ffn_adapter=sequential_adapter())
        if args.ffn_adapter_dim:
            adapters["parallel_adapter"] = BottleneckAdapter(
                dim, args.ffn_adapter_dim, scale=args.ffn_adapter_scale, dropout=args.dropout, init="lora"
            )
        if adapters:
            AdaptedEncoderLayer.convert(layer, **adapters)


def merge_lora(model):
    """Fold every LoRA update into its frozen projection (inference; see ``AugmentedSelfAttention``)."""
    for layer in model.encoder.sentence_encoder.layers:
        if isinstance(layer.self_attn, AugmentedSelfAttention):
            layer.self_attn.merge_lora()


# ---------------------------------------------------------------------- the model
@register_model("roberta_blocks")
class RobertaBlocksModel(FrozenBackboneRobertaModel):
    """Frozen RoBERTa + inducer-tuning / prefix tuning / LoRA / adapters / BitFit (module docstring)."""

    @staticmethod
    def add_args(parser):
        FrozenBackboneRobertaModel.add_args(parser)
        g = parser.add_argument_group("Blocks in the frozen layers")
        g.add_argument(
            "--blocks-preset", choices=list(PRESETS), help="a method's block settings (flags given explicitly win)"
        )
        add_prefix_args(parser)
        add_lora_args(parser)
        add_inducer_args(parser)
        add_adapter_args(parser)
        add_ffn_adapter_args(parser)
        add_bitfit_args(parser)

    @classmethod
    def build_model(cls, args, task):
        check_args(args, resolve_preset(args, PRESETS, PRESET, DEFAULTS))
        return super().build_model(args, task)

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        install_blocks(self, args)

    # ------------------------------------------------------------------ prefix tuning: train vs store
    # Training checkpoints keep the MLP: a resumed run then has the trainable tensors of the run that
    # wrote it, and fairseq keeps the optimizer state. The stored form (2 L l d prefixes) is what an
    # exported checkpoint holds (frozen_roberta.export_checkpoint -> stored_state_dict); a model
    # switches to it when it loads one.
    @classmethod
    def stored_state_dict(cls, state):
        """``state`` with the prefix MLP replaced by its prefixes (``PREFIX_KEY`` [L, 2, l, d])."""
        names = [f"prefix_encoder.{name}" for name in MLP_NAMES]
        if not all(name in state for name in names):
            return state
        stored = type(state)((k, v) for k, v in state.items() if k not in names)
        stored[PREFIX_KEY] = stored_prefixes(*(state[name].float() for name in names)).to(state[names[0]].dtype)
        return stored

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        prefix = getattr(self, "prefix_encoder", None)
        if prefix is not None and not prefix.stored and PREFIX_KEY in state_dict:
            # an exported checkpoint: the MLP is gone for good; training on from it has other
            # trainable tensors than the run that wrote it (fairseq-train needs --reset-optimizer)
            logger.info("prefix tuning: loading stored prefixes (no MLP)")
            prefix.to_stored(torch.zeros_like(state_dict[PREFIX_KEY]))
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    # ------------------------------------------------------------------ BitFit
    def trains_backbone_parameter(self, name):
        """BitFit: every bias of the encoder (attention, FFN, LayerNorms, embedding LayerNorm)."""
        return (
            bool(getattr(self.args, "bitfit", False))
            and name.startswith("encoder.sentence_encoder.")
            and name.endswith(".bias")
        )


@register_model_architecture("roberta_blocks", "roberta_blocks")
def roberta_blocks_architecture(args):
    """roberta-base sizes unless the --encoder-* flags say otherwise; the preset fills the blocks."""
    roberta_base_architecture(args)
    resolve_preset(args, PRESETS, PRESET, DEFAULTS)


@register_model_architecture("roberta_blocks", "roberta_blocks_large")
def roberta_blocks_large_architecture(args):
    roberta_large_architecture(args)
    resolve_preset(args, PRESETS, PRESET, DEFAULTS)
