"""BitFit (Ben Zaken et al. 2021): every bias of the encoder trains (attention, FFN, LayerNorms, the
embedding LayerNorm); no module of its own."""

from dataclasses import dataclass

from fairseq_idpg.blocks import BlockConfig, register_block
from fairseq_idpg.options import option


@register_block("bitfit", "BitFit (Ben Zaken et al. 2021)", slots=("biases",))
@dataclass
class BitFitConfig(BlockConfig):
    bitfit: bool = option(False, "train every bias of the encoder")

    def active(self):
        return bool(self.bitfit)

    def trains_backbone_parameter(self, name):
        return bool(self.bitfit) and name.startswith("encoder.sentence_encoder.") and name.endswith(".bias")
