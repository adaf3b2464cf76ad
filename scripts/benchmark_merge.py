#!/usr/bin/env python3
"""Inference speed of a LoRA run against its merged plain roberta (scripts/merge_lora.py), in one process:
the ratio of their median forward times on the same batch (docs/benchmarks.md, "Merged LoRA").

    python3 scripts/benchmark_merge.py checkpoints/standin/SST-2/lora/lr2e-4.seed1.0123abcd --batch 16 --tokens 128

Without RUN_FOLDER (``--demo``) it builds the lora record on the offline stand-in (all-MiniLM-L6-v2 converted,
not RoBERTa) with its tensors moved off their initialisation: the speed does not depend on their values.
Timings alternate between the two models (ABAB...), so that a busy machine slows both alike.
"""

import argparse
import statistics
import sys
import time

from fairseq_idpg.errors import ConfigError, one_line_errors, refuse


def demo_run(backbone):
    """A TrainedRun of the lora record on ``backbone`` with random LoRA and head tensors."""
    import torch

    from fairseq_idpg.interop.hf_backbone import model_cfg, read_backbone_checkpoint
    from fairseq_idpg.interop.trained import TrainedRun, build_from_options
    from fairseq_idpg.methods import METHODS

    sizes = model_cfg(read_backbone_checkpoint(backbone))
    sizes = {k: v for k, v in sizes.items() if k.startswith("encoder_") or k == "max_positions"}
    torch.manual_seed(0)
    model = build_from_options({"arch": "roberta_blocks", **METHODS["lora"].options, **sizes}, backbone)
    model.register_classification_head("sentence_classification_head", num_classes=2)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    return TrainedRun(model.eval(), "sentence_classification_head", {}, dict(vars(model.args)), backbone)


def plain_roberta(run):
    """The merged model as fairseq's stock RobertaModel (what the merged checkpoint loads as)."""
    from fairseq_idpg.interop.merge import merged_model
    from fairseq_idpg.interop.trained import sized_dictionary

    options = {k: v for k, v in run.options.items() if k not in ("backbone", "save_trainable_only")}
    weights = merged_model(run)
    from fairseq_idpg.models.build import build_model

    rows = weights["encoder.sentence_encoder.embed_tokens.weight"].shape[0]
    options.pop("arch", None), options.pop("_name", None)
    model = build_model("roberta", sized_dictionary(rows), **options)
    classes, inner = weights[f"classification_heads.{run.head}.out_proj.weight"].shape
    model.register_classification_head(run.head, num_classes=classes, inner_dim=inner)
    model.load_state_dict(weights, strict=True)
    return model.eval()


def median_times(models, tokens, head, repeats):
    import torch

    times = [[] for _ in models]
    with torch.no_grad():
        for model in models:  # warm-up
            model(tokens, classification_head_name=head)
        for _ in range(repeats):
            for i, model in enumerate(models):
                start = time.perf_counter()
                model(tokens, classification_head_name=head)
                times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main(argv=None):
    parser = one_line_errors(argparse.ArgumentParser(prog="benchmark_merge.py", description=__doc__.split("\n\n")[0]))
    parser.add_argument("run", metavar="RUN_FOLDER", nargs="?", help="a LoRA run folder or checkpoint")
    parser.add_argument("--demo", metavar="BACKBONE", help="no run: the lora record on this backbone (model.pt)")
    parser.add_argument("--batch", type=int, default=16, metavar="B")
    parser.add_argument("--tokens", type=int, default=128, metavar="T")
    parser.add_argument("--repeats", type=int, default=20, metavar="N")
    parser.add_argument("--threads", type=int, default=1, metavar="N", help="torch threads (1)")
    args = parser.parse_args(argv)
    if (args.run is None) == (args.demo is None):
        parser.error("give RUN_FOLDER or --demo BACKBONE")
    import copy

    import torch

    torch.set_num_threads(args.threads)
    try:
        from fairseq_idpg.interop.trained import load_trained

        run = load_trained(args.run) if args.run else demo_run(args.demo)
        unmerged = copy.deepcopy(run.model)
        merged = plain_roberta(run)
    except ConfigError as e:
        return refuse(parser.prog, e)
    vocab = merged.encoder.sentence_encoder.embed_tokens.num_embeddings
    tokens = torch.randint(4, vocab - 1, (args.batch, args.tokens), generator=torch.Generator().manual_seed(0))
    tokens[:, 0], tokens[:, -1] = 0, 2
    with torch.no_grad():
        gap = (
            unmerged(tokens, classification_head_name=run.head)[0]
            - merged(tokens, classification_head_name=run.head)[0]
        )
    t_unmerged, t_merged = median_times([unmerged, merged], tokens, run.head, args.repeats)
    print(f"batch {args.batch} x {args.tokens} tokens, {args.threads} thread(s), median of {args.repeats}:")
    print(f"  LoRA (unmerged, roberta_blocks): {1000 * t_unmerged:.1f} ms")
    print(f"  merged (plain roberta):          {1000 * t_merged:.1f} ms")
    print(f"  speed-up {t_unmerged / t_merged:.2f}x; max |logit difference| {gap.abs().max():.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
