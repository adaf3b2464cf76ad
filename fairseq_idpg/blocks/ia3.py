"""(IA)^3 (Liu et al. 2022, "Few-Shot Parameter-Efficient Fine-Tuning is Better and Cheaper than
In-Context Learning", section 3.3): learned vectors that rescale the keys, the values and the
FFN's inner activations of every layer,

    softmax(Q (l_k * K)^T / sqrt(d_h)) (l_v * V)        l_k, l_v: [d]  (after W_k x + b_k, W_v x + b_v)
    fc2(l_ff * Dropout(act(fc1 x)))                      l_ff: [d_ffn]  (dropout commutes with the scale)

(* elementwise, broadcast over the tokens), all initialised to ones, so the model starts as the
frozen one. Attached to the ``k``, ``v`` and ``ffn_inner`` slots as ``ia3_k``, ``ia3_v``, ``ia3_ff``.

Per layer 2 d + d_ffn parameters: 55,296 on roberta-base (12 x (768 + 768 + 3072)), the count of
PEFT's ``IA3Config`` on RoBERTa with the key, value and FFN output projections as targets (the FFN's
as a feedforward module: PEFT scales its input, the inner activations). PEFT's default target
"output.dense" also matches the attention's output projection (``attention.output.dense``) and
then scales its input too: d more per layer, 64,512 (not in the paper).
"""

from dataclasses import dataclass

import torch
import torch.nn as nn

from fairseq_idpg.blocks import Attachment, BlockConfig, register_block
from fairseq_idpg.options import option


class Scale(nn.Module):
    """``l * h`` (elementwise) with l: [size], initialised to ones; shapes [..., size] -> [..., size]."""

    def __init__(self, size):
        super().__init__()
        self.l = nn.Parameter(torch.ones(size))

    def forward(self, h):
        return h * self.l.to(h.dtype)

    def project(self, x, y):
        """The ``k`` / ``v`` slot: the projection's output scaled, l * (W x + b)."""
        return self(y)


@register_block("ia3", "(IA)^3 (Liu et al. 2022)", slots=("k", "v", "ffn_inner"))
@dataclass
class IA3Config(BlockConfig):
    ia3: bool = option(False, "scale the keys, values and the FFN's inner activations by learned vectors")

    def active(self):
        return bool(self.ia3)

    def layer_blocks(self, index, encoder, model):
        return [
            Attachment("k", "ia3_k", Scale(encoder.dim)),
            Attachment("v", "ia3_v", Scale(encoder.dim)),
            Attachment("ffn_inner", "ia3_ff", Scale(encoder.ffn_dim)),
        ]
