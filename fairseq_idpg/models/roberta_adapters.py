"""``--arch roberta_adapters``: the adapter-family baselines of inducer-tuning (SPEC section 3) and
of IDPG (SPEC section 1), on the frozen backbone with a trained classification head.

One model, composable blocks, one preset per baseline (``--adapters-preset``):

| preset          | blocks                                                               | paper / source              |
|-----------------|----------------------------------------------------------------------|-----------------------------|
| prefix-tuning   | key/value prefixes, l = 32, reparameterised by an MLP (m = 800)      | Li & Liang 2021; He et al.  |
| lora            | LoRA on W_q and W_v, r = 16, alpha = 32, dropout 0.1                 | Hu et al. 2021; authors' script |
| houlsby-adapter | 2 adapters per layer (after attention, after FFN), r = 16            | Houlsby et al. 2019; IDPG Table 2 |
| compacter       | 2 PHM adapters per layer, n = 4, r = 16, PHM rank 1, one A per adapter | IDPG appendix A.1.2 (152,832) |
| mam-adapter     | prefixes l = 16 + parallel FFN adapter r = 16, s = 2                 | He et al. 2021; authors' script |
| bitfit          | every bias of the encoder (and its LayerNorms) trains                | Ben Zaken et al. 2021       |

A preset fills the flags left unset; explicit flags win (``--adapters-preset lora --lora-rank 8``).
Sizes: ``--arch roberta_adapters`` (roberta-base) / ``roberta_adapters_large``; any other size
through the ``--encoder-*`` flags (``scripts/run.sh`` passes the checkpoint's). Bad settings fail
at build time with one line naming the flag (``check_args``).

The blocks are installed into the frozen encoder in place (``install_blocks``): attention
blocks through ``modules.inducer_attention.InducerSelfAttention`` (prefixes, LoRA), adapters
through ``modules.adapters_layer.AdaptedEncoderLayer``; ``models/roberta_inducer.py`` adds the
inducer to the same machinery.
"""
import logging

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture, roberta_base_architecture, roberta_large_architecture

from fairseq_idpg.methods import register_method
from fairseq_idpg.models.frozen_roberta import FrozenBackboneRobertaModel
from fairseq_idpg.modules.adapters import BottleneckAdapter, CompacterAdapter, check_bottleneck
from fairseq_idpg.modules.adapters_layer import AdaptedEncoderLayer
from fairseq_idpg.modules.inducer_attention import InducerSelfAttention
from fairseq_idpg.modules.lora import LoRA
from fairseq_idpg.modules.prefix import PrefixEncoder

logger = logging.getLogger(__name__)
PREFIX_KEY = "prefix_encoder.kv"

# value of each block flag when neither the command line nor the preset sets it (= block off)
BLOCK_DEFAULTS = {
    "prefix_length": 0, "prefix_mid_dim": 800, "prefix_save_mlp": False,
    "lora_rank": 0, "lora_alpha": 32.0, "lora_dropout": 0.1, "lora_targets": "q,v",
    "adapter": "none", "adapter_dim": 16, "compacter_n": 4, "compacter_rank": 1,
    "ffn_adapter_dim": 0, "ffn_adapter_scale": 2.0,
    "bitfit": False,
}
# flags that are ranks / sizes: a preset that sets one >= 1 needs it >= 1
SIZE_FLAGS = ("prefix_length", "lora_rank", "adapter_dim", "ffn_adapter_dim", "compacter_rank", "inducer_value_rank")


def flag(name):
    return "--" + name.replace("_", "-")


# ---------------------------------------------------------------------- flags, one group per block
def add_prefix_args(parser):
    g = parser.add_argument_group("Prefix tuning (Li & Liang 2021)")
    g.add_argument("--prefix-length", type=int, metavar="L", help="virtual key/value vectors per layer (0: off)")
    g.add_argument("--prefix-mid-dim", type=int, metavar="M", help="hidden size of the reparameterisation MLP (800)")
    g.add_argument("--prefix-save-mlp", action="store_true", default=None,
                   help="checkpoints keep the MLP (resumable) instead of the 2 L l d prefixes")


