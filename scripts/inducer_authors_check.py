#!/usr/bin/env python3
"""Our inducer-tuning presets against the authors' own code (kernel-adapters, NLU part), on the same frozen
weights, the same trainable values and the same batch: max |ours - theirs| of every layer's hidden states,
of the logits and of every trainable tensor's gradient, and both sides' trainable parameter counts.

    git --git-dir=$(MIRROR) archive HEAD | tar -x -C /tmp/kernel-adapters    # github:ychen-stat-ml/kernel-adapters
    PYTHONPATH=. python3 scripts/inducer_authors_check.py --kernel-adapters /tmp/kernel-adapters

The default backbone, models/minilm-l6-fairseq/model.pt, is the offline stand-in: all-MiniLM-L6-v2 converted to
fairseq RoBERTa format (6 layers x 384, 12 heads), NOT RoBERTa; it is built (scripts/build_standin.sh) when
missing. Any fairseq RoBERTa checkpoint can be given with --model.

Their side: ``RobertaForSequenceClassification`` of nlu/models/roberta/modeling_roberta.py wrapped in
``PETLEncModel`` (nlu/petl/petl_enc_model.py, which freezes every tensor whose name lacks ``ef_``), imported at
run time from the checkout (nothing of it is copied here), with the settings of nlu/scripts/run_glue.sh's blocks
"inducer w/o lora", "inducer + lora" and "inducer + para_ffn". Their file predates the installed transformers;
before importing it this script patches the minimum at run time: ``apply_chunking_to_forward``,
``find_pruneable_heads_and_indices`` and ``prune_linear_layer`` are put back into transformers.modeling_utils
(from transformers.pytorch_utils, where they moved), and the four docstring decorators of transformers.file_utils
become no-ops (their old keyword arguments are refused now). The frozen weights are ours converted by
``interop.hf_backbone.hf_roberta_weights`` (LayerNorm epsilon 1e-5 and exact GELU on both sides).

Both models run in eval mode (no dropout: dropout on lambda, on LoRA's input and in the adapter are read from the
code, not measured). Trainable tensors are first compared at initialisation (distribution: std and max |x| of
fresh draws, since the values are random), then every one of ours is moved off its initialisation by
N(0, --perturb^2) and copied into theirs under an explicit name map. The exact comparison builds ours with
``--inducer-lambda unmasked`` (the released code keeps padded keys in lambda's normaliser); our default (masked)
is reported beside it on the same padded batch (exact agreement needs a batch without padding: the released
lambda reads padded keys, and fairseq zeroes padded embeddings where transformers does not). Also printed: our
lambda per layer at initialisation, and what their LoRA block (attn_mode=lora) trains.
"""

import argparse
import contextlib
import csv
import io
import os
import re
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO / "models" / "minilm-l6-fairseq" / "model.pt"
DEFAULT_DATA = REPO.parent / "shared" / "data" / "glue"
HEAD = "sentence_classification_head"

# our preset -> the authors' run_glue.sh block (their TuneArguments; unset fields keep options.py's defaults)
_INDUCER = dict(
    attn_mode="inducer", attn_composition="add", attn_bn=4, ffn_mode="none", ffn_option="none",
    ffn_adapter_layernorm_option="none", ffn_adapter_scalar="1", ffn_adapter_init_option="bert", ffn_bn=0,
    lora_alpha=32, lora_dropout=0.1, lora_init="lora", prefix_tuning="landmark", prefix_value_extension=True,
    mid_dim=800, unfreeze_params="ef_",
)  # fmt: skip
PRESETS = {
    "inducer": ("inducer w/o lora", dict(_INDUCER, attn_option="none", prefix_length=6, prefix_dim=4)),
    "inducer-lora": ("inducer + lora", dict(_INDUCER, attn_option="Qlora", prefix_length=2, prefix_dim=4)),
    "mam-inducer": (
        "inducer + para_ffn",
        dict(
            _INDUCER, attn_option="Qlora", prefix_length=2, prefix_dim=2, ffn_mode="adapter", ffn_option="parallel",
            ffn_adapter_init_option="lora", ffn_adapter_scalar="2", ffn_bn=12,
        ),
    ),
}  # fmt: skip


