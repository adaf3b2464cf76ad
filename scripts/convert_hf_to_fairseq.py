#!/usr/bin/env python3
"""Convert a Hugging Face BERT/RoBERTa checkpoint folder into a fairseq RoBERTa model folder.

    python scripts/convert_hf_to_fairseq.py HF_DIR OUT_DIR [--max-positions N] [--verify]

Writes OUT_DIR/model.pt (fairseq 0.12.2 checkpoint), dict.txt and the tokenizer files; --verify
compares the result with transformers on GLUE dev sentences. The logic is in fairseq_idpg/conversion/
(cli.py parses these arguments, weights.py holds the mapping decisions); docs/standin.md explains them.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # uninstalled checkout

from fairseq_idpg.conversion.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
