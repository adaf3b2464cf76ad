"""LoRA (Hu et al. 2021; inducer-tuning section 4.5): ``modules.attention.lora.LoRA`` on the query
and/or value projection (``--lora-targets``), attached to the ``q`` / ``v`` slots as ``lora_q`` /
``lora_v``. ``merge_lora`` folds the updates into W_q / W_v for inference.

Two variants of the same update, as PEFT's ``LoraConfig`` has them:

- ``--lora-dora``: DoRA (Liu et al. 2024, Eq. 5), ``modules.attention.dora.DoRA``: a trained magnitude m per
  output feature over the updated weight's norms (PEFT's ``use_dora``);
- ``--lora-init pissa``: PiSSA (Meng et al. 2024), A and B start as the principal singular factors of the frozen
  weight, the residual stays frozen (PEFT's ``init_lora_weights="pissa"``; ``modules.attention.pissa``).

Both read the frozen weights, so they start once the backbone is loaded (``start_from_backbone``). Both options
were added after LoRA runs were named: at their defaults they are left out of a record's settings (``late``),
so those runs keep their folders."""

from dataclasses import dataclass

from fairseq_idpg.blocks import Attachment, BlockConfig, register_block
from fairseq_idpg.errors import ConfigError
from fairseq_idpg.modules.attention.dora import DoRA
from fairseq_idpg.modules.attention.lora import INITS, LoRA
from fairseq_idpg.options import option

TARGETS = ("q", "v")


@register_block("lora", "LoRA (Hu et al. 2021; inducer-tuning section 4.5)", slots=TARGETS)
@dataclass
class LoRAConfig(BlockConfig):
    lora_rank: int = option(0, "rank of the update (0: off)", metavar="R", size=True)
    lora_alpha: float = option(32.0, "scaling alpha: the update is (alpha / r) B A (32)")
    lora_dropout: float = option(0.1, "dropout on the LoRA input (0.1)")
    lora_targets: str = option("q,v", "projections that get LoRA: q, v or q,v", metavar="q,v")
    lora_dora: bool = option(
        False, "DoRA (Liu et al. 2024): a trained magnitude over the updated weight's norms (PEFT's use_dora)",
        late=True,
    )  # fmt: skip
    lora_init: str = option(
        "kaiming",
        "where A and B start: kaiming (A kaiming-uniform, B = 0; Hu et al. 2021) or pissa (the frozen weight's "
        "principal singular factors, the residual frozen; Meng et al. 2024)",
        choices=INITS,
        late=True,
    )

    def targets(self):
        """The projections that get LoRA: a subset of {"q", "v"} (empty when LoRA is off)."""
        return {t for t in str(self.lora_targets).split(",") if t} if self.lora_rank else set()

    def active(self):
        return self.lora_rank > 0

    def check(self, encoder):
        if self.lora_rank and (not self.targets() or self.targets() - set(TARGETS)):
            raise ConfigError(f"--lora-targets must be q, v or q,v, got {self.lora_targets!r}")

    def layer_blocks(self, index, encoder, model):
        attention = model.encoder.sentence_encoder.layers[index].self_attn
        modules = {t: self.update(getattr(attention, f"{t}_proj")) for t in TARGETS if t in self.targets()}
        return [Attachment(t, f"lora_{t}", module) for t, module in modules.items()]

    def update(self, projection):
        """The module on the frozen ``projection``: DoRA or LoRA."""
        settings = (self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_init)
        if self.lora_dora:
            return DoRA(projection, *settings)
        return LoRA(projection.in_features, projection.out_features, *settings)

    def start_from_backbone(self, model):
        for layer in model.encoder.sentence_encoder.layers:
            for t in self.targets():
                getattr(layer.self_attn, f"lora_{t}").start_from(getattr(layer.self_attn, f"{t}_proj"))


def merge_lora(model, block="lora"):
    """Fold every update of ``block`` (LoRA's, or another q / v block with ``merge_into``: VeRA's) into its frozen
    projection (inference: W + (alpha / r) B A)."""
    for layer in model.encoder.sentence_encoder.layers:
        attention = layer.self_attn
        for t in TARGETS:
            update = getattr(attention, f"{block}_{t}", None)
            if update is not None:
                update.merge_into(getattr(attention, f"{t}_proj"))
                attention.detach(f"{block}_{t}")
