#!/usr/bin/env python3
"""Where training starts: the initial law of every trained tensor, the references' against ours.

    PYTHONPATH=. python3 scripts/init_laws.py [--kernel-adapters DIR] [--dpt-authors DIR] [--idpg-authors DIR]
                                              [--save-fixture tests/data/init_laws]

A reference's start is what its training entry point really builds: its whole model, with the constructors,
the post-init passes (``apply(init_bert_params)``, ``init_weights``/``post_init``) and the checkpoint loading
(which tensors it fills and which it leaves to ``_init_weights``), not one module's constructor read alone.
Each reference is built at the same small sizes as ours (d 64, 4 heads, 2 layers, FFN 128), its code run from
the checkout or the installed package (nothing of it is copied here):

- kernel-adapters (github:ychen-stat-ml/kernel-adapters, ``--kernel-adapters DIR``; the inducer-tuning authors):
  nlu/scripts/run_glue.py builds ``RobertaForSequenceClassification.from_pretrained`` of their
  nlu/models/roberta/modeling_roberta.py and wraps it in ``PETLEncModel``. Their README pins transformers 4.10.2,
  whose ``from_pretrained`` (``_fast_init``) runs no ``init_weights`` pass at construction and then applies
  ``_init_weights`` only to the modules holding keys the checkpoint lacks and ``_keys_to_ignore_on_load_missing``
  (``position_ids``, ``ef_``) does not name: the classification head. That is emulated here with the installed
  transformers (the shim of scripts/inducer_authors_check.py for the old imports): built with ``_init_weights``
  a no-op, then ``_init_weights`` on the head; the checkpoint's own values (the backbone) matter to no trained
  tensor. Presets: run_glue.sh's blocks "inducer w/o lora", "inducer + lora", "inducer + para_ffn", "lora",
  "MAM adapter", and its prefix block alone for prefix tuning (attn_mode=prefix, l 32, no FFN adapter).
- DPT (github:XYaoooo/DPT, ``--dpt-authors DIR``): main_ddp.py's ``T5PromptForConditionalGeneration_param
  .from_pretrained`` (transformers 4.20.1, their requirements: the same fast init); the prompt's module is
  their ``T5EncoderStack``, which T5's ``_init_weights`` does not match, so the constructor's draw stays.
- the IDPG authors (github:CSerxy/IDPG, ``--idpg-authors DIR``; the Adapter and Compacter rows of IDPG Table 1):
  their ``TransformerSentenceEncoder`` (fairseq/modules/transformer_sentence_encoder.py, run through the shim
  of scripts/idpg_authors_check.py) with ``--adapter-arch houlsby`` / ``compacter``, bottleneck 16, n 4, then
  fairseq's ``init_bert_params`` applied to it, as their ``RobertaModel.__init__`` does
  (``self.apply(init_bert_params)`` once the encoder is built; ``--restore-file`` loads RoBERTa with
  strict=False and has none of these keys).
- Hugging Face PEFT (installed): a tiny ``RobertaForSequenceClassification`` saved and loaded back with
  ``from_pretrained`` (the head is then the installed transformers' init of missing keys), through
  ``get_peft_model``: LoRA (q, v; r 16, alpha 32), (IA)^3 (its defaults for RoBERTa), prefix tuning
  (``prefix_projection``, hidden 800, l 32), prompt tuning (``PromptTuningInit.RANDOM``, 5 tokens).
- AdapterHub ``adapters`` (installed): ``AutoAdapterModel`` + ``add_adapter`` (double_seq_bn = Houlsby,
  seq_bn = Pfeiffer, compacter; bottleneck 16) + ``add_classification_head`` + ``train_adapter``.

Ours: each method record built by ``models.build.build_method`` at the same sizes, its head registered as
fairseq-train registers it (after the model is built). For every row: n, mean, std, min, max and the law's name
(zero / ones / U(-a, a) / N(m, s^2) / N(0, s^2) folded at 2 s, read off the moments) on both sides, and the
verdict of a two-sample Kolmogorov-Smirnov test at level 0.001 (or exact equality for constants). ``DECISIONS``
says, per row, whether ours is meant to match that reference and why not where it is not; the exit status is 1
when a verdict disagrees with its decision. ``--save-fixture DIR`` writes each reference's measured laws there
(one JSON per reference, with its repository and commit or package version and this command), which
tests/test_init_laws.py checks our tensors against without the checkouts.
"""

