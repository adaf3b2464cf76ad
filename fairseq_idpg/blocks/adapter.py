"""Sequential adapters (Houlsby et al. 2019; Compacter as in IDPG appendix A.1.2): two per layer,
``attn_adapter`` after the attention sublayer and ``ffn_adapter`` after the FFN (``--adapter``)."""

from dataclasses import dataclass

from fairseq_idpg.blocks import Attachment, BlockConfig, register_block
from fairseq_idpg.errors import ConfigError
from fairseq_idpg.modules.adapters.bottleneck import ACTIVATIONS, BottleneckAdapter, check_bottleneck
from fairseq_idpg.modules.adapters.compacter import CompacterAdapter
from fairseq_idpg.options import check_at_least, option

KINDS = ("none", "houlsby", "compacter")
# --adapter-init: idpg-authors (where the IDPG authors' baselines start once their model is built) or original
# (the adapters' own papers and code); the init name of each module per kind
INITS = {
    "idpg-authors": {"houlsby": "bert", "compacter": "idpg"},
    "original": {"houlsby": "houlsby", "compacter": "compacter"},
}


@register_block(
    "adapter", "Sequential adapters (Houlsby et al. 2019; Compacter)", slots=("after_attention", "after_ffn")
)
@dataclass
class AdapterConfig(BlockConfig):
    adapter: str = option("none", "2 adapters per layer, after attention and after the FFN", choices=KINDS)
    adapter_dim: int = option(16, "bottleneck r (16)", metavar="R", size=True)
    compacter_n: int = option(4, "Kronecker terms n of Compacter's PHM layers (4)", metavar="N")
    compacter_rank: int = option(1, "rank of Compacter's factorised B_i = s_i t_i (1)", metavar="K", size=True)
    adapter_init: str = option(
        "idpg-authors",
        "initial values: idpg-authors (the IDPG authors' model as it trains: Houlsby weights N(0, 0.02^2); "
        "Compacter A, s, t, down bias N(0, 0.05^2), up bias N(0, 0.02^2)) or original (Houlsby et al.: "
        "N(0, 1e-2) folded at 2 std; Compacter's config: A N(0, 0.01^2), s, t Glorot-uniform); other biases 0",
        choices=tuple(INITS),
    )
    adapter_activation: str = option(
        "relu",
        "the Houlsby adapter's nonlinearity: relu (the inducer-tuning authors' adapter) or gelu (the IDPG authors' "
        "adapter, their Table 1); Compacter's is GELU",
        choices=tuple(ACTIVATIONS),
        late=True,
    )

    def active(self):
        return self.adapter != "none"

    def check(self, encoder):
        if self.adapter != "none":
            check_bottleneck("--adapter-dim", self.adapter_dim, encoder.dim)
        if self.adapter != "houlsby" and self.adapter_activation != "relu":
            raise ConfigError("--adapter-activation applies to --adapter houlsby (Compacter's nonlinearity is GELU)")
        if self.adapter == "compacter":
            n, dim = self.compacter_n, encoder.dim
            if n < 1 or dim % n or self.adapter_dim % n:
                raise ConfigError(
                    f"--compacter-n {n} must divide --encoder-embed-dim {dim} and --adapter-dim {self.adapter_dim}"
                )
            check_at_least(self, "compacter_rank", 1)

    def adapter_module(self, dim):
        init = INITS[self.adapter_init][self.adapter]
        if self.adapter == "houlsby":
            return BottleneckAdapter(dim, self.adapter_dim, init=init, activation=self.adapter_activation)
        return CompacterAdapter(dim, self.adapter_dim, self.compacter_n, self.compacter_rank, init=init)

    def layer_blocks(self, index, encoder, model):
        return [
            Attachment("after_attention", "attn_adapter", self.adapter_module(encoder.dim)),
            Attachment("after_ffn", "ffn_adapter", self.adapter_module(encoder.dim)),
        ]
