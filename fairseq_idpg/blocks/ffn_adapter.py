"""The parallel FFN adapter (He et al. 2021; MAM adapter and MAM inducer-tuning, inducer-tuning
section 5.2): a ``BottleneckAdapter`` beside each FFN (``parallel_adapter``), LoRA-initialised, with
its output scale s and the backbone's dropout on its hidden layer."""

from dataclasses import dataclass

from fairseq_idpg.blocks import Attachment, BlockConfig, register_block
from fairseq_idpg.modules.adapters.bottleneck import BottleneckAdapter, check_bottleneck
from fairseq_idpg.options import option


@register_block("ffn_adapter", "Parallel FFN adapter (He et al. 2021)", slots=("ffn",))
@dataclass
class ParallelAdapterConfig(BlockConfig):
    ffn_adapter_dim: int = option(0, "bottleneck of the adapter beside each FFN (0: off)", metavar="R", size=True)
    ffn_adapter_scale: float = option(2.0, "scale s of its output (2)", metavar="S")

    def active(self):
        return self.ffn_adapter_dim > 0

    def check(self, encoder):
        if self.ffn_adapter_dim:
            check_bottleneck("--ffn-adapter-dim", self.ffn_adapter_dim, encoder.dim)

    def layer_blocks(self, index, encoder, model):
        adapter = BottleneckAdapter(
            encoder.dim, self.ffn_adapter_dim, scale=self.ffn_adapter_scale, dropout=encoder.dropout, init="lora"
        )
        return [Attachment("ffn", "parallel_adapter", adapter)]