import argparse
import contextlib
import importlib.util
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SIZES = dict(encoder_layers=2, encoder_embed_dim=64, encoder_ffn_embed_dim=128, encoder_attention_heads=4)
HEAD = "sentence_classification_head"
KS_LEVEL_C = 1.949  # two-sample KS critical coefficient at alpha = 0.001
_HEAD_ROWS = {
    "head.dense.weight": r"classification_heads\..*\.dense\.weight$",
    "head.dense.bias": r"classification_heads\..*\.dense\.bias$",
    "head.out_proj.weight": r"classification_heads\..*\.out_proj\.weight$",
    "head.out_proj.bias": r"classification_heads\..*\.out_proj\.bias$",
}

# (reference, method, row) -> (expected verdict, the decision). A row absent here is expected "same".
_HEAD_KEPT = (
    "differs",
    "kept: fairseq's RobertaClassificationHead is registered after the model is built (fairseq 0.9 as the IDPG "
    "authors ran it, and 0.12), so it keeps PyTorch's Linear init for every method of the platform",
)
DECISIONS = {
    **{
        (ref, m, row): _HEAD_KEPT
        for ref, m in (
            ("peft", "lora"),
            ("adapters", "houlsby-adapter"),
        )
        for row in _HEAD_ROWS
    },
    **{
        ("kernel-adapters", m, row): (
            "differs",
            "kept: fairseq's head (PyTorch's Linear init, registered after the model is built); theirs starts "
            "N(0, 0.02^2) from from_pretrained's init of missing keys, and stays there: PETLEncModel freezes it",
        )
        for m in ("inducer",)
        for row in _HEAD_ROWS
    },
    ("peft", "prompt-tuning-5", "prompt"): (
        "differs",
        "kept: the IDPG Table 1 records start as the IDPG authors' model does (docs/idpg.md); PEFT's RANDOM init "
        "is nn.Embedding's N(0, 1)",
    ),
    **{
        ("adapters", "compacter", row): (
            "differs",
            "kept: the record reproduces IDPG Table 1's Compacter, so it starts as the IDPG authors' code does; "
            "AdapterHub's Compacter draws A N(0, 1e-4^2) and s, t Glorot-uniform per Kronecker term",
        )
        for row in ("A", "down.s", "down.t", "up.s", "up.t", "down.bias", "up.bias")
    },
}


# ---------------------------------------------------------------------------------------------- laws
def law(x):
    """The measured law of tensor ``x``: {n, mean, std, min, max, kurtosis, law}."""
    x = x.detach().double().flatten()
    n = x.numel()
    mean, std = x.mean().item(), x.std(unbiased=False).item()
    out = dict(n=n, mean=mean, std=std, min=x.min().item(), max=x.max().item())
    if std == 0:
        value = x[0].item()
        out["law"] = "zero" if value == 0 else ("ones" if value == 1 else f"constant {value:g}")
        out["kurtosis"] = 0.0
        return out
    kurt = (((x - mean) / std) ** 4).mean().item() - 3.0
    out["kurtosis"] = kurt
    bound = max(abs(out["min"]), abs(out["max"]))
    ratio = bound / std
    if kurt < -0.95 and ratio < 1.9:  # uniform: kurtosis -1.2, max = sqrt(3) std
        out["law"] = f"U(-{_g(bound)}, {_g(bound)})"
    elif ratio < 2.45 and kurt < -0.3:  # N(0, s^2) folded at 2 s (fmod): max = 2 s, std = 0.88 s, kurtosis -0.63
        out["law"] = f"N(0, {_g(bound / 2)}^2) folded at 2 s"
    else:
        out["law"] = f"N({'0' if abs(mean) < 3 * std / math.sqrt(n) else _g(mean)}, {_g(std)}^2)"
    return out


def _g(v):
    return f"{v:.3g}"


def _family(name):
    """The law's family without its scale: 'zero', 'ones', 'uniform', 'normal', 'folded normal', 'constant'."""
    if name in ("zero", "ones") or name.startswith("constant"):
        return name
    return "uniform" if name.startswith("U(") else ("folded normal" if "folded" in name else "normal")