def add_lora_args(parser):
    g = parser.add_argument_group("LoRA (Hu et al. 2021)")
    g.add_argument("--lora-rank", type=int, metavar="R", help="rank of the update (0: off)")
    g.add_argument("--lora-alpha", type=float, help="scaling alpha: the update is (alpha / r) B A (32)")
    g.add_argument("--lora-dropout", type=float, help="dropout on the LoRA input (0.1)")
    g.add_argument("--lora-targets", metavar="q,v", help="projections that get LoRA: q, v or q,v")


def add_adapter_args(parser):
    g = parser.add_argument_group("Sequential adapters (Houlsby et al. 2019; Compacter)")
    g.add_argument("--adapter", choices=["none", "houlsby", "compacter"], help="2 adapters per layer, after attention and after the FFN")
    g.add_argument("--adapter-dim", type=int, metavar="R", help="bottleneck r (16)")
    g.add_argument("--compacter-n", type=int, metavar="N", help="Kronecker terms n of Compacter's PHM layers (4)")
    g.add_argument("--compacter-rank", type=int, metavar="K", help="rank of Compacter's factorised B_i = s_i t_i (1)")


def add_ffn_adapter_args(parser):
    g = parser.add_argument_group("Parallel FFN adapter (He et al. 2021)")
    g.add_argument("--ffn-adapter-dim", type=int, metavar="R", help="bottleneck of the adapter beside each FFN (0: off)")
    g.add_argument("--ffn-adapter-scale", type=float, metavar="S", help="scale s of its output (2)")


def add_bitfit_args(parser):
    g = parser.add_argument_group("BitFit (Ben Zaken et al. 2021)")
    g.add_argument("--bitfit", action="store_true", default=None, help="train every bias of the encoder")


# ---------------------------------------------------------------------- build-time checks
def resolve_preset(args, presets, preset_flag, defaults):
    """Fill unset block flags from the preset, then from ``defaults``; returns the preset dict."""
    name = getattr(args, preset_flag, None)
    if name is not None and name not in presets:
        raise ValueError(f"{flag(preset_flag)} must be one of {', '.join(presets)}, got {name!r}")
    preset = presets.get(name, {})
    for key, default in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, preset.get(key, default))
    return preset


def check_args(args, preset, preset_name):
    """One clear line per bad setting, before anything is built."""
    base_architecture(args)
    dim, heads = args.encoder_embed_dim, args.encoder_attention_heads
    if heads < 1 or dim % heads:
        raise ValueError(f"--encoder-attention-heads {heads} must divide --encoder-embed-dim {dim}")
    for key in SIZE_FLAGS:
        value = getattr(args, key, None)
        if value is None:
            continue
        if value < 0:
            raise ValueError(f"{flag(key)} must be >= 0, got {value}")
        if value == 0 and preset.get(key, 0) >= 1:
            raise ValueError(f"{flag(key)} must be >= 1 for {preset_name} (got 0)")
    if args.prefix_length and args.prefix_mid_dim < 1:
        raise ValueError(f"--prefix-mid-dim must be >= 1, got {args.prefix_mid_dim}")
    targets = [t for t in str(args.lora_targets).split(",") if t]
    if args.lora_rank and (not targets or set(targets) - {"q", "v"}):
        raise ValueError(f"--lora-targets must be q, v or q,v, got {args.lora_targets!r}")
    if args.adapter != "none":
        check_bottleneck("--adapter-dim", args.adapter_dim, dim)
    if args.adapter == "compacter":
        n = args.compacter_n
        if n < 1 or dim % n or args.adapter_dim % n:
            raise ValueError(f"--compacter-n {n} must divide --encoder-embed-dim {dim} and --adapter-dim {args.adapter_dim}")
        if args.compacter_rank < 1:
            raise ValueError(f"--compacter-rank must be >= 1, got {args.compacter_rank}")
    if args.ffn_adapter_dim:
        check_bottleneck("--ffn-adapter-dim", args.ffn_adapter_dim, dim)


