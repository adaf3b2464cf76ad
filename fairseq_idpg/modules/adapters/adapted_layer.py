"""``AdaptedEncoderLayer``: fairseq's encoder layer with slots for trained blocks (``modules/slots.py``).

Five slots; the adapters attached there compute f ([..., d] -> [..., d]: a
``bottleneck.BottleneckAdapter`` or a ``compacter.CompacterAdapter``):

- ``after_attention`` (sequential, Houlsby et al. 2019 / Compacter): after the attention
  sublayer's output projection and dropout, before the residual and its LayerNorm:
  ``h <- h + f(h)``;
- ``after_ffn`` (sequential): the same after the FFN sublayer;
- ``ffn`` (parallel; He et al. 2021; MAM adapter and MAM inducer-tuning, inducer-tuning section 5.2):
  beside the FFN, from the FFN's input x: ``LN(x + Dropout(FFN(x)) + f(x))`` (f carries its
  scale s);
- ``ffn_inner``: a map g of the FFN's inner activations, ``fc2(g(Dropout(act(fc1 x))))`` ((IA)^3's
  elementwise scale; dropout commutes with it);
- ``layer_output``: a map of the layer's output at chosen positions, ``h <- g(h, padding_mask)`` after
  the final LayerNorm (LoReFT, ``blocks/loreft.py``).

``AdaptedEncoderLayer.convert(layer)`` turns a fairseq ``TransformerEncoderLayerBase`` into this
class in place, so its frozen submodules keep their objects and names; ``attach(slot, name, block)``
adds a block (the adapter family's names: ``attn_adapter``, ``ffn_adapter``, ``parallel_adapter``).
``forward`` is fairseq 0.12.2's ``TransformerEncoderLayerBase.forward`` (the ordinary path; the
fused inference path is disabled by fairseq_idpg_compat) with the slots; with every slot empty it
computes exactly fairseq's layer (tested).
"""

from typing import Optional

import torch
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from torch import Tensor

from ..slots import LAYER_SLOTS, Slots


class AdaptedEncoderLayer(Slots, TransformerEncoderLayerBase):
    """See the module docstring. Built only by ``convert``."""

    SLOTS = LAYER_SLOTS

    @classmethod
    def convert(cls, layer):
        """Make ``layer`` an ``AdaptedEncoderLayer`` in place, with empty slots."""
        if not isinstance(layer, TransformerEncoderLayerBase):
            raise TypeError(f"expected fairseq's TransformerEncoderLayerBase, got {type(layer).__name__}")
        if not isinstance(layer, cls):
            layer.__class__ = cls  # in place: the frozen submodules keep their objects and names
            layer.init_slots()
        return layer

    def forward(self, x, encoder_padding_mask: Optional[Tensor], attn_mask: Optional[Tensor] = None):
        """x: [T, B, d]; encoder_padding_mask: [B, T] (1 at padding) -> [T, B, d]."""
        if attn_mask is not None:
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8 if x.dtype == torch.float32 else -1e4)

        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, _ = self.self_attn(
            query=x, key=x, value=x, key_padding_mask=encoder_padding_mask, need_weights=False, attn_mask=attn_mask
        )
        x = self.dropout_module(x)
        for block in self.attached("after_attention"):
            x = x + block(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        parallel = [block(x) for block in self.attached("ffn")]
        x = self.activation_fn(self.fc1(x))
        x = self.activation_dropout_module(x)
        for block in self.attached("ffn_inner"):
            x = block(x)
        x = self.fc2(x)
        fc_result = x
        x = self.dropout_module(x)
        for block in self.attached("after_ffn"):
            x = x + block(x)
        for f in parallel:
            x = x + f
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        for block in self.attached("layer_output"):
            x = block(x, encoder_padding_mask)

        if self.return_fc and not torch.jit.is_scripting():
            return x, fc_result
        return x
