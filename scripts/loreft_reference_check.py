#!/usr/bin/env python3
"""Our LoReFT (fairseq_idpg/blocks/loreft.py) against pyreft's (stanfordnlp/pyreft, on the package index) on the
same frozen weights, the same trained values and the same batch: max |ours - theirs| of every layer's output hidden
states (after the intervention; real tokens), of the logits, of the loss, and of the gradients of R, W, b and the
classification head; both sides' trainable counts, and pyreft's at the paper's GLUE setting on roberta.large.

    pip install --no-deps --target /tmp/pyreft-site pyreft pyvene      # never into the shared environment
    PYTHONPATH=.:/tmp/pyreft-site python3 scripts/loreft_reference_check.py
    PYTHONPATH=.:/tmp/pyreft-site python3 scripts/loreft_reference_check.py --save-fixture tests/data/loreft_reference

Their side: transformers' ``RobertaForSequenceClassification`` holding our frozen weights
(``interop.hf_backbone.hf_roberta_weights``) and our head, wrapped by ``pyreft.get_reft_model`` with one
``LoreftIntervention`` per layer on the component ``roberta.encoder.layer[l].output`` (what pyreft's
examples/loreft/train.py intervenes on for RoBERTa) at the positions of each case (f1: [[0]] per row; f1+l1:
[[0, n - 1]], the last real token, weights shared as pyreft's ``--share_weights``). Their package imports
``datasets`` at its top for its trainers; this script loads pyreft's modules without its ``__init__`` (a bare
package object), nothing of it copied. Our R [r, d] is given to theirs as their ``rotate_layer`` weight R^T
[d, r] by assignment (torch's orthogonal parametrisation then completes R^T to its d x d ``base``); W and b as
their ``learned_source``. The gradient of R is compared on the matrix R itself (the two parametrisations of it
differ: blocks/loreft.py).

Both models in eval mode (no dropout; pyreft's Dropout on the intervened state is read from its code, not
measured here). ``--save-fixture DIR`` writes the tiny model's batch, our trained values and their outputs
(tests/data/loreft_reference/outputs.pt, with provenance.json), which tests/test_loreft_reference.py checks our
side against without pyreft.
"""

import argparse
import importlib.util
import json
import sys
import tempfile
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
FIXTURE = dict(layers=2, dim=16, heads=2, ffn=32, seed=0, lengths=(7, 5, 3), batch_seed=1, value_seed=2)
# case -> our options over the loreft record's: the record (r 1 at the first token) and r 2 at first + last
CASES = {
    "record": dict(loreft_rank=1, loreft_positions="f1"),
    "r2-f1+l1": dict(loreft_rank=2, loreft_positions="f1+l1"),
}
HEAD = "head"


def import_pyreft():
    """pyreft's modules without running its ``__init__`` (which imports ``datasets`` for its trainers)."""
    spec = importlib.util.find_spec("pyreft")
    if spec is None:
        raise SystemExit("loreft_reference_check.py: error: pyreft is not importable (see the module docstring)")
    package = types.ModuleType("pyreft")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules.setdefault("pyreft", package)
    import pyreft.config
    import pyreft.interventions
    import pyreft.utils

    return pyreft.config.ReftConfig, pyreft.interventions.LoreftIntervention, pyreft.utils.get_reft_model


def tiny_backbone(folder):
    from fairseq.data import Dictionary

    from fairseq_idpg.conversion.tiny import write_tiny_roberta

    f = FIXTURE
    write_tiny_roberta(folder, layers=f["layers"], dim=f["dim"], heads=f["heads"], ffn=f["ffn"], seed=f["seed"])
    dictionary = Dictionary.load(str(Path(folder) / "dict.txt"))
    dictionary.add_symbol("<mask>")  # as the task does
    dims = dict(
        encoder_layers=f["layers"], encoder_embed_dim=f["dim"], encoder_attention_heads=f["heads"],
        encoder_ffn_embed_dim=f["ffn"],
    )  # fmt: skip
    return Path(folder) / "model.pt", dictionary, dims


def backbone_sum(model_file):
    """Sum of squares of the tiny backbone's tensors (float64): the fixture's backbone is the one rebuilt."""
    state = torch.load(model_file, map_location="cpu", weights_only=False)["model"]
    return sum(float(v.double().pow(2).sum()) for v in state.values() if v.is_floating_point())


