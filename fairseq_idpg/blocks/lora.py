"""LoRA (Hu et al. 2021; inducer-tuning section 4.5): ``modules.attention.lora.LoRA`` on the query
and/or value projection (``--lora-targets``), attached to the ``q`` / ``v`` slots as ``lora_q`` /
``lora_v``. ``merge_lora`` folds the updates into W_q / W_v for inference."""

from dataclasses import dataclass

from fairseq_idpg.blocks import Attachment, BlockConfig, register_block
from fairseq_idpg.errors import ConfigError
from fairseq_idpg.modules.attention.lora import LoRA
from fairseq_idpg.options import option

TARGETS = ("q", "v")


@register_block("lora", "LoRA (Hu et al. 2021; inducer-tuning section 4.5)", slots=TARGETS)
@dataclass
class LoRAConfig(BlockConfig):
    lora_rank: int = option(0, "rank of the update (0: off)", metavar="R", size=True)
    lora_alpha: float = option(32.0, "scaling alpha: the update is (alpha / r) B A (32)")
    lora_dropout: float = option(0.1, "dropout on the LoRA input (0.1)")
    lora_targets: str = option("q,v", "projections that get LoRA: q, v or q,v", metavar="q,v")

    def targets(self):
        """The projections that get LoRA: a subset of {"q", "v"} (empty when LoRA is off)."""
        return {t for t in str(self.lora_targets).split(",") if t} if self.lora_rank else set()

    def active(self):
        return self.lora_rank > 0

    def check(self, encoder):
        if self.lora_rank and (not self.targets() or self.targets() - set(TARGETS)):
            raise ConfigError(f"--lora-targets must be q, v or q,v, got {self.lora_targets!r}")

    def layer_blocks(self, index, encoder, model):
        d = encoder.dim
        return [
            Attachment(t, f"lora_{t}", LoRA(d, d, self.lora_rank, self.lora_alpha, self.lora_dropout))
            for t in TARGETS
            if t in self.targets()
        ]


def merge_lora(model):
    """Fold every LoRA update into its frozen projection (inference: W + (alpha / r) B A)."""
    for layer in model.encoder.sentence_encoder.layers:
        attention = layer.self_attn
        for t in TARGETS:
            lora = getattr(attention, f"lora_{t}", None)
            if lora is not None:
                lora.merge_into(getattr(attention, f"{t}_proj"))
                attention.detach(f"lora_{t}")
