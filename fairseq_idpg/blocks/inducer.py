"""Inducer-tuning (inducer-tuning sections 4.3-4.4): one ``modules.attention.inducer.Inducer`` per
layer in the ``attention_output`` slot (``...self_attn.inducer``)."""

from dataclasses import dataclass

from fairseq_idpg.blocks import Attachment, BlockConfig, register_block
from fairseq_idpg.errors import ConfigError
from fairseq_idpg.modules.attention.inducer import OUTPUTS, Inducer
from fairseq_idpg.options import option

VALUES = ("extended", "per-head")
LAMBDAS = ("masked", "unmasked")


@register_block("inducer", "Inducer-tuning (inducer-tuning sections 4.3-4.4)", slots=("attention_output",))
@dataclass
class InducerConfig(BlockConfig):
    inducer_value_rank: int = option(0, "bottleneck of the value MLP (0: off)", metavar="R_V", size=True)
    inducer_key_rank: int = option(6, "bottleneck of MLP_k (k~ = q + MLP_k(q)); 0: k~ = q (6)", metavar="R_K")
    inducer_value: str = option(
        "extended",
        "extended: value up-projection fused with W_o (section 4.4); per-head: v~ in each head",
        choices=VALUES,
    )
    inducer_output: str = option(
        "residual",
        "residual: Attn + lambda Delta (released code); gated: (1 - lambda) Attn + lambda v~ (paper)",
        choices=OUTPUTS,
    )
    inducer_lambda: str = option(
        "masked",
        "masked: padded keys out of lambda's normaliser (default); unmasked: as the released code",
        choices=LAMBDAS,
    )
    inducer_lambda_dropout: float = option(0.1, "dropout on lambda (0.1)", metavar="P")

    def active(self):
        return self.inducer_value_rank > 0

    def check(self, encoder):
        key_rank = self.inducer_key_rank
        if key_rank < 0 or key_rank == 1:
            raise ConfigError(
                f"--inducer-key-rank must be 0 (k~ = q) or >= 2, got {key_rank} "
                "(the released code builds no key MLP below 2)"
            )
        if not 0.0 <= self.inducer_lambda_dropout < 1.0:
            raise ConfigError(f"--inducer-lambda-dropout must be in [0, 1), got {self.inducer_lambda_dropout}")

    def layer_blocks(self, index, encoder, model):
        inducer = Inducer(
            encoder.dim,
            encoder.heads,
            self.inducer_key_rank,
            self.inducer_value_rank,
            extend_value=self.inducer_value == "extended",
            output=self.inducer_output,
            mask_lambda=self.inducer_lambda == "masked",
            lambda_dropout=self.inducer_lambda_dropout,
        )
        return [Attachment("attention_output", "inducer", inducer)]
