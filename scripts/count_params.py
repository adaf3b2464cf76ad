#!/usr/bin/env python3
"""Print the papers' parameter-count tables next to ours, counted from the real modules.

    python scripts/count_params.py [--only SUBSTRING]

Exit status 1 if any count that the paper states exactly differs from ours.
"""

import argparse
import logging
import sys

import fairseq_idpg  # noqa: F401  (registers the models)
from fairseq_idpg.counts import TABLES


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="print only tables whose title contains this")
    args = parser.parse_args(argv)
    # every model built logs its parameters (models/frozen_roberta.py); the tables say them here
    logging.getLogger("fairseq_idpg.models.frozen_roberta").setLevel(logging.WARNING)
    wrong = 0
    for title, rows_fn in TABLES:
        if args.only and args.only.lower() not in title.lower():
            continue
        print(f"\n{title}\n" + "-" * len(title))
        print(f"{'method':<34}{'ours':>14}{'paper':>14}")
        for method, ours, paper in rows_fn():
            exact = isinstance(paper, int)
            mark = "" if not exact else ("  ok" if ours == paper else "  MISMATCH")
            wrong += exact and ours != paper
            shown = f"{paper:,}" if exact else str(paper)
            print(f"{method:<34}{ours:>14,}{shown:>14}{mark}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