class CheckError(Exception):
    """A one-line refusal (missing checkout, model or data)."""


# ---------------------------------------------------------------------------------------------- their code
def import_authors(checkout):
    """(modeling_roberta, petl_enc_model, options) imported from ``checkout``/nlu, with the run-time patches of
    the module docstring."""
    nlu = Path(checkout) / "nlu"
    if not (nlu / "models" / "roberta" / "modeling_roberta.py").is_file():
        raise CheckError(
            f"--kernel-adapters {checkout}: no nlu/models/roberta/modeling_roberta.py there (extract "
            "github:ychen-stat-ml/kernel-adapters, e.g. git --git-dir=MIRROR archive HEAD | tar -x -C DIR)"
        )
    import importlib

    import transformers.file_utils as file_utils
    import transformers.modeling_utils as modeling_utils
    import transformers.pytorch_utils as pytorch_utils

    for name in ("apply_chunking_to_forward", "find_pruneable_heads_and_indices", "prune_linear_layer"):
        if not hasattr(modeling_utils, name):
            setattr(modeling_utils, name, getattr(pytorch_utils, name))

    def no_docstring(*args, **kwargs):
        return lambda f: f

    for name in (
        "add_code_sample_docstrings",
        "add_start_docstrings",
        "add_start_docstrings_to_model_forward",
        "replace_return_docstrings",
    ):
        setattr(file_utils, name, no_docstring)
    sys.path.insert(0, str(nlu))
    modeling = importlib.import_module("models.roberta.modeling_roberta")
    enc_model = importlib.import_module("petl.petl_enc_model")
    options = importlib.import_module("petl.options")
    return modeling, enc_model, options