def ks_same(a, b):
    """Two-sample Kolmogorov-Smirnov at level 0.001 (constants: exactly equal). Returns (same, statistic)."""
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    if a.std() == 0 or b.std() == 0:
        same = bool(a.std() == 0 and b.std() == 0 and a[0] == b[0])
        return same, 0.0 if same else 1.0
    a, b = a.sort().values, b.sort().values
    grid = torch.cat([a, b])
    cdf_a = torch.searchsorted(a, grid, right=True).double() / a.numel()
    cdf_b = torch.searchsorted(b, grid, right=True).double() / b.numel()
    d = (cdf_a - cdf_b).abs().max().item()
    n, m = a.numel(), b.numel()
    return d <= KS_LEVEL_C * math.sqrt((n + m) / (n * m)), d


FAMILY_MIN_N = 200  # below this many values, the moments do not tell a law's family apart


def families_agree(a, b):
    """The same family of law, where both samples are large enough to tell (constants: always)."""
    constant = lambda m: m["std"] == 0  # noqa: E731
    if constant(a) or constant(b) or min(a["n"], b["n"]) >= FAMILY_MIN_N:
        return _family(a["law"]) == _family(b["law"])
    return True


def laws_agree(ours, ref):
    """Our measured law against a reference's stored one (no samples): the same family (``families_agree``),
    the std within 5 and the mean within 6 standard errors, and for bounded laws the bound within 15%."""
    if not families_agree(ours, ref):
        return False
    if ref["std"] == 0:
        return ours["law"] == ref["law"]
    # the std of log(s) over n draws is about sqrt((kurtosis + 2) / (4 n)): 5 of those, both samples' errors
    k = min(max(ref.get("kurtosis", 0.0), -1.2), 6.0)
    if abs(math.log(ours["std"] / ref["std"])) > max(5 * math.sqrt((k + 2) / 4 * (1 / ours["n"] + 1 / ref["n"])), 0.02):
        return False
    if abs(ours["mean"] - ref["mean"]) > 6 * ref["std"] * math.sqrt(1 / ours["n"] + 1 / ref["n"]):
        return False
    if _family(ref["law"]) in ("uniform", "folded normal") and min(ours["n"], ref["n"]) >= FAMILY_MIN_N:
        bound = lambda d: max(abs(d["min"]), abs(d["max"]))  # noqa: E731
        return abs(bound(ours) / bound(ref) - 1) < 0.15
    return True


def pooled(named, rows):
    """{row: all tensors whose name matches the row's regex, flattened and concatenated}."""
    out = {}
    for row, pattern in rows.items():
        parts = [p.detach().flatten() for n, p in named if re.search(pattern, n)]
        if not parts:
            raise SystemExit(f"init_laws.py: no tensor matches {pattern!r} for row {row!r}")
        out[row] = torch.cat(parts)
    return out


# ---------------------------------------------------------------------------------------------- ours
# method -> (options given on top of the record, {row: regex over our parameter names})
_INDUCER = {
    "key_A": r"inducer\.key_A$", "key_a": r"inducer\.key_a$", "key_B": r"inducer\.key_B$", "key_b": r"inducer\.key_b$",
    "value_A": r"inducer\.value_A$", "value_a": r"inducer\.value_a$", "value_B": r"inducer\.value_B$",
    "value_b": r"inducer\.value_b$",
}  # fmt: skip
_LORA_Q = {"lora_q.A": r"lora_q\.A$", "lora_q.B": r"lora_q\.B$"}
_PARALLEL = {f"parallel.{p}.{k}": rf"parallel_adapter\.{p}\.{k}$" for p in ("down", "up") for k in ("weight", "bias")}
_PREFIX = {
    "prefix.embedding": r"prefix_encoder\.embedding\.weight$",
    "prefix.hidden.weight": r"prefix_encoder\.hidden\.weight$",
    "prefix.hidden.bias": r"prefix_encoder\.hidden\.bias$",
    "prefix.output.weight": r"prefix_encoder\.output\.weight$",
    "prefix.output.bias": r"prefix_encoder\.output\.bias$",
}
_ADAPTER = {f"{p}.{k}": rf"_adapter\.{p}\.{k}$" for p in ("down", "up") for k in ("weight", "bias")}
_COMPACTER = {
    "A": r"_adapter\.A$", "down.s": r"_adapter\.down\.s$", "down.t": r"_adapter\.down\.t$",
    "down.bias": r"_adapter\.down\.bias$", "up.s": r"_adapter\.up\.s$", "up.t": r"_adapter\.up\.t$",
    "up.bias": r"_adapter\.up\.bias$",
}  # fmt: skip
OURS = {
    "inducer": ({}, {**_INDUCER, **_HEAD_ROWS}),
    "inducer-lora": ({}, {**{k: v for k, v in _INDUCER.items()}, **_LORA_Q}),
    "mam-inducer": ({}, {**_LORA_Q, **_PARALLEL}),
    "lora": ({}, {**_LORA_Q, "lora_v.A": r"lora_v\.A$", "lora_v.B": r"lora_v\.B$", **_HEAD_ROWS}),
    "prefix-tuning": ({}, _PREFIX),
    "mam-adapter": ({}, {**_PREFIX, **_PARALLEL}),
    "ia3": ({}, {"ia3.l_k": r"ia3_k\.l$", "ia3.l_v": r"ia3_v\.l$", "ia3.l_ff": r"ia3_ff\.l$"}),
    "houlsby-adapter": ({}, {**_ADAPTER, **_HEAD_ROWS}),
    "compacter": ({}, _COMPACTER),
    "prompt-tuning-5": ({}, {"prompt": r"^prompt\.weight$"}),
    # the dpt record starts from vocabulary rows (docs/dpt.md); its --prompt-init uniform is the authors' draw
    "dpt": ({"prompt_init": "uniform"}, {"A": r"^prompt\.A$", "B": r"^prompt\.B$"}),
}


