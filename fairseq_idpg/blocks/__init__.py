"""The blocks of ``--arch roberta_blocks``, as data: one file per block, imported by name at the end
of this file (as fairseq's examples/linformer imports its modules), so a new block is one new file
and its name added to that import line.

A block file registers a config dataclass (PEFT's config style) whose fields are the block's
options, made with the one ``option`` of ``fairseq_idpg/options.py`` (as the prompt and IDPG options
and run.sh's): each carries its default, help, metavar or choices, its check and whether it is a
size (0: off), and each field generates its flag in the block's group (``--lora-rank``, ...; argparse
leaves them None, so that a method's block settings fill what the command line did not give). The class also says
where the block attaches (``slots``, declared data: ``modules/slots.py``), checks its options at
build time (one line naming the flag) and builds its modules, layer by layer:

    @register_block("lora", "LoRA (Hu et al. 2021; inducer-tuning section 4.5)", slots=("q", "v"))
    @dataclass
    class LoRAConfig(BlockConfig):
        lora_rank: int = option(0, "rank of the update (0: off)", metavar="R", size=True)
        ...
        def active(self):
            return self.lora_rank > 0

        def layer_blocks(self, index, encoder, model):
            return [Attachment(slot, f"lora_{slot}", LoRA(...)) for slot in self.targets()]

The model (``models/roberta_blocks.py``) resolves a method's settings, checks every block, and
attaches what each active block builds to the slots of the frozen layers; the shared forward
passes call the slots and never name a block. docs/blocks.md: adding a block.
"""

import dataclasses
from typing import Any, ClassVar, Dict, List, NamedTuple, Tuple

from fairseq_idpg.errors import ConfigError
from fairseq_idpg.modules.slots import SLOT_ORDER, SLOTS
from fairseq_idpg.options import Options, check_option, flag


class EncoderSizes(NamedTuple):
    """The sizes of the encoder a block is built for (from the model's args)."""

    dim: int
    heads: int
    ffn_dim: int
    layers: int
    dropout: float

    @classmethod
    def of(cls, args):
        dims = (args.encoder_embed_dim, args.encoder_attention_heads, args.encoder_ffn_embed_dim, args.encoder_layers)
        return cls(*dims, args.dropout)


class Attachment(NamedTuple):
    """A block's module for one layer: its ``slot``, its attribute ``name`` in the host (the name in
    state dicts, e.g. ``...self_attn.lora_q.A``), and ``owned=False`` for a module another one owns."""

    slot: str
    name: str
    module: Any
    owned: bool = True


@dataclasses.dataclass
class BlockConfig(Options):
    """A block's options (fields made with ``fairseq_idpg.options.option``) and how it installs; see the
    module docstring. ``Options`` gives its flag group (titled ``title``), ``defaults()`` and ``from_args``."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""  # the flag group's title: the block and its paper
    slots: ClassVar[Tuple[str, ...]] = ()

    # ------------------------------------------------------------------ options
    def check_options(self, preset_option, method, settings):
        """The checks the fields declare (choices; sizes >= 0) and, for a size, >= 1 where ``settings``, the
        block settings of ``method``, give it >= 1; one line naming the flag."""
        for f, _ in self.options():
            value = getattr(self, f.name)
            check_option(f, value)
            if f.metadata["size"] and value == 0 and settings.get(f.name, 0) >= 1:
                raise ConfigError(f"{flag(f.name)} must be >= 1 for {flag(preset_option)} {method} (got 0)")

    def check(self, encoder: EncoderSizes):
        """The block's own build-time checks (called for every block, active or not)."""

    # ------------------------------------------------------------------ building
    def active(self) -> bool:
        """Whether these options turn the block on."""
        raise NotImplementedError

    def install(self, model, encoder: EncoderSizes):
        """Modules the model owns, built before the layers' (prefix tuning's shared encoder)."""

    def layer_blocks(self, index, encoder: EncoderSizes, model) -> List[Attachment]:
        """The modules of layer ``index`` and where they attach."""
        return []

    def start_from_backbone(self, model):
        """Start the built modules from the frozen weights, once the backbone is loaded (DoRA's magnitude,
        PiSSA's factors); called at every build, before a checkpoint's tensors are loaded over them."""

    def trains_backbone_parameter(self, name) -> bool:
        """Whether the backbone parameter ``name`` trains (BitFit's biases)."""
        return False

    # ------------------------------------------------------------------ checkpoints
    @staticmethod
    def stored_state_dict(state):
        """The form of a checkpoint's model ``state`` to share (``frozen_roberta.export_checkpoint``)."""
        return state

    def before_load(self, model, state_dict):
        """Adapt the built model to ``state_dict`` before it is loaded (a stored form)."""

    @classmethod
    def late_defaults(cls):
        """{option: default} of the options added after runs were named (``option(..., late=True)``)."""
        return {f.name: f.default for f, _ in cls.options() if f.metadata["late"]}

    @classmethod
    def build_order(cls):
        """Blocks are built layer by layer in the order of the first slot each attaches to."""
        return min((SLOT_ORDER.index(s) for s in cls.slots if s in SLOT_ORDER), default=len(SLOT_ORDER)), cls.name


BLOCKS: Dict[str, type] = {}


def register_block(name, title, slots):
    """Class decorator: register a ``BlockConfig`` subclass as block ``name``, attaching to ``slots``."""
    unknown = set(slots) - set(SLOTS)
    if unknown:
        raise ValueError(f"block {name!r}: unknown slots {sorted(unknown)}; valid: {', '.join(SLOTS)}")

    def register(cls):
        if name in BLOCKS:
            raise ValueError(f"block {name!r} registered twice")
        cls.name, cls.title, cls.slots = name, title, tuple(slots)
        BLOCKS[name] = cls
        return cls

    return register


def registered_blocks():
    """The registered config classes, in build order (``BlockConfig.build_order``)."""
    return sorted(BLOCKS.values(), key=lambda cls: cls.build_order())


def block_configs(args):
    """Every registered block's config, from ``args``, in build order."""
    return [cls.from_args(args) for cls in registered_blocks()]


def blocks_turned_on(settings) -> Dict[str, BlockConfig]:
    """``{block: config}``, in registration order, of the blocks that ``settings`` (model attributes, e.g. a
    method's block settings; the others at the blocks' defaults) turn on."""
    configs = {
        name: cls(**{**cls.defaults(), **{k: v for k, v in settings.items() if k in cls.defaults()}})
        for name, cls in BLOCKS.items()
    }
    return {name: config for name, config in configs.items() if config.active()}


def block_defaults():
    return {k: v for cls in registered_blocks() for k, v in cls.defaults().items()}


# Last, as each block module imports the definitions above. This line's (sorted) order is the registration
# order of ``BLOCKS``; blocks are built in slot order (``BlockConfig.build_order``), whatever this order.
from . import adapter, bitfit, ffn_adapter, ia3, inducer, lora, loreft, prefix, vera  # noqa: E402, F401  (registers)
