"""``--arch roberta_inducer``: inducer-tuning (paper 003; SPEC section 3) on the frozen RoBERTa,
with its composable blocks: LoRA on W_q and the parallel FFN adapter. Inducer-tuning,
inducer-tuning + LoRA and MAM inducer-tuning are this one model with different settings.

Presets (``--inducer-preset``; paper Table 5, NLU rows: r_k / r_v / LoRA rank / FFN-adapter
bottleneck), flags given explicitly win:

| preset       | r_k | r_v | value     | output   | LoRA (W_q) | FFN adapter (s = 2) | params roberta-base / -large |
|--------------|-----|-----|-----------|----------|------------|---------------------|------------------------------|
| inducer      | 6   | 4   | extended  | residual | -          | -                   | 609,696 / 2,019,072          |
| inducer-lora | 2   | 4   | extended  | residual | 4          | -                   | 609,120 / 2,017,536          |
| mam-inducer  | 2   | 2   | extended  | residual | 4          | 12                  | 599,760 / 1,795,872          |
| adaptive     | 0   | 32  | per-head  | residual | -          | -                   | Table 3 ablation             |
| extension    | 0   | 5   | extended  | residual | -          | -                   | Table 3 ablation             |
| gating       | 6   | 4   | extended  | gated    | -          | -                   | Table 3 ablation             |

The three ablations (paper section 6.2, Table 3) are given the NLU inducer-tuning budget
(~0.61M on roberta-base): Table 5 sizes them only for GPT-2 (NLG); docs/inducer.md gives the
arithmetic. Options beyond the presets: ``--inducer-output gated`` (the paper's
(1 - lambda) Attn + lambda v~), ``--inducer-lambda unmasked`` (the released code's lambda,
padded keys in the normaliser), ``--inducer-lambda-dropout``.

Training recipe (SPEC section 3, the authors' NLU script): lr 2e-4, polynomial decay with 6%
warmup (``scripts/run.sh TASK --method inducer|inducer-lora|mam-inducer``).
"""
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import roberta_base_architecture, roberta_large_architecture

from fairseq_idpg.methods import register_method
from fairseq_idpg.models.frozen_roberta import FrozenBackboneRobertaModel
from fairseq_idpg.models.roberta_adapters import (
    BLOCK_DEFAULTS,
    RobertaAdaptersModel,
    add_ffn_adapter_args,
    add_lora_args,
)
from fairseq_idpg.modules.inducer import Inducer

INDUCER_DEFAULTS = dict(
    BLOCK_DEFAULTS,
    lora_targets="q",
    inducer_key_rank=6, inducer_value_rank=4, inducer_value="extended", inducer_output="residual",
    inducer_lambda="masked", inducer_lambda_dropout=0.1,
)
_TABLE5 = {"inducer_value": "extended", "inducer_output": "residual"}