# ---------------------------------------------------------------------- installing the blocks
def install_blocks(model, args, make_inducer=None):
    """Put the configured blocks into ``model``'s frozen encoder (in place; they train).

    ``make_inducer(layer_index)`` (roberta_inducer) returns an ``Inducer`` for a layer, or None.
    """
    encoder = model.encoder.sentence_encoder
    dim, num_layers = args.encoder_embed_dim, len(encoder.layers)
    if args.prefix_length:
        model.prefix_encoder = PrefixEncoder(num_layers, dim, args.prefix_length, args.prefix_mid_dim,
                                             save_mlp=bool(args.prefix_save_mlp))
    prefix = getattr(model, "prefix_encoder", None)
    targets = set(str(args.lora_targets).split(",")) if args.lora_rank else set()

    def lora():
        return LoRA(dim, dim, args.lora_rank, args.lora_alpha, args.lora_dropout)

    for i, layer in enumerate(encoder.layers):
        inducer = make_inducer(i) if make_inducer is not None else None
        if inducer is not None or targets or prefix is not None:
            InducerSelfAttention.convert(
                layer.self_attn, i, inducer=inducer, prefix=prefix,
                lora_q=lora() if "q" in targets else None, lora_v=lora() if "v" in targets else None,
            )
        sequential = {}
        if args.adapter == "houlsby":
            sequential = {k: BottleneckAdapter(dim, args.adapter_dim, init="houlsby") for k in ("attn_adapter", "ffn_adapter")}
        elif args.adapter == "compacter":
            sequential = {k: CompacterAdapter(dim, args.adapter_dim, args.compacter_n, args.compacter_rank)
                          for k in ("attn_adapter", "ffn_adapter")}
        parallel = None
        if args.ffn_adapter_dim:
            parallel = BottleneckAdapter(dim, args.ffn_adapter_dim, scale=args.ffn_adapter_scale,
                                         dropout=args.dropout, init="lora")
        if sequential or parallel is not None:
            AdaptedEncoderLayer.convert(layer, parallel_adapter=parallel, **sequential)


def build_with_flags(model_cls, dictionary, **flags):
    """Build ``model_cls`` as fairseq-train does: its flags parsed (absent when not given), then
    ``flags`` (attribute names, e.g. ``inducer_preset="mam-inducer"``, ``backbone=PATH``); the
    architecture defaults fill the rest (roberta-base sizes unless the encoder flags are given).
    For scripts and tests that build a model without fairseq-train."""
    import argparse
    import types

    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    model_cls.add_args(parser)
    args = parser.parse_args([])
    args.max_positions = 512  # RoBERTa's; the task sets it under fairseq-train
    for key, value in flags.items():
        setattr(args, key, value)
    roberta_base_architecture(args)
    return model_cls.build_model(args, types.SimpleNamespace(source_dictionary=dictionary))


def merge_lora(model):
    """Fold every LoRA update into its frozen projection (inference; see ``InducerSelfAttention``)."""
    for layer in model.encoder.sentence_encoder.layers:
        if isinstance(layer.self_attn, InducerSelfAttention):
            layer.self_attn.merge_lora()


