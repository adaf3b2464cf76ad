"""VeRA (Kopiczko et al. 2024, section 3): ``modules.attention.vera.VeRA`` on the query and/or value projection
(``--vera-targets``), attached to the ``q`` / ``v`` slots as ``vera_q`` / ``vera_v``; the frozen random A and B,
one pair for every layer, are the model's ``vera_projections`` (``SharedProjections``), drawn from
``--vera-seed`` (PEFT's ``projection_prng_key``) at every build and never saved."""

from dataclasses import dataclass

from fairseq_idpg.blocks import Attachment, BlockConfig, register_block
from fairseq_idpg.errors import ConfigError
from fairseq_idpg.modules.attention.vera import SharedProjections, VeRA
from fairseq_idpg.options import option

TARGETS = ("q", "v")


@register_block("vera", "VeRA (Kopiczko et al. 2024)", slots=TARGETS)
@dataclass
class VeRAConfig(BlockConfig):
    vera_rank: int = option(0, "rank r of the shared random matrices A [r, d], B [d, r] (0: off)", metavar="R",
                            size=True)  # fmt: skip
    vera_seed: int = option(0, "seed of the shared random A and B (PEFT's projection_prng_key; 0)", check=">= 0")
    vera_d_initial: float = option(0.1, "initial value of the trained vectors d (b starts at 0; 0.1)")
    vera_dropout: float = option(0.0, "dropout on the VeRA input (PEFT's vera_dropout; 0)", check=">= 0")
    vera_targets: str = option("q,v", "projections that get VeRA: q, v or q,v", metavar="q,v")

    def targets(self):
        """The projections that get VeRA: a subset of {"q", "v"} (empty when VeRA is off)."""
        return {t for t in str(self.vera_targets).split(",") if t} if self.vera_rank else set()

    def active(self):
        return self.vera_rank > 0

    def check(self, encoder):
        if self.vera_rank and (not self.targets() or self.targets() - set(TARGETS)):
            raise ConfigError(f"--vera-targets must be q, v or q,v, got {self.vera_targets!r}")
        if self.vera_rank and self.vera_dropout >= 1:
            raise ConfigError(f"--vera-dropout must be < 1, got {self.vera_dropout}")

    def install(self, model, encoder):
        # q and v of RoBERTa are both d x d: the pair PEFT sizes for the largest adapted projection
        model.vera_projections = SharedProjections(encoder.dim, encoder.dim, self.vera_rank, self.vera_seed)

    def layer_blocks(self, index, encoder, model):
        shared, d = model.vera_projections, encoder.dim
        return [
            Attachment(t, f"vera_{t}", VeRA(shared, d, d, self.vera_d_initial, self.vera_dropout))
            for t in TARGETS
            if t in self.targets()
        ]