def build_theirs(authors, state, settings, num_classes):
    """Their PETLEncModel(RobertaForSequenceClassification) on the fairseq checkpoint ``state``'s weights; the
    head is copied from ours later. Returns (model, tune_args)."""
    from transformers import RobertaConfig

    from fairseq_idpg.interop.hf_backbone import ENCODER, hf_roberta_config, hf_roberta_weights, model_cfg

    modeling, enc_model, options = authors
    cfg, weights = model_cfg(state), state["model"]
    vocab, positions = (weights[ENCODER + f"{n}.weight"].shape[0] for n in ("embed_tokens", "embed_positions"))
    config = RobertaConfig(**hf_roberta_config(cfg, vocab, positions), num_labels=num_classes)
    tune = options.TuneArguments(**settings)
    for key, value in vars(tune).items():  # as run_glue.py does
        if not hasattr(config, key):
            setattr(config, key, value)
    # As their from_pretrained under transformers 4.10.2 (_fast_init): the modules' own constructors initialise
    # (no init_weights pass), the checkpoint loads, and only modules with missing keys that their
    # _keys_to_ignore_on_load_missing (position_ids, ef_) does not name get _init_weights: the head.
    cls = modeling.RobertaForSequenceClassification
    init = modeling.RobertaPreTrainedModel._init_weights
    modeling.RobertaPreTrainedModel._init_weights = lambda self, module: None
    try:
        inner = cls(config)
    finally:
        modeling.RobertaPreTrainedModel._init_weights = init
    missing, unexpected = inner.load_state_dict(hf_roberta_weights(weights, cfg["encoder_layers"]), strict=False)
    missing = [k for k in missing if not any(re.search(p, k) for p in cls._keys_to_ignore_on_load_missing)]
    if unexpected or any(not k.startswith("classifier.") for k in missing):
        raise CheckError(
            f"their model does not take the converted weights: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    with contextlib.redirect_stdout(io.StringIO()):  # their _init_weights prints a banner per module
        for name in {k.rsplit(".", 1)[0] for k in missing}:
            inner._init_weights(inner.get_submodule(name))
    with contextlib.redirect_stdout(io.StringIO()):  # PETLEncModel prints "tune NAME" per trained tensor
        model = enc_model.PETLEncModel(config, tune, inner)
    return model.eval(), tune


# ---------------------------------------------------------------------------------------------- our code
def build_ours(name, model_file, dictionary, lam):
    from fairseq_idpg.methods import METHODS
    from fairseq_idpg.models.build import build_method
    from fairseq_idpg.run import model_dims

    dims = {k.lstrip("-").replace("-", "_"): v for k, v in model_dims(str(model_file)).items()}
    model = build_method(METHODS[name], dictionary, backbone=str(model_file), inducer_lambda=lam, **dims)
    model.register_classification_head(HEAD, num_classes=2)
    return model.eval()


def name_map(ours, layers):
    """[(our name, their name)] of every trainable tensor present in ``ours`` (+ the head)."""
    pairs = []
    for i in range(layers):
        o, t = f"encoder.sentence_encoder.layers.{i}.", f"pretrained_model.roberta.encoder.layer.{i}."
        att = t + "attention.self."
        for ours_name, theirs_name in (
            ("self_attn.inducer.key_A", "ef_attn_adapter.prefix_v_pert_mlp.prefix_A"),
            ("self_attn.inducer.key_a", "ef_attn_adapter.prefix_v_pert_mlp.A_bias"),
            ("self_attn.inducer.key_B", "ef_attn_adapter.prefix_v_pert_mlp.prefix_B"),
            ("self_attn.inducer.key_b", "ef_attn_adapter.prefix_v_pert_mlp.B_bias"),
            ("self_attn.inducer.value_A", "ef_attn_adapter.prefix_v_mlp.prefix_A"),
            ("self_attn.inducer.value_a", "ef_attn_adapter.prefix_v_mlp.A_bias"),
            ("self_attn.inducer.value_B", "ef_attn_adapter.prefix_v_mlp.prefix_B"),
            ("self_attn.inducer.value_b", "ef_attn_adapter.prefix_v_mlp.B_bias"),
            ("self_attn.lora_q.A", "query.ef_lora_A"),
            ("self_attn.lora_q.B", "query.ef_lora_B"),
        ):
            pairs.append((o + ours_name, att + theirs_name))
        for part in ("down", "up"):
            for kind in ("weight", "bias"):
                pairs.append((f"{o}parallel_adapter.{part}.{kind}", f"{t}ef_ffn_adapter.{part}_proj.{kind}"))
    for part in ("dense", "out_proj"):
        for kind in ("weight", "bias"):
            pairs.append((f"classification_heads.{HEAD}.{part}.{kind}", f"pretrained_model.classifier.{part}.{kind}"))
    names = dict(ours.named_parameters())
    return [(a, b) for a, b in pairs if a in names]


def kind_of(name):
    """A tensor's name without its layer (for the initialisation table)."""
    return name.split(".layers.")[-1].split(".", 1)[-1] if ".layers." in name else name


# ---------------------------------------------------------------------------------------------- inputs
def batch(data_dir, dictionary, vocab, n):
    """``n`` SST-2 dev sentences as fairseq ids (``<s> S </s>``, padded with 1) and their labels."""
    import torch
    from fairseq.data.data_utils import collate_tokens

    from fairseq_idpg.encoders.wordpiece import WordpieceBPE

    dev = Path(data_dir) / "SST-2" / "dev.tsv"
    if not dev.is_file():
        raise CheckError(f"--data {data_dir}: no SST-2/dev.tsv there (the GLUE folder of ../shared/data)")
    with open(dev, encoding="utf-8", newline="") as f:
        rows = [r for _, r in zip(range(n), csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE), strict=False)]
    bpe = WordpieceBPE(types.SimpleNamespace(wordpiece_vocab=str(vocab), wordpiece_cased=False))
    tokens = [
        torch.cat([torch.tensor([0]), dictionary.encode_line(bpe.encode(r["sentence"]), add_if_not_exist=False)])
        for r in rows
    ]
    return collate_tokens([t.long() for t in tokens], pad_idx=1), torch.tensor([int(r["label"]) for r in rows])


def run_ours(model, tokens, labels):
    import torch.nn.functional as F

    model.zero_grad(set_to_none=True)
    logits, extra = model(tokens, features_only=False, return_all_hiddens=True, classification_head_name=HEAD)
    F.cross_entropy(logits.float(), labels).backward()
    hiddens = [h.transpose(0, 1) for h in extra["inner_states"]]  # [B, T, d]
    return logits.detach(), [h.detach() for h in hiddens]


