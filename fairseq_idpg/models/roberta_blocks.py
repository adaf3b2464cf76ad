"""``--arch roberta_blocks``: trained blocks inside the frozen RoBERTa's layers: inducer-tuning
(inducer-tuning sections 4.3-4.5) and the adapter-family baselines of its NLU table and of IDPG's
Table 1, with a trained classification head.

He et al. 2021's unified view: prefix tuning, LoRA and adapters are modifications of the
attention or FFN sublayer that compose. So this is one model with one block per concept, and a
method is a combination of blocks: its record in ``fairseq_idpg/methods.py`` holds its block
settings (``Method.preset``), and ``--blocks-preset NAME`` applies the settings of method NAME
(flags given explicitly win, ``--blocks-preset inducer-lora --lora-rank 8 --inducer-output gated``).
The methods, their blocks and sources: the ``roberta_blocks`` records of ``methods.py``
(docs/inducer.md tabulates them with their counts).

The Table 3 ablations get the NLU inducer-tuning budget (~0.61M on roberta-base): Table 5 sizes
them only for GPT-2 (docs/inducer.md gives the arithmetic). Sizes: ``--arch roberta_blocks``
(roberta-base) / ``roberta_blocks_large``; any other size through the ``--encoder-*`` flags
(``scripts/run.sh`` passes the checkpoint's). Bad settings fail at build time with one line
naming the flag (``check_args``).

The blocks are data (``fairseq_idpg/blocks/``, one file each: its options, flag group, checks and
the slots it attaches to). This model knows none of them by name: it resolves the method's
settings, checks every block, and ``install_blocks`` attaches what each active block builds to the
slots of the frozen layers (``modules/slots.py``: ``AugmentedSelfAttention`` for the attention's,
``AdaptedEncoderLayer`` for the layer's); BitFit-style blocks train backbone tensors through
``trains_backbone_parameter``. docs/blocks.md: adding a block.
"""

import argparse

from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture, roberta_base_architecture, roberta_large_architecture

from fairseq_idpg.blocks import EncoderSizes, block_configs, block_defaults, registered_blocks
from fairseq_idpg.errors import ConfigError
from fairseq_idpg.methods import presets_of
from fairseq_idpg.models.frozen_roberta import FrozenBackboneRobertaModel
from fairseq_idpg.modules.adapters.adapted_layer import AdaptedEncoderLayer
from fairseq_idpg.modules.attention.augmented_self_attention import AugmentedSelfAttention
from fairseq_idpg.modules.slots import ATTENTION_SLOTS
from fairseq_idpg.options import flag, resolve_preset

ARCH = "roberta_blocks"
PRESET_OPTION = "blocks_preset"  # the option that names a method whose block settings apply


def resolve(args):
    """Fill every block option left unset from the method named by ``--blocks-preset``, then from the
    blocks' defaults; returns that method's settings."""
    return resolve_preset(args, RobertaBlocksModel.presets(), PRESET_OPTION, block_defaults())


# ---------------------------------------------------------------------- build-time checks
def check_args(args, settings):
    """One clear line per bad setting, before anything is built; returns the blocks' configs."""
    base_architecture(args)
    dim, heads = args.encoder_embed_dim, args.encoder_attention_heads
    if heads < 1 or dim % heads:
        raise ConfigError(f"--encoder-attention-heads {heads} must divide --encoder-embed-dim {dim}")
    configs = block_configs(args)
    method = getattr(args, PRESET_OPTION)
    for config in configs:
        config.check_options(PRESET_OPTION, method, settings)
    encoder = EncoderSizes.of(args)
    for config in configs:
        config.check(encoder)
    if not any(config.active() for config in configs):
        methods = ", ".join(RobertaBlocksModel.presets())
        raise ConfigError(f"nothing to train: give {flag(PRESET_OPTION)} ({methods}) or a block's flags")
    return configs


# ---------------------------------------------------------------------- installing the blocks
def install_blocks(model, configs):
    """Attach the active blocks to the slots of ``model``'s frozen layers (in place; they train), layer
    by layer in the blocks' build order (which fixes their random initialisation)."""
    encoder = EncoderSizes.of(model.args)
    active = [config for config in configs if config.active()]
    for config in active:
        config.install(model, encoder)
    for i, layer in enumerate(model.encoder.sentence_encoder.layers):
        for config in active:
            for slot, name, module, owned in config.layer_blocks(i, encoder, model):
                if slot in ATTENTION_SLOTS:
                    host = AugmentedSelfAttention.convert(layer.self_attn, i)
                else:
                    host = AdaptedEncoderLayer.convert(layer)
                host.attach(slot, name, module, owned=owned)


# ---------------------------------------------------------------------- the model
@register_model(ARCH)
class RobertaBlocksModel(FrozenBackboneRobertaModel):
    """Frozen RoBERTa + the blocks of ``fairseq_idpg/blocks/`` (module docstring)."""

    PRESET_OPTION = PRESET_OPTION

    @classmethod
    def presets(cls):
        """{method name: its block settings} of the records whose ``--blocks-preset`` is their own name, in
        registration order (``fairseq_idpg.methods.presets_of``, read when used)."""
        return presets_of(cls.PRESET_OPTION)

    @classmethod
    def resolve_settings(cls, args):
        resolve(args)

    @classmethod
    def model_settings(cls, options):
        """The options of the blocks the method turns on (and the method's own): a block it leaves off shapes
        nothing, so a new block's options leave every existing record's settings, and its runs' folders, as
        they were."""
        settings = super().model_settings(options)
        configs = block_configs(argparse.Namespace(**settings))
        off = {k for config in configs if not config.active() for k in config.defaults()}
        # options added after runs were named, at their defaults: those runs keep their folders
        late = {k for config in configs for k, v in config.late_defaults().items() if settings.get(k) == v}
        return {k: v for k, v in settings.items() if k not in off | late}

    @staticmethod
    def add_args(parser):
        FrozenBackboneRobertaModel.add_args(parser)
        g = parser.add_argument_group("Blocks in the frozen layers")
        g.add_argument(
            flag(PRESET_OPTION),
            choices=list(RobertaBlocksModel.presets()),
            help="a method's block settings (flags given explicitly win)",
        )
        for block in registered_blocks():
            block.add_args(parser)

    @classmethod
    def build_model(cls, args, task):
        check_args(args, resolve(args))
        return super().build_model(args, task)

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        self.block_configs = block_configs(args)
        install_blocks(self, self.block_configs)

    def start_from_backbone(self):
        for config in self.block_configs:
            if config.active():
                config.start_from_backbone(self)

    # ------------------------------------------------------------------ checkpoints
    @classmethod
    def stored_state_dict(cls, state):
        """``state`` in the form each block stores (prefix tuning: its prefixes instead of its MLP)."""
        for block in registered_blocks():
            state = block.stored_state_dict(state)
        return state

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        for config in self.block_configs:
            if config.active():
                config.before_load(self, state_dict)
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    # ------------------------------------------------------------------ blocks that train backbone tensors
    def trains_backbone_parameter(self, name):
        """BitFit: every bias of the encoder (attention, FFN, LayerNorms, embedding LayerNorm)."""
        return any(config.active() and config.trains_backbone_parameter(name) for config in self.block_configs)


@register_model_architecture(ARCH, ARCH)
def roberta_blocks_architecture(args):
    """roberta-base sizes unless the --encoder-* flags say otherwise; the method fills the blocks."""
    roberta_base_architecture(args)
    resolve(args)


@register_model_architecture(ARCH, "roberta_blocks_large")
def roberta_blocks_large_architecture(args):
    roberta_large_architecture(args)
    resolve(args)