@register_model("roberta_inducer")
class RobertaInducerModel(RobertaAdaptersModel):
    """Frozen RoBERTa with inducer-tuning in every self-attention layer (module docstring)."""

    PRESET_FLAG = "inducer_preset"
    PRESETS = {
        "inducer": dict(_TABLE5, inducer_key_rank=6, inducer_value_rank=4),
        "inducer-lora": dict(_TABLE5, inducer_key_rank=2, inducer_value_rank=4, lora_rank=4, lora_targets="q"),
        "mam-inducer": dict(_TABLE5, inducer_key_rank=2, inducer_value_rank=2, lora_rank=4, lora_targets="q",
                            ffn_adapter_dim=12, ffn_adapter_scale=2.0),
        "adaptive": dict(inducer_key_rank=0, inducer_value_rank=32, inducer_value="per-head", inducer_output="residual"),
        "extension": dict(_TABLE5, inducer_key_rank=0, inducer_value_rank=5),
        "gating": dict(inducer_key_rank=6, inducer_value_rank=4, inducer_value="extended", inducer_output="gated"),
    }
    DEFAULTS = INDUCER_DEFAULTS

    @staticmethod
    def add_args(parser):
        FrozenBackboneRobertaModel.add_args(parser)
        g = parser.add_argument_group("Inducer-tuning (paper 003; SPEC section 3)")
        g.add_argument("--inducer-preset", choices=list(RobertaInducerModel.PRESETS), default="inducer",
                       help="Table 5 configuration or Table 3 ablation (default inducer); flags given explicitly win")
        g.add_argument("--inducer-key-rank", type=int, metavar="R_K", help="bottleneck of MLP_k (k~ = q + MLP_k(q)); 0: k~ = q")
        g.add_argument("--inducer-value-rank", type=int, metavar="R_V", help="bottleneck of the value MLP (>= 1)")
        g.add_argument("--inducer-value", choices=["extended", "per-head"],
                       help="extended: value up-projection fused with W_o (section 4.4); per-head: v~ in each head")
        g.add_argument("--inducer-output", choices=["residual", "gated"],
                       help="residual: Attn + lambda Delta (released code); gated: (1 - lambda) Attn + lambda v~ (paper)")
        g.add_argument("--inducer-lambda", choices=["masked", "unmasked"],
                       help="masked: padded keys out of lambda's normaliser (default); unmasked: as the released code")
        g.add_argument("--inducer-lambda-dropout", type=float, metavar="P", help="dropout on lambda (0.1)")
        add_lora_args(parser)
        add_ffn_adapter_args(parser)

    @classmethod
    def configure(cls, args):
        super().configure(args)
        if args.inducer_key_rank == 1:
            raise ValueError("--inducer-key-rank must be 0 (k~ = q) or >= 2, got 1 (the released code builds no key MLP below 2)")
        if not 0.0 <= args.inducer_lambda_dropout < 1.0:
            raise ValueError(f"--inducer-lambda-dropout must be in [0, 1), got {args.inducer_lambda_dropout}")

    @classmethod
    def check_something_trains(cls, args):
        if args.inducer_value_rank < 1:
            raise ValueError(f"--inducer-value-rank must be >= 1 (inducer-tuning needs its value MLP), got {args.inducer_value_rank}")

    def inducer_factory(self, args):
        def make(layer_index):
            return Inducer(
                args.encoder_embed_dim, args.encoder_attention_heads, args.inducer_key_rank, args.inducer_value_rank,
                extend_value=args.inducer_value == "extended", output=args.inducer_output,
                mask_lambda=args.inducer_lambda == "masked", lambda_dropout=args.inducer_lambda_dropout,
            )
        return make


@register_model_architecture("roberta_inducer", "roberta_inducer")
def roberta_inducer_base(args):
    roberta_base_architecture(args)


@register_model_architecture("roberta_inducer", "roberta_inducer_large")
def roberta_inducer_large(args):
    roberta_large_architecture(args)


_DESCRIPTION = {
    "inducer": "inducer-tuning 6/4 (paper Table 5, NLU)",
    "inducer-lora": "inducer-tuning + LoRA on W_q, 2/4/4 (paper Table 5, NLU)",
    "mam-inducer": "MAM inducer-tuning 2/2/4/12 (paper Table 5, NLU)",
    "adaptive": "Table 3 ablation Adaptive (k~ = q, per-head value), NLU budget",
    "extension": "Table 3 ablation Extension (k~ = q, extended value), NLU budget",
    "gating": "Table 3 ablation Gating ((1 - lambda) Attn + lambda v~), 6/4",
}
for _name in RobertaInducerModel.PRESETS:
    _method = _name if _name.startswith(("inducer", "mam")) else f"inducer-{_name}"
    register_method(_method, ["--arch", "roberta_inducer", "--inducer-preset", _name],
                    lr=2e-4, scheduler="polynomial_decay", description=_DESCRIPTION[_name])
