"""Sequential adapters (Houlsby et al. 2019; Compacter as in IDPG appendix A.1.2): two per layer,
``attn_adapter`` after the attention sublayer and ``ffn_adapter`` after the FFN (``--adapter``)."""

from dataclasses import dataclass

from fairseq_idpg.blocks import Attachment, BlockConfig, register_block
from fairseq_idpg.errors import ConfigError
from fairseq_idpg.modules.adapters.bottleneck import BottleneckAdapter, check_bottleneck
from fairseq_idpg.modules.adapters.compacter import CompacterAdapter
from fairseq_idpg.options import check_at_least, option

KINDS = ("none", "houlsby", "compacter")


@register_block(
    "adapter", "Sequential adapters (Houlsby et al. 2019; Compacter)", slots=("after_attention", "after_ffn")
)
@dataclass
class AdapterConfig(BlockConfig):
    adapter: str = option("none", "2 adapters per layer, after attention and after the FFN", choices=KINDS)
    adapter_dim: int = option(16, "bottleneck r (16)", metavar="R", size=True)
    compacter_n: int = option(4, "Kronecker terms n of Compacter's PHM layers (4)", metavar="N")
    compacter_rank: int = option(1, "rank of Compacter's factorised B_i = s_i t_i (1)", metavar="K", size=True)

    def active(self):
        return self.adapter != "none"

    def check(self, encoder):
        if self.adapter != "none":
            check_bottleneck("--adapter-dim", self.adapter_dim, encoder.dim)
        if self.adapter == "compacter":
            n, dim = self.compacter_n, encoder.dim
            if n < 1 or dim % n or self.adapter_dim % n:
                raise ConfigError(
                    f"--compacter-n {n} must divide --encoder-embed-dim {dim} and --adapter-dim {self.adapter_dim}"
                )
            check_at_least(self, "compacter_rank", 1)

    def adapter_module(self, dim):
        if self.adapter == "houlsby":
            return BottleneckAdapter(dim, self.adapter_dim, init="houlsby")
        return CompacterAdapter(dim, self.adapter_dim, self.compacter_n, self.compacter_rank)

    def layer_blocks(self, index, encoder, model):
        return [
            Attachment("after_attention", "attn_adapter", self.adapter_module(encoder.dim)),
            Attachment("after_ffn", "ffn_adapter", self.adapter_module(encoder.dim)),
        ]