def build_ours(name, seed=0):
    """{row: pooled tensor} of our method ``name`` at ``SIZES`` (no backbone file: no trained tensor reads it)."""
    from fairseq.data import Dictionary

    from fairseq_idpg.methods import METHODS
    from fairseq_idpg.models.build import build_method

    options, rows = OURS[name]
    dictionary = Dictionary()
    for i in range(40):
        dictionary.add_symbol(f"w{i}")
    torch.manual_seed(seed)
    with contextlib.redirect_stderr(io.StringIO()):
        model = build_method(METHODS[name], dictionary, **SIZES, **options)
    model.register_classification_head(HEAD, num_classes=2)
    return pooled([(n, p) for n, p in model.named_parameters() if p.requires_grad], rows)


# ---------------------------------------------------------------------------------------------- tiny HF RoBERTa
def hf_config(**extra):
    from transformers import RobertaConfig

    d, layers = SIZES["encoder_embed_dim"], SIZES["encoder_layers"]
    heads, ffn = SIZES["encoder_attention_heads"], SIZES["encoder_ffn_embed_dim"]
    return RobertaConfig(
        vocab_size=50, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ffn,
        max_position_embeddings=70, num_labels=2, **extra,
    )  # fmt: skip


def _load_script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------- kernel-adapters
_KA_PREFIX = dict(attn_mode="prefix", attn_option="concat", attn_composition="add", mid_dim=800)
_KA_PARALLEL = dict(
    ffn_mode="adapter", ffn_option="parallel", ffn_adapter_layernorm_option="none", ffn_adapter_init_option="lora",
    ffn_adapter_scalar="2",
)  # fmt: skip


def kernel_adapters_presets(check):
    """{our method: (their run_glue.sh block, settings)}."""
    base = dict(lora_alpha=32, lora_dropout=0.1, lora_init="lora", unfreeze_params="ef_")
    presets = {name: check.PRESETS[name] for name in ("inducer", "inducer-lora", "mam-inducer")}
    # (their "lora" block trains no LoRA in this file: the query/value Linear with LoRA is replaced by a plain
    # nn.Linear right after (modeling_roberta.py, RobertaSelfAttention); PEFT is LoRA's reference here)
    presets["prefix-tuning"] = ("prefix alone (MAM's attention block)", dict(base, **_KA_PREFIX, attn_bn=32))
    presets["mam-adapter"] = ("MAM adapter", dict(base, **_KA_PREFIX, attn_bn=16, **_KA_PARALLEL, ffn_bn=16))
    return presets


