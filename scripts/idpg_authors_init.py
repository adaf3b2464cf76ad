#!/usr/bin/env python3
"""Where the IDPG authors' whole model starts each trained tensor, against where ours starts it.

Their fairseq-train builds ``RobertaModel`` (fairseq/models/roberta/model.py of github:CSerxy/IDPG): its
``build_model`` makes their ``RobertaEncoder``, which makes the prompted ``TransformerSentenceEncoder`` (the
generator's tensors drawn by the encoder's own ``_init_weights``: the output-bias tables U(-0.5, 0.5)); then
``RobertaModel.__init__`` applies ``init_bert_params`` to the whole model (every ``nn.Linear`` N(0, 0.02^2) with
zero bias, every ``nn.Embedding`` N(0, 0.02^2)); their task registers the classification head; ``--restore-file``
loads RoBERTa with ``strict=False`` (trainer.py), which holds no generator keys. This script does exactly that
on a tiny random RoBERTa: their model.py and encoder files are read from the checkout and executed (nothing is
copied into the project) with the shim of scripts/idpg_authors_check.py plus: fairseq's registries replaced by
no-op decorators (their ``roberta`` would clash with the installed fairseq's), ``TransformerSentenceEncoder`` their
shimmed one, the hub interface import dropped,
``n_trans_layers_to_freeze = 24`` (roberta-large's) -> the model's layer count.

For every tensor that trains (requires grad, not in the checkpoint) it prints each side's mean, std, min, max
and whether the two are the same law (``same_law``). Methods: S-IDPG-PHM, S-IDPG-DNN, M-IDPG-PHM, M-IDPG-DNN,
their A.5.1 ablations (``+residual``, ``+layernorm``), prompt tuning and P-tuning v2 (their ``--add-suffix``
without ``--prompt-generation``; P-tuning v2 with ``--middle-prompt-insert-layer 1``), with the flags of their
scripts (IDPG-PHM.sh, IDPG-DNN.sh).

    PYTHONPATH=. python3 scripts/idpg_authors_init.py --idpg-authors /tmp/idpg-authors \
        [--save-fixture tests/data/idpg_authors]

``--save-fixture DIR`` writes their side's laws to DIR/init_laws.json, which tests/test_idpg_authors_init.py
holds ours to without the checkout. Exit status 0 when every tensor has the same law on both sides, 1
otherwise, 2 for a refusal.
"""

import argparse
import json
import math
import sys
import tempfile
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import idpg_authors_check as check  # noqa: E402

HEAD = "sentence_classification_head"  # their task's head name
DIMS = dict(layers=2, dim=32, heads=4, ffn=64, seed=0)  # the one-batch check's tiny model; presets' m and n
MODEL_SHIM = (
    ("from fairseq.models import (", "from _idpg_authors_model_shim import ("),
    (
        "from fairseq.modules.transformer_sentence_encoder import init_bert_params",
        "from _idpg_authors_model_shim import init_bert_params",
    ),
    ("from .hub_interface import RobertaHubInterface", "RobertaHubInterface = None"),
    ("n_trans_layers_to_freeze = 24", "n_trans_layers_to_freeze = args.encoder_layers"),
)
# method -> their script's flags (the generator's as idpg_authors_check.their_flags; prompts: --add-suffix alone)
PROMPT_FLAGS = {
    "prompt-tuning-5": dict(add_suffix=True),
    "p-tuning-v2-5": dict(add_suffix=True, middle_prompt_insert_layer=1, middle_prompt_mode="none"),
}
ABLATIONS = {  # our method + options, their extra flags (A.5.1)
    "s-idpg-phm+residual": ("s-idpg-phm", dict(idpg_residual=True), dict(generator_residual=True)),
    "s-idpg-phm+layernorm": ("s-idpg-phm", dict(idpg_layer_norm=True), dict(generator_layer_norm=True)),
}
METHODS = (*check.METHODS, *ABLATIONS, *PROMPT_FLAGS)


# ---------------------------------------------------------------------------------------------- their model
def import_their_model(checkout):
    """Their model.py's module (RobertaModel, base_architecture), on their shimmed encoder."""
    encoder_cls = check.import_authors(checkout)
    encoder_module = sys.modules.get(encoder_cls.__module__) or types.SimpleNamespace(
        **encoder_cls.__init__.__globals__
    )
    from fairseq.models import FairseqEncoder, FairseqEncoderModel

    shim = types.ModuleType("_idpg_authors_model_shim")
    shim.FairseqEncoder, shim.FairseqEncoderModel = FairseqEncoder, FairseqEncoderModel
    shim.register_model = shim.register_model_architecture = lambda *a, **k: lambda obj: obj
    shim.LayerNorm = sys.modules["_idpg_authors_shim"].LayerNorm
    shim.TransformerSentenceEncoder = encoder_cls
    shim.init_bert_params = encoder_module.init_bert_params  # theirs (fairseq 0.9's, with MultiheadAttention's)
    sys.modules[shim.__name__] = shim
    sys.modules["_idpg_authors_shim"].TransformerSentenceEncoder = encoder_cls  # their `from fairseq.modules import`
    path = Path(checkout) / "fairseq" / "models" / "roberta" / "model.py"
    return check._exec_shimmed(path, "_idpg_authors_model", MODEL_SHIM)