def run_theirs(model, tokens, labels):
    import torch.nn.functional as F

    model.zero_grad(set_to_none=True)
    out = model(input_ids=tokens, attention_mask=tokens.ne(1).long(), output_hidden_states=True, return_dict=True)
    F.cross_entropy(out.logits.float(), labels).backward()
    return out.logits.detach(), [h.detach() for h in out.hidden_states]


# ---------------------------------------------------------------------------------------------- the check
def init_table(ours, theirs, pairs):
    """Per tensor kind: (ours std, ours max|x|, theirs std, theirs max|x|) of the fresh initialisations."""
    import torch

    o, t = dict(ours.named_parameters()), dict(theirs.named_parameters())
    table = {}
    for a, b in pairs:
        if "classification_heads" in a:
            continue
        table.setdefault(kind_of(a), ([], []))
        table[kind_of(a)][0].append(o[a].detach().flatten())
        table[kind_of(a)][1].append(t[b].detach().flatten())
    rows = []
    for kind, (xs, ys) in table.items():
        x, y = torch.cat(xs), torch.cat(ys)
        rows.append((kind, x.std().item(), x.abs().max().item(), y.std().item(), y.abs().max().item()))
    return rows


def trainable(params):
    """The names of the trained tensors among ``params`` (name -> Parameter)."""
    return {n for n, p in params.items() if p.requires_grad}


def report_parameters(o, t, pairs):
    """Both sides' trainable counts and the trained tensors the name map misses; a ``CheckError`` where a mapped
    pair's sizes differ."""
    ours_trained, theirs_trained = trainable(o), trainable(t)
    count = lambda names, params: sum(params[n].numel() for n in names)  # noqa: E731
    ours_head = {n for n in ours_trained if n.startswith("classification_heads.")}
    print(
        f"trainable parameters: ours {count(ours_trained - ours_head, o):,} + head {count(ours_head, o):,}; "
        f"theirs {count(theirs_trained, t):,} (requires_grad after PETLEncModel; head trained: "
        f"{any('classifier' in n for n in theirs_trained)})"
    )
    unmapped_ours = ours_trained - {a for a, _ in pairs}
    unmapped_theirs = theirs_trained - {b for _, b in pairs}
    if unmapped_ours or unmapped_theirs:
        print(f"UNMAPPED trainable tensors: ours {sorted(unmapped_ours)[:4]}, theirs {sorted(unmapped_theirs)[:4]}")
    for a, b in pairs:
        if o[a].numel() != t[b].numel():
            raise CheckError(f"{a} {tuple(o[a].shape)} vs their {b} {tuple(t[b].shape)}: different sizes")


def print_init_table(ours, theirs, pairs):
    print("initialisation (fresh draws, all layers):  tensor: ours std / max|x|  |  theirs std / max|x|")
    for kind, os_, om, ts, tm in init_table(ours, theirs, pairs):
        flag = "" if (os_ == ts == 0) or (min(os_, ts) > 0 and 0.8 < os_ / ts < 1.25) else "   <-- differs"
        print(f"  {kind:38s} {os_:.4g} / {om:.4g}  |  {ts:.4g} / {tm:.4g}{flag}")


