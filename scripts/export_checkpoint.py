#!/usr/bin/env python3
"""Write a trained checkpoint in the form to share or deploy: the trained tensors in their stored
form (prefix tuning: the 2 L l d prefixes instead of the MLP), the backbone fingerprint and the
config; no optimizer state. docs/using.md.

    python scripts/export_checkpoint.py checkpoints/.../checkpoint_best.pt shared/model.pt
"""

import argparse
import os
import sys

from fairseq_idpg.errors import ConfigError, one_line_errors, refuse
from fairseq_idpg.models.frozen_roberta import export_checkpoint


def main(argv=None):
    parser = one_line_errors(argparse.ArgumentParser(prog="export_checkpoint.py", description=__doc__.split("\n\n")[0]))
    parser.add_argument("checkpoint", help="a checkpoint written by fairseq-train (checkpoint_best.pt)")
    parser.add_argument("out", help="the file to write (its folder must exist)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace OUT if it exists (never a file this reads), atomically"
    )
    args = parser.parse_args(argv)
    if not os.path.isfile(args.checkpoint):
        parser.error(f"{args.checkpoint}: no such file")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        parser.error(f"{args.out}: its folder does not exist")
    try:
        from fairseq_idpg.files import check_output_file

        check_output_file(args.out, [args.checkpoint], args.overwrite)
        values = export_checkpoint(args.checkpoint, args.out)
    except ConfigError as e:
        return refuse(parser.prog, e)
    print(f"wrote {args.out}: {values:,} trained values")
    return 0


if __name__ == "__main__":
    sys.exit(main())
