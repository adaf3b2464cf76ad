#!/usr/bin/env python3
"""Export the trained prompt of a ``roberta_prompt`` checkpoint as one l x d matrix (DPT section 3.2:
"after the training is completed, we can store the product of A and B for inference").

    python scripts/export_dpt_prompt.py checkpoints/standin/RTE/dpt/<run>/checkpoint_best.pt \
        [--out OUT.pt] [--matrix P.pt] [--check]

The exported checkpoint is the same model in its plain prompt-tuning configuration
(``--prompt-matrix full``): P = A B (DPT), U ReLU(diag(s)) V (rank probe) or P + LN(MLP(P))
(residual prompt) is evaluated once and stored as ``prompt.weight`` [l, d]; a deep checkpoint
becomes one matrix per layer, [L, l, d] (the P-tuning v2 configuration: preset
``deep-prompt-tuning-100`` for l = 100). The head, the backbone (or its fingerprint, for compact checkpoints)
and the cfg are kept, so fairseq-validate and ``from_pretrained`` on the export give the same
logits. The optimizer state is dropped (its tensors belong to the factors).

``--matrix`` also writes P alone (``torch.save``); ``--check`` loads both checkpoints with
fairseq and prints the largest logit difference on random inputs (needs the task data folder
and the backbone named in the checkpoint).
"""

import argparse
import copy
import os
import sys

import torch

from fairseq_idpg.errors import ConfigError, one_line_errors, refuse
from fairseq_idpg.files import check_output_file, read_checkpoint, save_torch

PREFIX = "prompt."


def _model_args(state):
    cfg = state.get("cfg") or {}
    args = cfg.get("model") if isinstance(cfg, dict) else getattr(cfg, "model", None)
    return args if args is not None else state.get("args")


def export_state(state):
    """(exported checkpoint state, P) for a loaded ``roberta_prompt`` checkpoint ``state`` (not modified)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_idpg  # noqa: F401  (registers roberta_prompt)
    from fairseq_idpg.models.roberta_prompt import RobertaPromptModel, build_prompt, full_preset

    args = _model_args(state)
    arch = getattr(args, "arch", None)
    if ARCH_MODEL_REGISTRY.get(arch) is not RobertaPromptModel:
        raise ValueError(f"not a roberta_prompt checkpoint (--arch {arch}); nothing to export")
    weights = state["model"]
    factors = {k[len(PREFIX) :]: v for k, v in weights.items() if k.startswith(PREFIX)}
    module = build_prompt(args, args.encoder_embed_dim, args.encoder_layers)
    module.load_state_dict(factors, strict=True)
    dtype = next(iter(factors.values())).dtype
    with torch.no_grad():
        P = module.float().eval()().to(dtype)  # the product in fp32, stored in the checkpoint's dtype

    exported = copy.copy(state)
    exported["model"] = type(weights)((k, v) for k, v in weights.items() if not k.startswith(PREFIX))
    exported["model"][PREFIX + "weight"] = P
    new_args = copy.deepcopy(args)
    new_args.prompt_matrix = "full"
    new_args.prompt_preset = full_preset(args.prompt_length, args.prompt_deep)
    if isinstance(state.get("cfg"), dict) and state["cfg"].get("model") is not None:
        exported["cfg"] = dict(state["cfg"], model=new_args)
    else:
        exported["args"] = new_args
    exported.pop("last_optimizer_state", None)
    return exported, P


def max_logit_difference(original, exported, batch=8, length=32, seed=0):
    """Largest |logit difference| between two checkpoints on random token batches (eval mode)."""
    from fairseq import checkpoint_utils

    models = []
    for path in (original, exported):
        (model,), _, _ = checkpoint_utils.load_model_ensemble_and_task([path])
        models.append(model.eval())
    head = next(iter(models[0].classification_heads))
    dictionary = models[0].encoder.sentence_encoder.dictionary
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(dictionary.nspecial, len(dictionary), (batch, length - 2), generator=g)
    bos, eos = torch.full((batch, 1), dictionary.bos()), torch.full((batch, 1), dictionary.eos())
    tokens = torch.cat([bos, body, eos], dim=1)
    with torch.no_grad():
        a, b = (m(tokens, classification_head_name=head)[0].float() for m in models)
    return (a - b).abs().max().item(), a.abs().max().item()


def read_and_check(args, out):
    """The checkpoint (one line when damaged or not a checkpoint), after checking where the outputs go."""
    if not os.path.isfile(args.checkpoint):
        raise ConfigError(f"{args.checkpoint}: no such file")
    check_output_file(out, [args.checkpoint], args.overwrite)
    if args.matrix:
        if os.path.abspath(args.matrix) == os.path.abspath(out):
            raise ConfigError(f"--matrix {args.matrix}: the file --out writes; give another file")
        check_output_file(args.matrix, [args.checkpoint], args.overwrite)
    state = read_checkpoint(args.checkpoint, "a roberta_prompt checkpoint written by fairseq-train")
    backbone = getattr(_model_args(state), "backbone", None)
    for path in filter(None, (out, args.matrix)):
        check_output_file(path, [args.checkpoint, backbone], args.overwrite)
    return state


def main(argv=None):
    parser = one_line_errors(argparse.ArgumentParser(prog="export_dpt_prompt.py", description=__doc__.split("\n\n")[0]))
    parser.add_argument("checkpoint", help="a roberta_prompt checkpoint (checkpoint_best.pt)")
    parser.add_argument("--out", help="exported checkpoint (default: <checkpoint>_exported.pt beside it)")
    parser.add_argument("--matrix", help="also write P alone here (torch.save of the [l, d] / [L, l, d] tensor)")
    parser.add_argument("--check", action="store_true", help="compare the logits of both checkpoints on random inputs")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace --out / --matrix if they exist (never the checkpoint read)"
    )
    args = parser.parse_args(argv)

    out = args.out or os.path.splitext(args.checkpoint)[0] + "_exported.pt"
    try:
        state = read_and_check(args, out)
        exported, P = export_state(state)
    except ConfigError as e:
        return refuse(parser.prog, e)
    except ValueError as e:
        return refuse(parser.prog, f"{args.checkpoint}: {e}")
    source = _model_args(state).prompt_matrix
    save_torch(exported, out)
    print(f"{args.checkpoint}: {source} prompt -> P {list(P.shape)} ({P.numel():,} values, {P.dtype}) in {out}")
    if args.matrix:
        save_torch(P, args.matrix)
        print(f"P written to {args.matrix}")
    if args.check:
        diff, scale = max_logit_difference(args.checkpoint, out)
        print(f"largest |logit difference| on random inputs: {diff:.3g} (largest |logit| {scale:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
