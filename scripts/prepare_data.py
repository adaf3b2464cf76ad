#!/usr/bin/env python3
"""Prepare one task for fairseq's sentence_prediction: read the raw files as distributed,
BPE-encode, binarize into OUT/input0, OUT/input1 (pairs), OUT/label and write OUT/task.json
(with its provenance: the raw folder, the sha256 of each raw file and BPE file, the sampling).

    python scripts/prepare_data.py SST-2 --raw data/glue/SST-2 --out data-bin/SST-2 \\
        --bpe gpt2 --bpe-dir data/roberta_bpe

See docs/data.md for the formats, label orders and split conventions.
"""

import argparse
import sys

try:  # importing fairseq takes seconds: Ctrl-C then is one line too
    from fairseq_idpg.errors import one_line_errors
    from fairseq_idpg.preprocessing import TASKS, PrepareError, prepare
except KeyboardInterrupt:
    print("interrupted: prepare_data.py before it began (nothing written); the same command starts it", file=sys.stderr)
    sys.exit(130)


def main(argv=None) -> int:
    parser = one_line_errors(argparse.ArgumentParser(prog="prepare_data.py", description=__doc__.split("\n\n")[0]))
    parser.add_argument("task", help="one of " + ", ".join(TASKS) + " (any case)")
    parser.add_argument("--raw", required=True, help="the task's folder as distributed (e.g. glue/SST-2, lmbff/cr)")
    parser.add_argument("--out", required=True, help="output folder (built aside, renamed into place at the end)")
    parser.add_argument("--bpe", choices=["gpt2", "wordpiece"], default="gpt2")
    parser.add_argument("--bpe-dir", help="--bpe gpt2: folder with encoder.json, vocab.bpe, dict.txt")
    parser.add_argument("--vocab", help="--bpe wordpiece: the model's vocab.txt")
    parser.add_argument(
        "--few-shot", type=int, metavar="K", help="K train examples + a 1,000-example dev set from train"
    )
    parser.add_argument("--dev-from-train", type=int, metavar="N", help="hold out N train examples as valid")
    parser.add_argument(
        "--split-dev",
        action="store_true",
        help="split each dev file in two: valid (floor(n/2), 1000 over 5000 rows; selects) and test (the rest, "
        "scored); train whole",
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of --few-shot / --dev-from-train / --split-dev (default 1)"
    )
    parser.add_argument("--workers", type=int, help="parallel processes (default: min(4, CPU count))")
    parser.add_argument("--strict-sizes", action="store_true", help="row counts other than the official: error")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out that holds prepared data")
    args = parser.parse_args(argv)
    try:
        prepare(
            args.task,
            args.raw,
            args.out,
            bpe=args.bpe,
            bpe_dir=args.bpe_dir,
            vocab=args.vocab,
            few_shot=args.few_shot,
            seed=args.seed,
            dev_from_train=args.dev_from_train,
            split_dev=args.split_dev,
            workers=args.workers,
            strict_sizes=args.strict_sizes,
            overwrite=args.overwrite,
        )
    except PrepareError as e:
        print(f"prepare_data.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # prepare said in one line what it keeps; SIGTERM exits with 143 the same way
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