# ---------------------------------------------------------------------- the model
@register_model("roberta_adapters")
class RobertaAdaptersModel(FrozenBackboneRobertaModel):
    """Frozen RoBERTa + prefix tuning / LoRA / adapters / Compacter / BitFit (module docstring)."""

    PRESET_FLAG = "adapters_preset"
    PRESETS = {
        "prefix-tuning": {"prefix_length": 32},
        "lora": {"lora_rank": 16, "lora_targets": "q,v"},
        "houlsby-adapter": {"adapter": "houlsby", "adapter_dim": 16},
        "compacter": {"adapter": "compacter", "adapter_dim": 16, "compacter_n": 4, "compacter_rank": 1},
        "mam-adapter": {"prefix_length": 16, "ffn_adapter_dim": 16, "ffn_adapter_scale": 2.0},
        "bitfit": {"bitfit": True},
    }
    DEFAULTS = BLOCK_DEFAULTS

    @staticmethod
    def add_args(parser):
        FrozenBackboneRobertaModel.add_args(parser)
        g = parser.add_argument_group("Adapter-family baselines")
        g.add_argument("--adapters-preset", choices=list(RobertaAdaptersModel.PRESETS),
                       help="a baseline's block settings (flags given explicitly win)")
        add_prefix_args(parser)
        add_lora_args(parser)
        add_adapter_args(parser)
        add_ffn_adapter_args(parser)
        add_bitfit_args(parser)

    @classmethod
    def build_model(cls, args, task):
        cls.configure(args)
        return super().build_model(args, task)

    @classmethod
    def configure(cls, args):
        name = getattr(args, cls.PRESET_FLAG, None)
        preset = resolve_preset(args, cls.PRESETS, cls.PRESET_FLAG, cls.DEFAULTS)
        check_args(args, preset, f"{flag(cls.PRESET_FLAG)} {name}")
        cls.check_something_trains(args)

    @classmethod
    def check_something_trains(cls, args):
        if not (args.prefix_length or args.lora_rank or args.adapter != "none" or args.ffn_adapter_dim or args.bitfit):
            raise ValueError(f"nothing to train: give {flag(cls.PRESET_FLAG)} ({', '.join(cls.PRESETS)}) or a block's flags")

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        install_blocks(self, args, self.inducer_factory(args))

    def inducer_factory(self, args):
        return None

    # ------------------------------------------------------------------ prefix tuning: store vs train
    def state_dict(self, *args, full=False, **kwargs):
        """Checkpoints hold prefix tuning's stored form: the 2 L l d prefixes, not the MLP."""
        state = super().state_dict(*args, full=full, **kwargs)
        prefix = getattr(self, "prefix_encoder", None)
        if full or kwargs.get("prefix", "") or prefix is None or prefix.stored or prefix.save_mlp:
            return state
        for key in [k for k in state if k.startswith("prefix_encoder.")]:
            del state[key]
        state[PREFIX_KEY] = prefix.prefixes()
        return state

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        prefix = getattr(self, "prefix_encoder", None)
        if prefix is not None and not prefix.stored and PREFIX_KEY in state_dict:
            # a stored-form checkpoint: the MLP is gone for good. A resumed run then has other
            # trainable tensors than the one that wrote it, and fairseq refuses its optimizer state
            logger.info("prefix tuning: loading stored prefixes (no MLP); to resume training, "
                        "train with --prefix-save-mlp or pass --reset-optimizer")
            prefix.to_stored(torch.zeros_like(state_dict[PREFIX_KEY]))
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    def trains_backbone_parameter(self, name):
        """BitFit: every bias of the encoder (attention, FFN, LayerNorms, embedding LayerNorm)."""
        return bool(getattr(self.args, "bitfit", False)) and name.startswith("encoder.sentence_encoder.") and name.endswith(".bias")


@register_model_architecture("roberta_adapters", "roberta_adapters")
def roberta_adapters_base(args):
    roberta_base_architecture(args)


@register_model_architecture("roberta_adapters", "roberta_adapters_large")
def roberta_adapters_large(args):
    roberta_large_architecture(args)


# ---------------------------------------------------------------------- scripts/run.sh --method NAME
# lr: the inducer paper trains every method of its NLU table with the authors' script (lr 2e-4,
# polynomial decay, 6% warmup; SPEC section 3); Compacter with its own config (3e-3); BitFit
# with 1e-3 (the top of the BitFit paper's range: biases alone need a larger step).
_LR = {"prefix-tuning": 2e-4, "lora": 2e-4, "houlsby-adapter": 2e-4, "compacter": 3e-3, "mam-adapter": 2e-4, "bitfit": 1e-3}
_DESCRIPTION = {
    "prefix-tuning": "prefix tuning, l = 32, MLP-reparameterised, stored compact (inducer paper baseline)",
    "lora": "LoRA on W_q and W_v, r = 16, alpha = 32 (inducer paper baseline)",
    "houlsby-adapter": "Houlsby adapter, r = 16, 2 per layer (IDPG and inducer paper baseline)",
    "compacter": "Compacter, n = 4, r = 16, PHM rank 1, 2 per layer (IDPG baseline)",
    "mam-adapter": "MAM adapter: prefix 16 + parallel FFN adapter 16, s = 2 (inducer paper baseline)",
    "bitfit": "BitFit: biases only (inducer paper baseline)",
}
for _name in RobertaAdaptersModel.PRESETS:
    register_method(_name, ["--arch", "roberta_adapters", "--adapters-preset", _name],
                    lr=_LR[_name], scheduler="polynomial_decay", description=_DESCRIPTION[_name])