def their_args(model_module, method, dims, ours):
    """Their fairseq-train arguments for ``method``: their parser's defaults, their script's flags, the tiny sizes."""
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)  # fairseq 0.9's model-specific group
    model_module.RobertaModel.add_args(parser)
    args = parser.parse_args([])
    args.encoder_layers, args.encoder_embed_dim = dims["encoder_layers"], dims["encoder_embed_dim"]
    args.encoder_ffn_embed_dim, args.encoder_attention_heads = (
        dims["encoder_ffn_embed_dim"],
        dims["encoder_attention_heads"],
    )
    args.max_positions, args.freeze_encoder, args.insert_position = 512, True, 0
    args.lstm = False  # their sentence_prediction task's --lstm (tasks/sentence_prediction.py), off in every script
    name = ABLATIONS[method][0] if method in ABLATIONS else method
    if name in PROMPT_FLAGS:
        args.suffix_len = 5
        vars(args).update(PROMPT_FLAGS[name])
        return args
    gen = ours.generator
    hidden = gen.W1.shape[1] if gen.kind == "dnn" else gen.phm1.out_features
    flags = check.their_flags(name, hidden, None if gen.kind == "dnn" else gen.phm1.n)
    flags.pop("sentence_generation"), flags.pop("glove_path"), flags.pop("add_suffix")
    generator = flags.pop("generation_quaternions"), flags.pop("phm_bottleneck_dim")
    vars(args).update(flags, add_suffix=True, suffix_len=gen.t, prompt_generation=True, generation_freeze=True,
                      generation_quaternions=generator[0], phm_bottleneck_dim=generator[1], glove=None)  # fmt: skip
    if method in ABLATIONS:
        vars(args).update(ABLATIONS[method][2])
    return args


def build_their_model(model_module, method, backbone, ours):
    """Their RobertaModel as their fairseq-train builds it: build_model (RobertaModel.__init__ applies
    init_bert_params), the task's classification head, then the checkpoint loaded with strict=False."""
    model_file, dictionary, dims = backbone
    args = their_args(model_module, method, dims, ours)
    model_module.base_architecture(args)  # their arch's defaults for what the flags leave unset
    task = types.SimpleNamespace(source_dictionary=dictionary)
    model = model_module.RobertaModel.build_model(args, task)
    model.register_classification_head(HEAD, num_classes=2)
    state = torch.load(model_file, map_location="cpu", weights_only=False)["model"]
    state = {k.replace("layernorm_embedding", "emb_layer_norm"): v for k, v in state.items()}
    checkpoint = set(state)
    torch.nn.Module.load_state_dict(model, state, strict=False)  # their trainer: strict=False
    return model, checkpoint


# ---------------------------------------------------------------------------------------------- laws
def law(values):
    """{mean, std, min, max, n} of a tensor."""
    v = values.detach().double().flatten()
    return dict(mean=v.mean().item(), std=v.std().item() if v.numel() > 1 else 0.0, min=v.min().item(),
                max=v.max().item(), n=v.numel())  # fmt: skip


SMALL = 30  # fewer values than this tell no law apart from another (except a constant)


def same_law(a, b):
    """Whether two measured laws are one distribution's draws: the same constant, or the same std (within sampling
    error for their sizes), means within a few standard errors of each other, and the same shape of range
    ((max - min) / std: about 3.5 for a uniform law, more for a normal one), loosely for small tensors. None (cannot
    tell) under SMALL values that are not constant: a 2-class head's bias."""
    if a["std"] == 0 or b["std"] == 0:  # a constant (zero biases, a LayerNorm's ones): the same constant
        return a["std"] == b["std"] and a["min"] == b["min"] and a["max"] == b["max"]
    n = min(a["n"], b["n"])
    if n < SMALL:
        return None
    if abs(a["std"] / b["std"] - 1) > 0.1 + 4 / math.sqrt(n):
        return False
    if abs(a["mean"] - b["mean"]) > 5 * max(a["std"], b["std"]) * math.sqrt(1 / a["n"] + 1 / b["n"]) + 1e-12:
        return False
    spread_a, spread_b = (a["max"] - a["min"]) / a["std"], (b["max"] - b["min"]) / b["std"]
    return n < 200 or abs(spread_a / spread_b - 1) < 0.25


def our_model(method, backbone, seed):
    name, options = ABLATIONS.get(method, (method, {}))[:2]
    torch.manual_seed(seed)
    model_file, dictionary, dims = backbone
    return check.build_ours(name, model_file, dictionary, dims, 0.1, **options)


