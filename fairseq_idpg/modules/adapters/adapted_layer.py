"""``AdaptedEncoderLayer``: fairseq's encoder layer with adapter slots.

Three optional slots, each an adapter module computing f ([..., d] -> [..., d]: a
``bottleneck.BottleneckAdapter`` or a ``compacter.CompacterAdapter``):

- ``attn_adapter`` (sequential, Houlsby et al. 2019 / Compacter): after the attention
  sublayer's output projection and dropout, before the residual and its LayerNorm:
  ``h <- h + f(h)``;
- ``ffn_adapter`` (sequential): the same after the FFN sublayer;
- ``parallel_adapter`` (He et al. 2021; MAM adapter and MAM inducer-tuning, inducer-tuning section 5.2):
  beside the FFN, from the FFN's input x: ``LN(x + Dropout(FFN(x)) + f(x))`` (f carries its
  scale s).

``AdaptedEncoderLayer.convert(layer, ...)`` turns a fairseq ``TransformerEncoderLayerBase`` into
this class in place, so its frozen submodules keep their objects and names. ``forward`` is
fairseq 0.12.2's ``TransformerEncoderLayerBase.forward`` (the ordinary path; the fused
inference path is disabled by fairseq_idpg_compat) with the three slots; with every slot empty
it computes exactly fairseq's layer (tested).
"""

from typing import Optional

import torch
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from torch import Tensor


class AdaptedEncoderLayer(TransformerEncoderLayerBase):
    """See the module docstring. Built only by ``convert``."""

    @classmethod
    def convert(cls, layer, attn_adapter=None, ffn_adapter=None, parallel_adapter=None):
        if not isinstance(layer, TransformerEncoderLayerBase):
            raise TypeError(f"expected fairseq's TransformerEncoderLayerBase, got {type(layer).__name__}")
        layer.__class__ = cls  # in place: the frozen submodules keep their objects and names
        layer.attn_adapter = attn_adapter
        layer.ffn_adapter = ffn_adapter
        layer.parallel_adapter = parallel_adapter
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
        if self.attn_adapter is not None:
            x = x + self.attn_adapter(x)
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)

        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        parallel = self.parallel_adapter(x) if self.parallel_adapter is not None else None
        x = self.activation_fn(self.fc1(x))
        x = self.activation_dropout_module(x)
        x = self.fc2(x)
        fc_result = x
        x = self.dropout_module(x)
        if self.ffn_adapter is not None:
            x = x + self.ffn_adapter(x)
        if parallel is not None:
            x = x + parallel
        x = self.residual_connection(x, residual)
        if not self.normalize_before:
            x = self.final_layer_norm(x)

        if self.return_fc and not torch.jit.is_scripting():
            return x, fc_result
        return x
