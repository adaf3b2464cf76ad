"""Prefix tuning (Li & Liang 2021; He et al. 2021's form): l key/value prefixes per layer from one
``modules.attention.prefix.PrefixEncoder`` the model owns (``model.prefix_encoder``), attached to
every layer's ``keys_values`` slot.

Training checkpoints keep the MLP: a resumed run then has the trainable tensors of the run that
wrote it, and fairseq keeps the optimizer state. The stored form (2 L l d prefixes, ``PREFIX_KEY``
[L, 2, l, d]) is what an exported checkpoint holds (``frozen_roberta.export_checkpoint`` ->
``stored_state_dict``); a model switches to it when it loads one.
"""

import logging
from dataclasses import dataclass

import torch

from fairseq_idpg.blocks import Attachment, BlockConfig, register_block
from fairseq_idpg.modules.attention.prefix import MLP_NAMES, PrefixEncoder, stored_prefixes
from fairseq_idpg.options import check_at_least, option

logger = logging.getLogger(__name__)
PREFIX_KEY = "prefix_encoder.kv"


def _begin_prefixes(model, args):
    model.prefix_encoder.begin()


def _end_prefixes(model, args, output):
    model.prefix_encoder.end()


@register_block("prefix", "Prefix tuning (Li & Liang 2021)", slots=("keys_values",))
@dataclass
class PrefixConfig(BlockConfig):
    prefix_length: int = option(0, "virtual key/value vectors per layer (0: off)", metavar="L", size=True)
    prefix_mid_dim: int = option(800, "hidden size of the reparameterisation MLP (800)", metavar="M")

    def active(self):
        return self.prefix_length > 0

    def check(self, encoder):
        if self.prefix_length:
            check_at_least(self, "prefix_mid_dim", 1)

    def install(self, model, encoder):
        model.prefix_encoder = PrefixEncoder(encoder.layers, encoder.dim, self.prefix_length, self.prefix_mid_dim)
        # the prefixes of every layer once per model forward, not once per layer (PrefixEncoder.begin)
        model.register_forward_pre_hook(_begin_prefixes)
        model.register_forward_hook(_end_prefixes)

    def layer_blocks(self, index, encoder, model):
        return [Attachment("keys_values", "prefix", model.prefix_encoder, owned=False)]

    @staticmethod
    def stored_state_dict(state):
        """``state`` with the prefix MLP replaced by its prefixes (``PREFIX_KEY`` [L, 2, l, d])."""
        names = [f"prefix_encoder.{name}" for name in MLP_NAMES]
        if not all(name in state for name in names):
            return state
        stored = type(state)((k, v) for k, v in state.items() if k not in names)
        stored[PREFIX_KEY] = stored_prefixes(*(state[name].float() for name in names)).to(state[names[0]].dtype)
        return stored

    def before_load(self, model, state_dict):
        prefix = model.prefix_encoder
        if not prefix.stored and PREFIX_KEY in state_dict:
            # an exported checkpoint: the MLP is gone for good; training on from it has other
            # trainable tensors than the run that wrote it (fairseq-train needs --reset-optimizer)
            logger.info("prefix tuning: loading stored prefixes (no MLP)")
            prefix.to_stored(torch.zeros_like(state_dict[PREFIX_KEY]))
