#!/usr/bin/env python3
"""Write an offline stand-in for glove.6B.300d.txt, for M-IDPG-PHM-GloVe runs on machines that
cannot download GloVe. It is NOT GloVe:

    python examples/idpg/standin_glove.py [--model models/minilm-l6-fairseq] \
        [--out models/glove-standin/glove.standin.300d.txt]

Static word vectors, in the GloVe text format: the input embeddings of the stand-in encoder
(all-MiniLM-L6-v2 converted, docs/standin.md) for every whole-word, alphabetic entry of its
WordPiece vocabulary (no ``##`` pieces, no specials), centred and projected on their 300 main
principal directions (GloVe's 300 dimensions, so the preset keeps n = 4 and d_in = 300). Like
GloVe, they are context-free word vectors; unlike GloVe, they come from the backbone's own
embedding table. Real runs use glove.6B.300d.txt (``scripts/download.sh glove``).
"""

import argparse
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", default=str(REPO / "models" / "minilm-l6-fairseq"), help="fairseq folder with model.pt and dict.txt"
    )
    p.add_argument("--out", default=str(REPO / "models" / "glove-standin" / "glove.standin.300d.txt"))
    p.add_argument("--dim", type=int, default=300)
    opts = p.parse_args(argv)
    from fairseq.data import Dictionary

    dictionary = Dictionary.load(os.path.join(opts.model, "dict.txt"))
    state = torch.load(os.path.join(opts.model, "model.pt"), map_location="cpu", weights_only=False)["model"]
    table = state["encoder.sentence_encoder.embed_tokens.weight"].float()
    rows = [i for i, w in enumerate(dictionary.symbols) if i >= dictionary.nspecial and w.isalpha() and w.isascii()]
    vectors = table[rows] - table[rows].mean(dim=0)
    _, _, v = torch.linalg.svd(vectors, full_matrices=False)
    projected = vectors @ v[: opts.dim].T
    os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
    tmp = opts.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for i, vec in zip(rows, projected.tolist(), strict=False):
            f.write(dictionary[i] + " " + " ".join(f"{x:.5f}" for x in vec) + "\n")
    os.replace(tmp, opts.out)
    print(f"wrote {len(rows):,} stand-in word vectors of {opts.dim} dims to {opts.out} (not GloVe; see --help)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
