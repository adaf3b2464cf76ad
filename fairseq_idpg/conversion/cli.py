"""Command line of ``scripts/convert_hf_to_fairseq.py``:

    python scripts/convert_hf_to_fairseq.py HF_DIR OUT_DIR [--max-positions N] [--verify]
        [--glue-dir DIR] [--min-cosine 0.9999]

Prints the conversion summary as one JSON line. Exit status 2 for an input problem (one line on
stderr, nothing written), 1 for a failed ``--verify`` (the folder is written), 0 otherwise.
"""

import argparse
import json
import logging
import sys
from typing import Optional, Sequence

from .convert import convert
from .errors import ConversionError, VerificationError
from .verify import verify


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="convert_hf_to_fairseq.py",
        description="Convert a Hugging Face BERT/RoBERTa checkpoint folder into a fairseq RoBERTa "
        "model folder (model.pt, dict.txt and tokenizer files).",
    )
    parser.add_argument("hf_dir", help="folder with config.json, model.safetensors or pytorch_model.bin, vocabulary")
    parser.add_argument("out_dir", help="folder to write (created; our files in it are replaced)")
    parser.add_argument(
        "--max-positions", type=int, default=None,
        help="fairseq --max-positions (default: all the checkpoint has, 512 for BERT/RoBERTa)",
    )  # fmt: skip
    parser.add_argument("--verify", action="store_true", help="compare with transformers on GLUE dev sentences")
    parser.add_argument(
        "--glue-dir",
        default=None,
        help="GLUE folder for --verify (default: where the main job looks: $GLUE_DIR, the checkout's data/glue)",
    )
    parser.add_argument("--min-cosine", type=float, default=0.9999, help="--verify threshold (default 0.9999)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, stream=sys.stderr
    )
    prog = parser.prog
    if args.verify:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print(f"{prog}: error: --verify needs the transformers package (pip install transformers)", file=sys.stderr)
            return 2
    try:
        summary = convert(args.hf_dir, args.out_dir, args.max_positions)
    except ConversionError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if args.verify:
        try:
            result = verify(args.hf_dir, summary["out_dir"], min_cosine=args.min_cosine, glue_dir=args.glue_dir)
        except VerificationError as e:
            print(f"{prog}: verification failed: {e}", file=sys.stderr)
            return 1
        summary["verify"] = result
    print(json.dumps(summary))
    return 0