def our_laws(method, backbone, seed=0):
    """{our tensor name: law} of every tensor that trains in our model of ``method``."""
    model = our_model(method, backbone, seed)
    return {n: law(p) for n, p in model.named_parameters() if p.requires_grad}


def their_laws(model_module, method, backbone, seed=0):
    """({our tensor name: law}, [their trained tensors with no counterpart]) of every tensor that trains in their
    model (requires grad, not in the checkpoint), in our names (the generator: idpg_authors_check.name_map)."""
    ours = our_model(method, backbone, seed)
    torch.manual_seed(seed)
    theirs, checkpoint = build_their_model(model_module, method, backbone, ours)
    trained = {n for n, p in theirs.named_parameters() if p.requires_grad and n not in checkpoint}
    name = ABLATIONS[method][0] if method in ABLATIONS else method
    enc, prefix = theirs.encoder.sentence_encoder, "encoder.sentence_encoder."
    if name in PROMPT_FLAGS:
        paths = {
            "prompt.weight": ["suffix_embed.weight"] + (["middle_prompt.weight"] if name == "p-tuning-v2-5" else [])
        }
        values = {n: torch.cat([enc.get_parameter(q).flatten() for q in qs]) for n, qs in paths.items()}
        used = {prefix + q for qs in paths.values() for q in qs}
    else:
        pairs = check.name_map(ours, name)
        values = dict(check.their_values(enc, pairs))
        used = {n for n in trained for _, path, _ in pairs if n.startswith(prefix + path.split(".")[0])}
        if method.endswith("+layernorm"):
            for p in ("weight", "bias"):
                values[f"generator.norm.{p}"] = enc.get_parameter(f"generator_layer_norm.{p}")
                used.add(f"{prefix}generator_layer_norm.{p}")
    for p in ("dense.weight", "dense.bias", "out_proj.weight", "out_proj.bias"):
        values[f"classification_heads.{check.HEAD}.{p}"] = theirs.get_parameter(f"classification_heads.{HEAD}.{p}")
        used.add(f"classification_heads.{HEAD}.{p}")
    return {n: law(v) for n, v in values.items()}, sorted(trained - used)


def compare(model_module, backbone, methods):
    """{method: [(our tensor, their law, our law, same)]} and {method: their trained tensors left unmapped}."""
    rows, unused = {}, {}
    for method in methods:
        theirs, unused[method] = their_laws(model_module, method, backbone)
        ours = our_laws(method, backbone)
        rows[method] = [
            (n, law_, ours.get(n), ours.get(n) is not None and same_law(law_, ours[n])) for n, law_ in theirs.items()
        ]  # fmt: skip (same: True, False, or None: too few values)
        rows[method] += [(n, None, ours[n], False) for n in ours if n not in theirs]
    return rows, unused


def fmt(law_):
    if law_ is None:
        return "(none)"
    return f"mean {law_['mean']:+.4f} std {law_['std']:.4f} [{law_['min']:+.4f}, {law_['max']:+.4f}] n {law_['n']}"


def print_rows(rows, unused):
    for method, entries in rows.items():
        print(f"\n{method}")
        for name, theirs, ours, same in entries:
            print(f"  {name:<40} theirs {fmt(theirs)}")
            verdict = "too few values to tell" if same is None else "same law" if same else "DIFFERENT"
            print(f"  {'':<40} ours   {fmt(ours)}   {verdict}")
        if unused[method]:
            print(f"  their other trained tensors (no counterpart): {', '.join(unused[method])}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idpg-authors", required=True, help="an extracted checkout of github:CSerxy/IDPG")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--save-fixture", metavar="DIR", help="write their laws to DIR/init_laws.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        model_module = import_their_model(args.idpg_authors)
        with tempfile.TemporaryDirectory() as tmp:
            backbone = check.tiny_backbone(tmp, DIMS["layers"], DIMS["dim"], DIMS["heads"], DIMS["ffn"], DIMS["seed"])
            rows, unused = compare(model_module, backbone, args.methods)
    except check.CheckError as e:
        print(f"idpg_authors_init: {e}", file=sys.stderr)
        return 2
    print_rows(rows, unused)
    if args.save_fixture:
        out = Path(args.save_fixture) / "init_laws.json"
        laws = {m: {n: theirs for n, theirs, _, _ in entries if theirs is not None} for m, entries in rows.items()}
        provenance = dict(repo="github:CSerxy/IDPG", commit=check.authors_commit(args.idpg_authors), dims=DIMS,
                          command="PYTHONPATH=. python3 scripts/idpg_authors_init.py --idpg-authors /tmp/idpg-authors "
                          "--save-fixture tests/data/idpg_authors")  # fmt: skip
        out.write_text(json.dumps(dict(provenance=provenance, laws=laws), indent=1) + "\n")
        print(f"\nfixture: {out}")
    different = [(m, n) for m, entries in rows.items() for n, _, _, same in entries if same is False]
    print(
        f"\n{len(different)} tensors with another law"
        + (": " + ", ".join(f"{m} {n}" for m, n in different) if different else "")
    )
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
