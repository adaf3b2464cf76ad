"""DPT-family parameter counts (paper 002, SPEC section 2), counted from ``roberta_dpt`` models built
on the meta device at each size (trainable tensors, classification head excluded).

"paper": the paper's own formula evaluated (section 3.1: l d for vanilla prompt tuning, l b + b d
for DPT; 11,240 and 102,400 at d = 1024), or its Table 1 figure for T5 of the same width
(residual prompt tuning, which the paper rounds down to thousands); "-" where the paper has
nothing: the rank probe (l r + r + r d) and the deep variants beyond it (deep DPT: L (l b + b d),
one low-rank prompt per layer; deep prompt tuning: L l d).
"""
import argparse
import types
from unittest import mock

import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY

L_PROMPT, BOTTLENECK, RESIDUAL_M = 100, 10, 400
SIZES = (  # title, arch, encoder flags, residual PT figure of DPT Table 1 (T5 of the same d)
    ("RoBERTa-large (d = 1024, L = 24)", "roberta_dpt_large", {}, "925K"),
    ("RoBERTa-base (d = 768, L = 12)", "roberta_dpt_base", {}, "693K"),
    (
        "offline stand-in for roberta.large, all-MiniLM-L6-v2 (d = 384, L = 6)",
        "roberta_dpt",
        {"encoder_layers": 6, "encoder_embed_dim": 384, "encoder_ffn_embed_dim": 1536, "encoder_attention_heads": 12},
        "-",
    ),
)


def count(arch, encoder_flags, **dpt_flags):
    """Trainable parameters (no head) of a ``roberta_dpt`` built at that size on the meta device."""
    from fairseq_idpg.models.roberta_dpt import RobertaDPTModel

    args = argparse.Namespace(arch=arch, max_positions=512, **encoder_flags, **dpt_flags)
    ARCH_CONFIG_REGISTRY[arch](args)
    dictionary = Dictionary()  # the vocabulary is frozen backbone: its size changes no count
    task = types.SimpleNamespace(source_dictionary=dictionary)
    # meta tensors hold no values: fairseq's init_bert_params (which copies through the CPU)
    # has nothing to initialise, and values change no count
    with torch.device("meta"), mock.patch("fairseq.models.roberta.model.init_bert_params", lambda module: None):
        model = RobertaDPTModel.build_model(args, task)
    return model.num_trainable_parameters(), args.encoder_embed_dim, args.encoder_layers


def _rows(arch, encoder_flags, residual_paper):
    def rows():
        n = lambda preset, **kw: count(arch, encoder_flags, dpt_preset=preset, **kw)[0]  # noqa: E731
        _, d, L = count(arch, encoder_flags, dpt_preset="dpt")
        l, b = L_PROMPT, BOTTLENECK
        return [
            (f"DPT l={l} b={b}: lb + bd", n("dpt"), l * b + b * d),
            (f"prompt tuning l={l}: ld", n("prompt-tuning"), l * d),
            (f"residual PT l={l} m={RESIDUAL_M}", n("residual-prompt"), residual_paper),
            (f"rank probe r={l}: lr + r + rd", n("dpt-rank-probe"), "-"),
            (f"deep DPT: L(lb + bd), L={L}", n("deep-dpt"), "-"),
            (f"deep PT (P-tuning v2): Lld", n("deep-prompt-tuning"), "-"),
        ]

    return rows


TABLES = [(f"DPT (paper 002) on {title}", _rows(arch, flags, residual)) for title, arch, flags, residual in SIZES]