def make_batch(vocab, seed):
    """Tokens [B, T] (<s> ... </s>, right-padded with 1) and labels [B]."""
    g = torch.Generator().manual_seed(seed)
    lengths = FIXTURE["lengths"]
    tokens = torch.ones(len(lengths), max(lengths), dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.cat(
            [torch.tensor([0]), torch.randint(4, vocab, (n - 2,), generator=g), torch.tensor([2])]
        )
    return tokens, torch.randint(0, 2, (len(lengths),), generator=g)


def build_ours(backbone, case):
    from fairseq_idpg.methods import METHODS
    from fairseq_idpg.models.build import build_method

    model_file, dictionary, dims = backbone
    options = dict(CASES[case], backbone=str(model_file), dropout=0.0, attention_dropout=0.0, loreft_dropout=0.0)
    model = build_method(METHODS["loreft"], dictionary, **dims, **options)
    model.register_classification_head(HEAD, num_classes=2)
    return model.eval()


def set_values(model, seed):
    """Our trained tensors off their start: W, b, the head N(0, 0.3^2); R a random orthonormal [r, d]."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.encoder.sentence_encoder.layers:
            block = layer.loreft
            block.rotation.weight = torch.linalg.qr(torch.randn(block.R.shape[::-1], generator=g)).Q.T
            for p in block.source.parameters():
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
        for p in model.classification_heads[HEAD].parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))


def trained_values(model):
    """{name: value} of our trained tensors, R as the matrix (``...loreft.R``)."""
    values = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad and ".rotation." not in n}
    for i, layer in enumerate(model.encoder.sentence_encoder.layers):
        values[f"encoder.sentence_encoder.layers.{i}.loreft.R"] = layer.loreft.R.detach().clone()
    return values


def load_values(model, values):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in values:
                p.copy_(values[name])
        for i, layer in enumerate(model.encoder.sentence_encoder.layers):
            layer.loreft.rotation.weight = values[f"encoder.sentence_encoder.layers.{i}.loreft.R"]


def run_ours(model, tokens, labels):
    """{hidden/l, logits, loss, grad/<name>}: every layer's output (real tokens), the gradients of our trained
    tensors with R's on the matrix R (read under ``parametrize.cached``, the one R each forward uses)."""
    from torch.nn.utils import parametrize

    model.zero_grad()
    hidden = {}
    hooks = [
        layer.register_forward_hook(lambda m, i, o, l=l: hidden.__setitem__(l, o.transpose(0, 1)))
        for l, layer in enumerate(model.encoder.sentence_encoder.layers)
    ]
    with parametrize.cached():
        Rs = [layer.loreft.R for layer in model.encoder.sentence_encoder.layers]
        for R in Rs:
            R.retain_grad()
        logits = model(tokens, classification_head_name=HEAD)[0]
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        loss.backward()
    for hook in hooks:
        hook.remove()
    out = dict(logits=logits.detach(), loss=loss.detach())
    real = tokens.ne(1)
    out.update({f"hidden/{l}": h.detach()[real] for l, h in hidden.items()})
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and ".rotation." not in n}
    grads.update({f"encoder.sentence_encoder.layers.{i}.loreft.R": R.grad.clone() for i, R in enumerate(Rs)})
    out.update({f"grad/{n}": g for n, g in grads.items()})
    return out