_KA_ROWS = {
    "key_A": r"prefix_v_pert_mlp\.prefix_A$", "key_a": r"prefix_v_pert_mlp\.A_bias$",
    "key_B": r"prefix_v_pert_mlp\.prefix_B$", "key_b": r"prefix_v_pert_mlp\.B_bias$",
    "value_A": r"prefix_v_mlp\.prefix_A$", "value_a": r"prefix_v_mlp\.A_bias$",
    "value_B": r"prefix_v_mlp\.prefix_B$", "value_b": r"prefix_v_mlp\.B_bias$",
    "lora_q.A": r"query\.ef_lora_A$", "lora_q.B": r"query\.ef_lora_B$",
    "lora_v.A": r"value\.ef_lora_A$", "lora_v.B": r"value\.ef_lora_B$",
    **{f"parallel.{p}.{k}": rf"ef_ffn_adapter\.{p}_proj\.{k}$" for p in ("down", "up") for k in ("weight", "bias")},
    "prefix.embedding": r"prompt_model\.wte\.weight$",
    "prefix.hidden.weight": r"prompt_model\.control_trans\.0\.weight$",
    "prefix.hidden.bias": r"prompt_model\.control_trans\.0\.bias$",
    "prefix.output.weight": r"prompt_model\.control_trans\.2\.weight$",
    "prefix.output.bias": r"prompt_model\.control_trans\.2\.bias$",
    **{f"head.{p}.{k}": rf"classifier\.{p}\.{k}$" for p in ("dense", "out_proj") for k in ("weight", "bias")},
}  # fmt: skip


def kernel_adapters(checkout, seed=0):
    """{our method: {row: their tensor}}: their whole model as run_glue.py builds it (module docstring)."""
    check = _load_script("inducer_authors_check")
    modeling, enc_model, options = check.import_authors(checkout)
    cls = modeling.RobertaForSequenceClassification
    out = {}
    for ours, (_, settings) in kernel_adapters_presets(check).items():
        config = hf_config()
        tune = options.TuneArguments(**settings)
        for key, value in vars(tune).items():  # as run_glue.py does
            if not hasattr(config, key):
                setattr(config, key, value)
        torch.manual_seed(seed)
        init = modeling.RobertaPreTrainedModel._init_weights
        modeling.RobertaPreTrainedModel._init_weights = lambda self, module: None  # 4.10.2's fast init
        try:
            inner = cls(config)
        finally:
            modeling.RobertaPreTrainedModel._init_weights = init
        # the keys roberta-base's checkpoint lacks and the class does not ignore: the head's
        missing = [
            k for k in inner.state_dict()
            if not k.startswith("roberta.") and not any(re.search(p, k) for p in cls._keys_to_ignore_on_load_missing)
        ]  # fmt: skip
        with contextlib.redirect_stdout(io.StringIO()):
            for module in {k.rsplit(".", 1)[0] for k in missing}:
                inner._init_weights(inner.get_submodule(module))
            model = enc_model.PETLEncModel(config, tune, inner)
        # their head is not trained (PETLEncModel freezes every tensor without "ef_"): its start is still read
        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad or ".classifier." in n]
        rows = {r: _KA_ROWS[r] for r in OURS[ours][1] if r in _KA_ROWS}
        out[ours] = pooled(trained, rows)
    return out


def git_commit(checkout, mirror):
    for args in (["git", "-C", str(checkout), "rev-parse", "HEAD"], ["git", "--git-dir", mirror, "rev-parse", "HEAD"]):
        try:
            return subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip()
        except (subprocess.CalledProcessError, FileNotFoundError):
            continue
    return "unknown (an archive, as extracted)"


# ---------------------------------------------------------------------------------------------- DPT
def dpt_authors(checkout, seed=0):
    """{"dpt": {A, B}}: their T5PromptForConditionalGeneration_param as main_ddp.py's from_pretrained builds it."""
    check = _load_script("idpg_authors_check")
    module = check.import_dpt(checkout)
    cfg = module.T5Config(
        vocab_size=40, d_model=SIZES["encoder_embed_dim"], d_kv=16, d_ff=128, num_layers=2, num_heads=4
    )
    cfg.len_enc_prompt, cfg.len_dec_prompt, cfg.add_enc_prompt, cfg.add_dec_prompt = 100, 0, True, False
    cfg.num_tasks, cfg.bottle_neck = 1, 10
    cls = module.T5PromptForConditionalGeneration_param
    torch.manual_seed(seed)
    init = cls._init_weights
    cls._init_weights = lambda self, m: None  # 4.20.1's fast init: no init pass at construction
    try:
        model = cls(cfg)
    finally:
        cls._init_weights = init
    missing = [k for k in model.state_dict() if "prefix" in k]  # what a T5 checkpoint lacks
    missing = [k for k in missing if not any(re.search(p, k) for p in cls._keys_to_ignore_on_load_missing or ())]
    for name in {k.rsplit(".", 1)[0] for k in missing}:
        model._init_weights(model.get_submodule(name))
    named = [(n, p) for n, p in model.named_parameters() if "prefix" in n]  # main_ddp.py trains these
    return {"dpt": pooled(named, {"A": r"encoder\.prefix_first$", "B": r"encoder\.prefix_second$"})}


