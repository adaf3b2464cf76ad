#!/usr/bin/env python3
"""Fold a trained LoRA (DoRA, PiSSA) or VeRA (and BitFit's biases) into the frozen weights: a plain fairseq
``roberta`` checkpoint that fairseq-validate and the hub score the same, with no LoRA matrices left to multiply.
docs/using.md.

    python3 scripts/merge_lora.py checkpoints/standin/SST-2/lora/lr2e-4.seed1.0123abcd merged/model.pt
"""

import argparse
import os
import sys

from fairseq_idpg.errors import ConfigError, one_line_errors, refuse


def main(argv=None):
    parser = one_line_errors(argparse.ArgumentParser(prog="merge_lora.py", description=__doc__.split("\n\n")[0]))
    parser.add_argument("run", metavar="RUN_FOLDER", help="a run folder (its checkpoint_best.pt) or a checkpoint")
    parser.add_argument("out", metavar="OUT", help="the checkpoint to write (its folder must exist)")
    parser.add_argument("--backbone", metavar="PATH", help="where the run's backbone is now (default: as recorded)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace OUT if it exists (never a file this reads), atomically"
    )
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        parser.error(f"{args.out}: its folder does not exist")
    try:
        from fairseq_idpg.files import check_output_file
        from fairseq_idpg.interop.merge import merged_checkpoint
        from fairseq_idpg.interop.trained import checkpoint_file, load_trained

        checkpoint = checkpoint_file(args.run)
        check_output_file(args.out, [checkpoint, args.backbone], args.overwrite)  # before anything is read
        run = load_trained(args.run, args.backbone)
        check_output_file(args.out, [checkpoint, run.backbone], args.overwrite)
        values = merged_checkpoint(run, args.out)
    except ConfigError as e:
        return refuse(parser.prog, e)
    print(f"wrote {args.out}: a plain roberta checkpoint, {values:,} values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
