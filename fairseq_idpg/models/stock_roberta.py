"""fairseq's ``roberta`` architecture (full fine-tuning: the ``finetune`` and ``efl`` records), every weight
trained, its layers run as the frozen-backbone models run theirs.

Importing this module puts ``StockRobertaModel`` behind ``--arch roberta`` (``ARCH_MODEL_REGISTRY``):
fairseq-train, fairseq-validate (``--user-dir fairseq_idpg``), ``RobertaModel.from_pretrained`` and
``models.build`` build it for that name. It is fairseq's ``RobertaModel`` (the same modules, state-dict names,
options and checkpoints; the architecture's name, so run folders keep their names) with three changes of how,
not what, it computes:

- the layers are run by ``modules/frozen_encoder.encode_layers`` (``frozen_roberta.FrozenRobertaEncoder``):
  fairseq's encoder loop, with one host read of whether the batch has padding (fairseq: two) and the embeddings
  in fewer operators;
- the self-attention is ``AugmentedSelfAttention`` with no blocks attached (converted in place: the same
  projections under the same names): torch's fused attention with a boolean padding mask built once per
  forward, where fairseq's concatenates the three projection biases and makes a float mask in every layer;
- GELU is torch's in the compute dtype (``frozen_roberta.compute_dtype_gelu``; fairseq's casts to fp32 and
  back, four casts per layer in fp16/bf16).

fp32 logits and gradients equal fairseq's ``RobertaModel``'s within 1e-6 (tests/test_stock_roberta.py). The
other RoBERTa architecture names (``roberta_base``, ``roberta_large``, ...) stay fairseq's.
"""

from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.roberta import RobertaModel
from fairseq.models.roberta.model import RobertaEncoder

from fairseq_idpg.models.frozen_roberta import FrozenRobertaEncoder, compute_dtype_gelu
from fairseq_idpg.modules.attention.augmented_self_attention import AugmentedSelfAttention

ARCH = "roberta"
FAIRSEQ_MODEL = ARCH_MODEL_REGISTRY[ARCH]  # fairseq's RobertaModel, registered under the name


class StockRobertaModel(RobertaModel):
    """fairseq's ``RobertaModel`` with its layers run as the frozen-backbone models run theirs (module docstring)."""

    def __init__(self, args, encoder):
        if type(encoder) is RobertaEncoder:
            encoder.__class__ = FrozenRobertaEncoder  # in place: the same modules, state-dict names and settings
        super().__init__(args, encoder)
        compute_dtype_gelu(encoder.sentence_encoder.layers)
        for i, layer in enumerate(encoder.sentence_encoder.layers):
            AugmentedSelfAttention.convert(layer.self_attn, i)


ARCH_MODEL_REGISTRY[ARCH] = StockRobertaModel