def perturb_shared(o, t, pairs, seed, std):
    """Trained-like values: ours off its initialisation, the same values into theirs (the head too)."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for n in sorted(trainable(o)):
            o[n].add_(torch.randn_like(o[n]) * std)
        for a, b in pairs:
            t[b].copy_(o[a].reshape(t[b].shape))
    for b in (b for _, b in pairs):  # their head is frozen (no ef_): give it a gradient to compare, not to train
        t[b].requires_grad_(True)


def gradient_gaps(o, t, pairs):
    """Per tensor kind: [max|ours - theirs|, max|ours|] of the gradients, over the layers."""
    grads = {}
    for a, b in pairs:
        ga, gb = o[a].grad, t[b].grad
        entry = grads.setdefault(kind_of(a), [0.0, 0.0])
        entry[0] = max(entry[0], (ga.reshape(gb.shape) - gb).abs().max().item())
        entry[1] = max(entry[1], ga.abs().max().item())
    return grads


def compare_unpadded(ours, theirs, o, t, pairs, tokens, labels):
    """The exact comparison: no padding (each sentence cut to the shortest one's length, </s> kept)."""
    same = unpadded(tokens)
    logits_o, hid_o = run_ours(ours, same, labels)
    logits_t, hid_t = run_theirs(theirs, same, labels)
    print(f"outputs, {same.size(0)} SST-2 dev sentences cut to {same.size(1)} tokens (no padding):")
    for i, (x, y) in enumerate(zip(hid_o, hid_t, strict=False)):
        what = "embeddings" if i == 0 else f"layer {i}"
        print(f"  {what:10s} max|ours - theirs| {(x - y).abs().max().item():.2e}   (|h| <= {x.abs().max():.1f})")
    gap = (logits_o - logits_t).abs().max().item()
    print(f"  logits     max|ours - theirs| {gap:.2e}   (|logit| <= {logits_o.abs().max():.2f})")
    print("gradients of the cross-entropy (max over layers):  tensor: max|ours - theirs|  (max|grad|)")
    for kind, (gap, size) in gradient_gaps(o, t, pairs).items():
        print(f"  {kind:42s} {gap:.2e}  ({size:.2e})")


def compare_padded(name, args, dictionary, ours, o, theirs, tokens, labels):
    """The padded batch: the released lambda reads padded keys, whose hidden states are each implementation's
    own (fairseq zeroes padded embeddings, transformers does not); our default masks them out."""
    import torch

    masked = build_ours(name, args.model, dictionary, "masked")
    with torch.no_grad():
        for n, p in masked.named_parameters():
            if n in o:
                p.copy_(o[n])
    logits_u, _ = run_ours(ours, tokens, labels)
    logits_m, _ = run_ours(masked, tokens, labels)
    logits_t, _ = run_theirs(theirs, tokens, labels)
    gap = lambda x, y: f"{(x - y).abs().max().item():.2e}"  # noqa: E731
    print(
        f"padded batch (lengths {tokens.ne(1).sum(1).tolist()}), max|Δlogits|: ours unmasked vs theirs "
        f"{gap(logits_u, logits_t)}; ours masked (default) vs theirs {gap(logits_m, logits_t)}; "
        f"ours masked vs unmasked {gap(logits_m, logits_u)}"
    )


def check_preset(name, args, authors, state, dictionary, tokens, labels):
    import torch

    block, settings = PRESETS[name]
    from fairseq_idpg.interop.hf_backbone import model_cfg

    layers = model_cfg(state)["encoder_layers"]
    torch.manual_seed(args.seed)
    ours = build_ours(name, args.model, dictionary, "unmasked")
    theirs, _ = build_theirs(authors, state, settings, 2)
    pairs = name_map(ours, layers)
    o, t = dict(ours.named_parameters()), dict(theirs.named_parameters())
    print(f"\n== {name}  (ours: --blocks-preset {name}; theirs: run_glue.sh block '{block}')")
    report_parameters(o, t, pairs)
    print_init_table(ours, theirs, pairs)
    print("lambda at initialisation, per layer (mean, share > 0.99) on the batch below: " + lambda_stats(ours, tokens))
    perturb_shared(o, t, pairs, args.seed + 1, args.perturb)
    compare_unpadded(ours, theirs, o, t, pairs, tokens, labels)
    compare_padded(name, args, dictionary, ours, o, theirs, tokens, labels)


def lambda_stats(model, tokens):
    """Each layer's lambda (mean over heads and real query tokens; share above 0.99), dropout off."""
    import torch

    from fairseq_idpg.modules.attention.inducer import Inducer

    seen, gate = [], Inducer.gate

    def record(self, s, lse, dtype):
        lam = gate(self, s, lse, dtype)
        seen.append(lam.detach())
        return lam

    Inducer.gate = record
    try:
        with torch.no_grad():
            model(unpadded(tokens), features_only=True)
    finally:
        Inducer.gate = gate
    return ", ".join(f"{lam.mean().item():.2f}/{(lam > 0.99).float().mean().item():.0%}" for lam in seen)


def unpadded(tokens):
    """Each row cut to the shortest row's length, its last token made </s> (2): a batch without padding."""
    length = int(tokens.ne(1).sum(1).min())
    cut = tokens[:, :length].clone()
    cut[:, -1] = 2
    return cut


def lora_baseline_note(authors, state):
    """What their attn_mode=lora (the LoRA block of run_glue.sh) puts on W_q / W_v."""
    settings = dict(
        attn_mode="lora", attn_option="none", attn_composition="add", attn_bn=16, ffn_mode="lora", ffn_option="none",
        ffn_adapter_layernorm_option="none", ffn_adapter_init_option="bert", ffn_adapter_scalar="1", ffn_bn=16,
        lora_alpha=32, lora_dropout=0.1, lora_init="lora", unfreeze_params="ef_",
    )  # fmt: skip
    model, _ = build_theirs(authors, state, settings, 2)
    att = model.pretrained_model.roberta.encoder.layer[0].attention.self
    trained = [n for n, p in model.named_parameters() if p.requires_grad and ".layer.0." in n]
    print(
        f"\ntheir LoRA block (attn_mode=lora, ffn_mode=lora): layer 0 query is {type(att.query).__name__}, value is "
        f"{type(att.value).__name__}; trained in layer 0: {[n.split('.layer.0.')[1] for n in trained]}"
    )


def main(argv=None):
    from fairseq_idpg.errors import one_line_errors, refuse

    parser = one_line_errors(
        argparse.ArgumentParser(prog="inducer_authors_check.py", description=__doc__.split("\n\n")[0])
    )
    parser.add_argument("--kernel-adapters", required=True, metavar="DIR", help="an extracted kernel-adapters checkout")
    parser.add_argument(
        "--model", type=Path, default=DEFAULT_MODEL, help="fairseq RoBERTa checkpoint (default: the stand-in)"
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="GLUE folder holding SST-2/dev.tsv")
    parser.add_argument("--presets", default=",".join(PRESETS), help="comma-separated, from " + ", ".join(PRESETS))
    parser.add_argument("--sentences", type=int, default=4, help="batch size (SST-2 dev sentences; 4)")
    parser.add_argument("--perturb", type=float, default=0.05, help="std of the move off initialisation (0.05)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    args = parser.parse_args(argv)
    names = [p for p in args.presets.split(",") if p]
    if not names or set(names) - set(PRESETS):
        parser.error(f"--presets {args.presets!r}: choose from {', '.join(PRESETS)}")
    try:
        return check(args, names)
    except CheckError as e:
        return refuse(parser.prog, e)


def check(args, names):
    import torch
    from fairseq.data import Dictionary

    from fairseq_idpg.interop.hf_backbone import read_backbone_checkpoint

    torch.set_num_threads(args.threads)
    if not Path(args.kernel_adapters).is_dir():
        raise CheckError(f"--kernel-adapters {args.kernel_adapters}: not a folder")
    if not args.model.is_file():
        if args.model != DEFAULT_MODEL:
            raise CheckError(f"--model {args.model}: no such file")
        import subprocess

        from fairseq_idpg.run import standin_lock

        with standin_lock(DEFAULT_MODEL.parent):
            built = subprocess.run(["bash", str(REPO / "scripts" / "build_standin.sh"), str(DEFAULT_MODEL.parent)])
        if built.returncode or not args.model.is_file():
            raise CheckError(f"--model {args.model}: missing, and scripts/build_standin.sh could not build it")
    folder = args.model.parent
    if not (folder / "dict.txt").is_file():
        raise CheckError(f"--model {args.model}: no dict.txt beside it")
    authors = import_authors(args.kernel_adapters)
    state = read_backbone_checkpoint(str(args.model))
    dictionary = Dictionary.load(str(folder / "dict.txt"))
    dictionary.add_symbol("<mask>")  # as the sentence_prediction task does
    vocab = folder / "vocab.txt"
    if not vocab.is_file():
        raise CheckError(f"--model {args.model}: no vocab.txt beside it (a WordPiece backbone is expected)")
    tokens, labels = batch(args.data, dictionary, vocab, args.sentences)
    print(f"backbone {args.model}; their code {os.path.abspath(args.kernel_adapters)}; eval mode (no dropout)")
    for name in names:
        check_preset(name, args, authors, state, dictionary, tokens, labels)
    lora_baseline_note(authors, state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