def their_model(pyreft, backbone, ours, case):
    """pyreft's ReftModel over transformers' RoBERTa holding our frozen weights, head and LoReFT values."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    from fairseq_idpg.interop.hf_backbone import hf_roberta_config, hf_roberta_weights, model_cfg

    ReftConfig, LoreftIntervention, get_reft_model = pyreft
    state = torch.load(backbone[0], map_location="cpu", weights_only=False)
    weights, options = state["model"], model_cfg(state)
    vocab, positions = (
        weights[f"encoder.sentence_encoder.{n}.weight"].shape[0] for n in ("embed_tokens", "embed_positions")
    )
    config = RobertaConfig(**{**hf_roberta_config(options, vocab, positions), "num_labels": 2})
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    hf = RobertaForSequenceClassification(config)
    tensors = hf_roberta_weights(weights, options["encoder_layers"])
    head = ours.classification_heads[HEAD]
    for name in ("dense", "out_proj"):
        for kind in ("weight", "bias"):
            tensors[f"classifier.{name}.{kind}"] = getattr(getattr(head, name), kind).detach().clone()
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    assert not unexpected and all("position_ids" in m for m in missing), (missing, unexpected)
    rank, dim = CASES[case]["loreft_rank"], options["encoder_embed_dim"]
    representations = [
        dict(
            component=f"roberta.encoder.layer[{l}].output",
            low_rank_dimension=rank,
            intervention=LoreftIntervention(embed_dim=dim, low_rank_dimension=rank, dropout=0.0, dtype=torch.float32),
        )
        for l in range(options["encoder_layers"])
    ]
    reft = get_reft_model(hf, ReftConfig(representations=representations), set_device=False)
    for param in hf.classifier.parameters():  # pyreft's --allow_cls_grad
        param.requires_grad = True
    with torch.no_grad():
        for l, layer in enumerate(ours.encoder.sentence_encoder.layers):
            theirs = intervention(reft, l)
            theirs.rotate_layer.weight = layer.loreft.R.detach().T.clone()
            theirs.learned_source.weight.copy_(layer.loreft.source.weight)
            theirs.learned_source.bias.copy_(layer.loreft.source.bias)
    reft.model.eval()
    for value in reft.interventions.values():
        (value[0] if isinstance(value, (list, tuple)) else value).eval()
    return reft


def intervention(reft, layer):
    value = list(reft.interventions.values())[layer]  # in the order of the representations: one per layer
    return value[0] if isinstance(value, (list, tuple)) else value


def their_positions(tokens, case):
    first = [[0] for _ in tokens]
    if CASES[case]["loreft_positions"] == "f1":
        return first
    return [[0, int(n) - 1] for n in tokens.ne(1).sum(1)]


def run_theirs(reft, tokens, labels, case):
    """Their outputs in our names: hidden/l (real tokens), logits, loss, grad/<our name>."""
    from torch.nn.utils import parametrize

    reft.model.zero_grad()
    layers = reft.model.config.num_hidden_layers
    for l in range(layers):
        intervention(reft, l).zero_grad()
    base = dict(input_ids=tokens, attention_mask=tokens.ne(1).long(), output_hidden_states=True)
    locations = {"sources->base": (None, [their_positions(tokens, case)] * layers)}
    with parametrize.cached():
        Rts = [intervention(reft, l).rotate_layer.weight for l in range(layers)]
        for Rt in Rts:
            Rt.retain_grad()
        _, out = reft(base, unit_locations=locations)
        logits = out.logits
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        loss.backward()
    real = tokens.ne(1)
    result = dict(logits=logits.detach(), loss=loss.detach())
    result.update({f"hidden/{l}": out.hidden_states[l + 1].detach()[real] for l in range(layers)})
    head = reft.model.classifier
    for name in ("dense", "out_proj"):
        for kind in ("weight", "bias"):
            result[f"grad/classification_heads.{HEAD}.{name}.{kind}"] = getattr(getattr(head, name), kind).grad.clone()
    for l, Rt in enumerate(Rts):
        prefix = f"grad/encoder.sentence_encoder.layers.{l}.loreft"
        source = intervention(reft, l).learned_source
        result[f"{prefix}.R"] = Rt.grad.T.clone()
        result[f"{prefix}.source.weight"] = source.weight.grad.clone()
        result[f"{prefix}.source.bias"] = source.bias.grad.clone()
    return result


def their_count(reft):
    """Their trainable intervention parameters as pyreft counts them (``count_parameters(include_model=False)``)."""
    return int(reft.count_parameters(include_model=False))


def large_count(LoreftIntervention, layers=24, dim=1024, rank=1):
    """pyreft's trained parameters of the paper's GLUE setting at roberta.large: one intervention per layer."""
    one = LoreftIntervention(embed_dim=dim, low_rank_dimension=rank, dropout=0.0, dtype=torch.float32)
    return layers * sum(p.numel() for p in one.parameters() if p.requires_grad)


def differences(ours, theirs):
    """[(quantity, max |ours - theirs|, max |theirs|)] over their quantities; a missing one of ours fails."""
    rows = []
    for key, value in theirs.items():
        assert key in ours, f"ours has no {key}"
        rows.append((key, (ours[key].float() - value.float()).abs().max().item(), value.abs().max().item()))
    return rows


def check_case(pyreft, backbone, batch, case):
    ours = build_ours(backbone, case)
    set_values(ours, FIXTURE["value_seed"])
    theirs = their_model(pyreft, backbone, ours, case)
    ours_out, their_out = run_ours(ours, *batch), run_theirs(theirs, *batch, case)
    counts = (ours.num_trainable_parameters(), their_count(theirs))
    return ours, their_out, differences(ours_out, their_out), counts


def save_fixture(out_dir, cases):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(cases, out_dir / "outputs.pt")
    from importlib.metadata import version

    provenance = dict(
        reference=f"pyreft {version('pyreft')}, pyvene {version('pyvene')} (package index), transformers "
        f"{version('transformers')}, torch {torch.__version__}",
        config=FIXTURE, cases=CASES,
        command=f"PYTHONPATH=.:/tmp/pyreft-site python3 scripts/loreft_reference_check.py --save-fixture {out_dir}",
    )  # fmt: skip
    (out_dir / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--save-fixture", metavar="DIR", help="write their outputs on the tiny model here")
    args = parser.parse_args(argv)
    pyreft = import_pyreft()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        backbone = tiny_backbone(tmp)
        batch = make_batch(len(backbone[1]), FIXTURE["batch_seed"])
        fixture = dict(config=FIXTURE, backbone_sum=backbone_sum(backbone[0]), tokens=batch[0], labels=batch[1])
        worst = 0.0
        for case in CASES:
            ours, theirs, rows, (our_count, their_count_) = check_case(pyreft, backbone, batch, case)
            print(f"{case}: trainable ours {our_count:,}, pyreft's interventions {their_count_:,} (heads excluded)")
            for key, diff, scale in rows:
                print(f"  {key:60s} max |ours - pyreft| {diff:.2e}  (max |pyreft| {scale:.2e})")
                worst = max(worst, diff / max(scale, 1.0))
            fixture[case] = dict(values=trained_values(ours), outputs=theirs, their_count=their_count_)
        print(f"worst relative difference: {worst:.2e}")
        fixture["their_large_count"] = large_count(pyreft[1])
        print(f"pyreft's LoReFT r 1 on 24 layers of d 1024 (roberta.large): {fixture['their_large_count']:,} trained")
    if args.save_fixture:
        save_fixture(args.save_fixture, fixture)
        print(f"wrote {args.save_fixture}/outputs.pt")
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