# ---------------------------------------------------------------------------------------------- IDPG authors
def idpg_authors(checkout, seed=0):
    """{"houlsby-adapter", "compacter"}: their encoder with --adapter-arch, then init_bert_params over it."""
    from fairseq.modules.transformer_sentence_encoder import init_bert_params

    check = _load_script("idpg_authors_check")
    encoder_cls = check.import_authors(checkout)
    out = {}
    rows = {
        "houlsby-adapter": {
            "down.weight": r"middle_adapter_MLP2?\.\d+\.0\.weight$",
            "down.bias": r"middle_adapter_MLP2?\.\d+\.0\.bias$",
            "up.weight": r"middle_adapter_MLP2?\.\d+\.2\.weight$",
            "up.bias": r"middle_adapter_MLP2?\.\d+\.2\.bias$",
        },
        "compacter": {
            "A": r"compacter_shared_A\.\d+$",
            "down.s": r"compacter_down_proj_s\.",
            "down.t": r"compacter_down_proj_t\.",
            "down.bias": r"compacter_down_proj_b\.",
            "up.s": r"compacter_up_proj_s\.",
            "up.t": r"compacter_up_proj_t\.",
            "up.bias": r"compacter_up_proj_b\.weight$",
        },
    }
    for ours, arch in (("houlsby-adapter", "houlsby"), ("compacter", "compacter")):
        torch.manual_seed(seed)
        encoder = encoder_cls(
            dictionary=None, bpe=None, padding_idx=1, vocab_size=40, num_encoder_layers=SIZES["encoder_layers"],
            embedding_dim=SIZES["encoder_embed_dim"], ffn_embedding_dim=SIZES["encoder_ffn_embed_dim"],
            num_attention_heads=SIZES["encoder_attention_heads"], max_seq_len=64, num_segments=0,
            encoder_normalize_before=True, apply_bert_init=True, activation_fn="gelu", freeze_embeddings=True,
            n_trans_layers_to_freeze=SIZES["encoder_layers"], adapter_arch=arch, adapter_insert_layer=1,
            adapter_bottleneck_dim=16, compacter_n=4, sentence_generation=None,
        )  # fmt: skip
        encoder.apply(init_bert_params)  # their RobertaModel.__init__: self.apply(init_bert_params)
        named = [(n, p) for n, p in encoder.named_parameters() if re.search("adapter|compacter", n)]
        out[ours] = pooled(named, rows[ours])
    return out


# ---------------------------------------------------------------------------------------------- PEFT, adapters
def _hf_classifier(directory):
    """A tiny RoBERTa saved as a checkpoint without a head, loaded back for classification (as a user does)."""
    from transformers import RobertaForMaskedLM, RobertaForSequenceClassification
    from transformers.utils import logging

    logging.set_verbosity_error()
    RobertaForMaskedLM(hf_config()).save_pretrained(directory)
    return RobertaForSequenceClassification.from_pretrained(directory, num_labels=2)


_HF_HEAD = {
    f"head.{p}.{k}": rf"classifier\.modules_to_save\..*{p}\.{k}$"
    for p in ("dense", "out_proj")
    for k in ("weight", "bias")
}


