"""Parameter counts of the prompt family: IDPG Table 2 (``roberta_idpg`` and the static prompts of
``roberta_prompt`` it compares with), IDPG's low-rank layer biases, and DPT with its baselines.

Every "ours" is counted from the model of the method's record (``fairseq_idpg.methods``; presets
without a record through their architecture) built at the paper's size on the ``meta`` device
(``models.build``: no memory), trainable tensors only, classification head excluded.

"paper": IDPG Table 2 rounds (5K, 134K, 1.5M, ...); the exact figures are the formulas of IDPG
appendix A.1.2, which reproduce every rounded figure of the table: the ``ok`` marks compare the
built modules with them. DPT: the paper's own formula of DPT section 3.1 evaluated (l d for prompt
tuning, l b + b d for DPT), or its Table 1 figure for T5 of the same width (residual prompt tuning,
rounded down to thousands); "-" where the paper has nothing (the rank probe, l r + r + r d, and the
deep variants: deep DPT L (l b + b d), deep prompt tuning L l d).
"""

import tempfile

from fairseq_idpg.methods import METHODS
from fairseq_idpg.models.build import ROBERTA_BASE, ROBERTA_LARGE, STANDIN, count_trainable

D, L, T = ROBERTA_LARGE["encoder_embed_dim"], ROBERTA_LARGE["encoder_layers"], 5  # IDPG: roberta-large, t = 5


def count(name, size=ROBERTA_LARGE, **options):
    """Trainable parameters of method ``name`` (or ``roberta_prompt`` preset ``name``) at ``size``."""
    if name in METHODS:
        return count_trainable(METHODS[name], size, **options)
    return count_trainable("roberta_prompt", size, prompt_preset=name, **options)


def _glove_file(folder):
    path = f"{folder}/glove.300d.txt"  # the size of glove.6B.300d.txt; one word is enough to build
    with open(path, "w") as f:
        f.write("the " + " ".join(["0.1"] * 300) + "\n")
    return path


# ---------------------------------------------------------------------------------------- IDPG
def table2_rows():
    n, m16, m256 = 16, 16, 256
    with tempfile.TemporaryDirectory() as tmp:
        glove = count("m-idpg-phm-glove", idpg_glove_vectors=_glove_file(tmp))
    return [
        ("Prompt-tuning (5K)", count("prompt-tuning-5"), T * D),
        ("Prompt-tuning-134 (134K)", count("prompt-tuning-134"), 134 * D),
        ("P-Tuning v2 (120K)", count("p-tuning-v2-5"), L * T * D),
        ("S-IDPG-PHM (105K)", count("s-idpg-phm"), n**3 + (D * m256 + m256 * T * D) // n + m256 + T * D),
        ("S-IDPG-DNN (1.5M)", count("s-idpg-dnn"), D * m256 + m256 + m256 * T * D + T * D),
        (
            "M-IDPG-PHM-GloVe (141K)",
            glove,
            2 * 4**3 + (300 * m16 + m16 * T * D) // 4 + m16 + T * D + (L - 1) * T * D,
        ),
        (
            "M-IDPG-PHM (134K)",
            count("m-idpg-phm"),
            2 * n**3 + (D * m16 + m16 * T * D) // n + m16 + T * D + (L - 1) * T * D,
        ),
        ("M-IDPG-DNN (216K)", count("m-idpg-dnn"), D * m16 + m16 + m16 * T * D + L * T * D),
    ]


def low_rank_rows():
    """c_1..c_(L-1) = U V with U: [L-1, r], V: [r, t d] (``--idpg-layer-bias-rank r``)."""
    n, m = 16, 16
    shared = 2 * n**3 + (D * m + m * T * D) // n + m + T * D
    return [
        (f"M-IDPG-PHM-LR r={r}", count("m-idpg-phm", idpg_layer_bias_rank=r), shared + (L - 1) * r + r * T * D)
        for r in (1, 2, 4, 8, 16)
    ]


IDPG_TABLES = [
    ("IDPG Table 2 (roberta-large, head excluded)", table2_rows),
    (
        "IDPG low-rank layer biases (beyond the paper; roberta-large): 'paper' = the formula "
        "2n^3 + (dm + mtd)/n + m + td + (L-1)r + rtd",
        low_rank_rows,
    ),
]

# ---------------------------------------------------------------------------------------- DPT
L_PROMPT, BOTTLENECK, RESIDUAL_M = 100, 10, 400
DPT_SIZES = (  # title, size, residual PT figure of DPT Table 1 (T5 of the same d)
    ("RoBERTa-large (d = 1024, L = 24)", ROBERTA_LARGE, "925K"),
    ("RoBERTa-base (d = 768, L = 12)", ROBERTA_BASE, "693K"),
    ("offline stand-in for roberta.large, all-MiniLM-L6-v2 (d = 384, L = 6)", STANDIN, "-"),
)


def _dpt_rows(size, residual_paper):
    def rows():
        d, layers, l, b = size["encoder_embed_dim"], size["encoder_layers"], L_PROMPT, BOTTLENECK
        return [
            (f"DPT l={l} b={b}: lb + bd", count("dpt", size), l * b + b * d),
            (f"prompt tuning l={l}: ld", count("prompt-tuning-100", size), l * d),
            (f"residual PT l={l} m={RESIDUAL_M}", count("residual-prompt", size), residual_paper),
            (f"rank probe r={l}: lr + r + rd", count("dpt-rank-probe", size), "-"),
            (f"deep DPT: L(lb + bd), L={layers}", count("deep-dpt", size), "-"),
            ("deep PT (P-tuning v2): Lld", count("deep-prompt-tuning-100", size), "-"),
        ]

    return rows


DPT_TABLES = [(f"DPT on {title}", _dpt_rows(size, residual)) for title, size, residual in DPT_SIZES]
TABLES = IDPG_TABLES + DPT_TABLES
