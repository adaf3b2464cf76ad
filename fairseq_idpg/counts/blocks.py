"""Parameter counts of inducer-tuning and the adapter-family baselines (``--arch roberta_blocks``).

Every "ours" is counted from the model of the method's record (``fairseq_idpg.methods``) built at
the paper's size on the ``meta`` device (``models.build``: no memory), trainable tensors only,
classification head excluded. "paper" is the published figure where the paper states one exactly
(inducer-tuning Table 5's configurations; IDPG Table 2 for Compacter), else the block's formula
(ints are checked exactly by ``scripts/count_params.py``). DoRA's figure is PEFT's own count
(``print_trainable_parameters`` of ``LoraConfig(r=16, lora_alpha=32, target_modules=["query", "value"],
use_dora=True)`` on roberta-large, no head: tests/test_lora_variants.py builds it and checks the figure);
PiSSA-initialised LoRA trains LoRA's tensors (its start is all that differs). VeRA's figure is its paper's
(Table 1, RoBERTa-large: 0.061M) and PEFT's count of ``VeraConfig(r=256, target_modules=["query", "value"])``
on roberta-large, no head (tests/test_vera.py builds it): 61,440, 2 x 24 x (r + d). LoReFT's figure is
r (2 d + 1) per layer, 49,176 at roberta.large: ReFT Table 4's 0.014% of RoBERTa-large's 355,359,744
(tests/test_loreft.py).
"""

from fairseq.data import Dictionary

from fairseq_idpg.methods import METHODS
from fairseq_idpg.models.build import ROBERTA_BASE, ROBERTA_LARGE, build_method, count_trainable

SIZES = {"roberta-base": ROBERTA_BASE, "roberta-large": ROBERTA_LARGE}
# peft 0.21.2's print_trainable_parameters for DoRA r = 16, alpha = 32 on query and value of roberta-large (no head)
PEFT_DORA_LARGE = 1_622_016
# peft 0.21.2's print_trainable_parameters for VeRA r = 256 on query and value of roberta-large (no head): the
# VeRA paper's 0.061M (Table 1)
PEFT_VERA_LARGE = 61_440


def build_meta(method, size):
    """The model of ``method`` at ``size`` on the meta device (the vocabulary changes no count)."""
    return build_method(METHODS[method], Dictionary(), meta=True, **SIZES[size])


def count(method, size):
    return count_trainable(METHODS[method], SIZES[size])


def inducer_rows():
    paper = {  # inducer-tuning Table 5, NLU configurations
        ("inducer", "roberta-base"): 609_696,
        ("inducer-lora", "roberta-base"): 609_120,
        ("mam-inducer", "roberta-base"): 599_760,
        ("inducer", "roberta-large"): 2_019_072,
        ("inducer-lora", "roberta-large"): 2_017_536,
        ("mam-inducer", "roberta-large"): 1_795_872,
    }
    rows = []
    for size in SIZES:
        for method, label in (
            ("inducer", "inducer 6/4"),
            ("inducer-lora", "+ LoRA 2/4/4"),
            ("mam-inducer", "MAM inducer 2/2/4/12"),
        ):
            rows.append((f"{label} ({size[8:]})", count(method, size), paper[(method, size)]))
    return rows


def baseline_rows():
    def formula_houlsby(d, L, r):
        return 2 * L * (2 * d * r + r + d)

    def prefix_trained(d, L, l, m=800):  # Embedding(l, d) -> Linear(d, m) -> tanh -> Linear(m, 2 L d)
        return l * d + (d * m + m) + (m * 2 * L * d + 2 * L * d)

    rows = [  # IDPG Table 2 says 1.55M for the adapter; its own appendix formula gives 1,622,784
        ("Houlsby adapter r=16 (large)", count("houlsby-adapter", "roberta-large"), formula_houlsby(1024, 24, 16)),
        ("Compacter n=4 r=16 k=1 (large)", count("compacter", "roberta-large"), 152_832),
    ]
    for size, (d, L) in (("roberta-base", (768, 12)), ("roberta-large", (1024, 24))):
        model = build_meta("prefix-tuning", size)
        length = model.prefix_encoder.length
        rows.append(
            (f"prefix l={length} trained ({size[8:]})", model.num_trainable_parameters(), prefix_trained(d, L, length))
        )
        model.prefix_encoder.to_stored()
        rows.append((f"prefix l={length} stored ({size[8:]})", model.num_trainable_parameters(), 2 * L * length * d))
    ffn_adapter = 12 * (2 * 768 * 16 + 16 + 768)
    mam = build_meta("mam-adapter", "roberta-base")
    mam_trained = mam.num_trainable_parameters()
    mam.prefix_encoder.to_stored()
    rows += [
        ("LoRA q,v r=16 (base)", count("lora", "roberta-base"), 2 * 12 * 2 * 768 * 16),
        ("LoRA q,v r=16 (large)", count("lora", "roberta-large"), 2 * 24 * 2 * 1024 * 16),
        # 2 x 24 x (2 d r + d): A, B and the magnitude m of each projection
        ("DoRA q,v r=16 (large; PEFT's)", count("dora", "roberta-large"), PEFT_DORA_LARGE),
        ("PiSSA q,v r=16 (large)", count("pissa", "roberta-large"), 2 * 24 * 2 * 1024 * 16),
        # 2 x 24 x (r + d): d [r] and b [d] of each projection; the shared A and B are frozen
        ("VeRA q,v r=256 (large; PEFT's)", count("vera", "roberta-large"), PEFT_VERA_LARGE),
        ("MAM adapter 16+16 trained (base)", mam_trained, prefix_trained(768, 12, 16) + ffn_adapter),
        ("MAM adapter 16+16 stored (base)", mam.num_trainable_parameters(), 2 * 12 * 16 * 768 + ffn_adapter),
        (
            "BitFit (base)",
            count("bitfit", "roberta-base"),
            12 * (4 * 768 + 3072 + 768 + 2 * 768) + 768,
        ),  # q k v out, fc1, fc2, 2 LayerNorms; embedding LN
        # l_k, l_v, l_ff per layer: PEFT's IA3Config on RoBERTa with targets key, value and the FFN's
        # output.dense (feedforward) counts the same 55,296 (blocks/ia3.py)
        ("(IA)^3 k, v, ff (base)", count("ia3", "roberta-base"), 12 * (768 + 768 + 3072)),
        ("(IA)^3 k, v, ff (large)", count("ia3", "roberta-large"), 24 * (1024 + 1024 + 4096)),
        # r (2 d + 1) per layer: R and W [r, d], b [r] (blocks/loreft.py); ReFT Table 4: 0.015% and 0.014%
        ("LoReFT r=1, all layers, f1 (base)", count("loreft", "roberta-base"), 12 * (2 * 768 + 1)),
        ("LoReFT r=1, all layers, f1 (large)", count("loreft", "roberta-large"), 24 * (2 * 1024 + 1)),
    ]
    return rows


TABLES = [
    ("Inducer-tuning (inducer-tuning Table 5, NLU)", inducer_rows),
    ("Adapter-family baselines (IDPG Table 2 / appendix A.1.2; the blocks' formulas)", baseline_rows),
]