def peft_reference(seed=0):
    """{our method: {row: tensor}} for PEFT's LoRA, (IA)^3, prefix tuning and prompt tuning."""
    import peft

    configs = {
        "lora": (
            peft.LoraConfig(
                task_type="SEQ_CLS", r=16, lora_alpha=32, lora_dropout=0.1, target_modules=["query", "value"]
            ),
            {
                "lora_q.A": r"query\.lora_A\.default\.weight$",
                "lora_q.B": r"query\.lora_B\.default\.weight$",
                "lora_v.A": r"value\.lora_A\.default\.weight$",
                "lora_v.B": r"value\.lora_B\.default\.weight$",
                **_HF_HEAD,
            },
        ),
        "ia3": (
            peft.IA3Config(task_type="SEQ_CLS"),
            {
                "ia3.l_k": r"key\.ia3_l\.default$",
                "ia3.l_v": r"value\.ia3_l\.default$",
                "ia3.l_ff": r"layer\.\d+\.output\.dense\.ia3_l\.default$",
            },
        ),
        "prefix-tuning": (
            peft.PrefixTuningConfig(
                task_type="SEQ_CLS", num_virtual_tokens=32, prefix_projection=True, encoder_hidden_size=800
            ),
            {
                "prefix.embedding": r"prompt_encoder\.default\.embedding\.weight$",
                "prefix.hidden.weight": r"prompt_encoder\.default\.transform\.0\.weight$",
                "prefix.hidden.bias": r"prompt_encoder\.default\.transform\.0\.bias$",
                "prefix.output.weight": r"prompt_encoder\.default\.transform\.2\.weight$",
                "prefix.output.bias": r"prompt_encoder\.default\.transform\.2\.bias$",
            },
        ),
        "prompt-tuning-5": (
            peft.PromptTuningConfig(
                task_type="SEQ_CLS", num_virtual_tokens=5, prompt_tuning_init=peft.PromptTuningInit.RANDOM
            ),
            {"prompt": r"prompt_encoder\.default\.embedding\.weight$"},
        ),
    }
    out = {}
    with tempfile.TemporaryDirectory() as directory:
        for ours, (config, rows) in configs.items():
            torch.manual_seed(seed)
            model = peft.get_peft_model(_hf_classifier(directory), config)
            out[ours] = pooled([(n, p) for n, p in model.named_parameters() if p.requires_grad], rows)
    return out


def adapters_reference(seed=0):
    """{our method: {row: tensor}} for AdapterHub's Houlsby (double_seq_bn), Pfeiffer (seq_bn), Compacter."""
    from adapters import AutoAdapterModel, CompacterConfig, DoubleSeqBnConfig, SeqBnConfig
    from transformers.utils import logging

    logging.set_verbosity_error()
    bottleneck = {
        "down.weight": r"adapter_down\.0\.weight$", "down.bias": r"adapter_down\.0\.bias$",
        "up.weight": r"adapter_up\.weight$", "up.bias": r"adapter_up\.bias$",
    }  # fmt: skip
    head = {
        f"head.{p}.{k}": rf"heads\.a\.{i}\.{k}$" for p, i in (("dense", 1), ("out_proj", 4)) for k in ("weight", "bias")
    }
    compacter = {
        "A": r"shared_parameters\.a\.phm_rule$", "down.s": r"adapter_down\.0\.W_left$",
        "down.t": r"adapter_down\.0\.W_right$", "down.bias": r"adapter_down\.0\.b$", "up.s": r"adapter_up\.W_left$",
        "up.t": r"adapter_up\.W_right$", "up.bias": r"adapter_up\.b$",
    }  # fmt: skip
    factor = SIZES["encoder_embed_dim"] // 16
    setups = {
        "houlsby-adapter": (DoubleSeqBnConfig(reduction_factor=factor), {**bottleneck, **head}),
        "houlsby-adapter (Pfeiffer)": (SeqBnConfig(reduction_factor=factor), bottleneck),
        "compacter": (CompacterConfig(reduction_factor=factor, phm_dim=4), compacter),
    }
    out = {}
    for ours, (config, rows) in setups.items():
        torch.manual_seed(seed)
        model = AutoAdapterModel.from_config(hf_config())
        model.add_adapter("a", config=config)
        model.add_classification_head("a", num_labels=2)
        model.train_adapter("a")
        out[ours] = pooled([(n, p) for n, p in model.named_parameters() if p.requires_grad], rows)
    return out


# ---------------------------------------------------------------------------------------------- table
def compare(reference, measured, ours_cache):
    """[(reference, method, row, ref law, our law, verdict, expected, decision)] for one reference."""
    lines = []
    for method, rows in measured.items():
        base = method.split(" (")[0]
        if base not in ours_cache:
            ours_cache[base] = build_ours(base)
        for row, theirs in rows.items():
            mine = ours_cache[base][row]
            same = ks_same(theirs, mine)[0] and families_agree(law(theirs), law(mine))
            verdict = "same law" if same else "differs"
            expected, decision = DECISIONS.get((reference, base, row), ("same", "ours = the reference"))
            lines.append((reference, method, row, law(theirs), law(mine), verdict, expected, decision))
    return lines


def _cell(m):
    return f"{m['law']}  [{m['mean']:+.3g} {m['std']:.3g} {m['min']:+.3g} {m['max']:+.3g}]"


def print_table(lines):
    print("reference        method / tensor                     reference law [mean std min max]"
          "                ours [mean std min max]                                  verdict")  # fmt: skip
    for ref, method, row, theirs, mine, verdict, expected, _ in lines:
        flag = "" if (verdict == "same law") == (expected == "same") else "   <-- UNEXPECTED"
        print(f"{ref:16s} {method + ' / ' + row:36s} {_cell(theirs):58s} {_cell(mine):58s} {verdict}{flag}")
    kept = sorted({(r, m, d) for r, m, _, _, _, v, e, d in lines if e != "same"})
    if kept:
        print("\ndecisions where ours differs from the reference:")
        for ref, method, decision in kept:
            print(f"  {ref} / {method}: {decision}")


def provenance(reference, args):
    import adapters
    import peft
    import transformers

    command = "PYTHONPATH=. python3 scripts/init_laws.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in (("kernel_adapters", args.kernel_adapters),
                                                     ("dpt_authors", args.dpt_authors),
                                                     ("idpg_authors", args.idpg_authors)) if v
    ) + f" --save-fixture {args.save_fixture}"  # fmt: skip
    sources = {
        "kernel-adapters": dict(
            repository="github:ychen-stat-ml/kernel-adapters",
            commit=git_commit(args.kernel_adapters, "/work/.mirror/ychen-stat-ml+kernel-adapters/repo"),
            built="nlu/scripts/run_glue.py's from_pretrained (transformers 4.10.2 fast init, emulated) + PETLEncModel",
        ),
        "dpt": dict(
            repository="github:XYaoooo/DPT", commit=git_commit(args.dpt_authors, "/work/.mirror/XYaoooo+DPT/repo"),
            built="main_ddp.py's T5PromptForConditionalGeneration_param.from_pretrained (4.20.1 fast init, emulated)",
        ),
        "idpg-authors": dict(
            repository="github:CSerxy/IDPG", commit=git_commit(args.idpg_authors, "/work/.mirror/CSerxy+IDPG/repo"),
            built="TransformerSentenceEncoder(--adapter-arch ...) then init_bert_params (their RobertaModel.__init__)",
        ),
        "peft": dict(package=f"peft {peft.__version__}", transformers=transformers.__version__,
                     built="RobertaForSequenceClassification.from_pretrained + get_peft_model"),
        "adapters": dict(package=f"adapters {adapters.__version__}", transformers=transformers.__version__,
                         built="AutoAdapterModel + add_adapter + add_classification_head + train_adapter"),
    }  # fmt: skip
    return dict(sources[reference], sizes=SIZES, command=command, torch=torch.__version__)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel-adapters", metavar="DIR", help="an extracted github:ychen-stat-ml/kernel-adapters")
    parser.add_argument("--dpt-authors", metavar="DIR", help="an extracted github:XYaoooo/DPT")
    parser.add_argument("--idpg-authors", metavar="DIR", help="an extracted github:CSerxy/IDPG")
    parser.add_argument("--save-fixture", metavar="DIR", help="write each reference's laws there (JSON)")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    references = {"peft": peft_reference, "adapters": adapters_reference}
    if args.kernel_adapters:
        references["kernel-adapters"] = lambda: kernel_adapters(args.kernel_adapters)
    if args.dpt_authors:
        references["dpt"] = lambda: dpt_authors(args.dpt_authors)
    if args.idpg_authors:
        references["idpg-authors"] = lambda: idpg_authors(args.idpg_authors)
    lines, ours_cache = [], {}
    for reference, build in references.items():
        measured = build()
        lines += compare(reference, measured, ours_cache)
        if args.save_fixture:
            folder = Path(args.save_fixture)
            folder.mkdir(parents=True, exist_ok=True)
            laws = {f"{m}/{row}": law(t) for m, rows in measured.items() for row, t in rows.items()}
            record = dict(provenance=provenance(reference, args), laws=laws)
            (folder / f"{reference}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print_table(lines)
    unexpected = [line for line in lines if (line[5] == "same law") != (line[6] == "same")]
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
