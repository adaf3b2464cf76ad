"""Token ids back to text, for the GloVe sentence encoder (IDPG Eq. 5 works on words).

The authors' code decodes each input with the model's BPE (``bpe.decode(dictionary.string(x))``)
and splits the text on white space. The same here, from the fairseq dictionary alone:

- RoBERTa (GPT-2 BPE) dictionaries hold GPT-2 token ids as symbols: the ids are mapped back to
  bytes with GPT-2's ``encoder.json``, found in the first of the folders given (the model: its
  ``--idpg-glove-bpe-dir``, else where the checkout keeps GPT-2's BPE, ``fairseq_idpg.layout``).
- WordPiece dictionaries (the offline stand-in, ``--bpe wordpiece``) hold the pieces: pieces
  are joined with spaces and the ``##`` continuations glued back.

``<s>`` and padding are dropped; each ``</s>``-separated segment (the two sentences of a pair)
is decoded on its own and the segments are joined by a space.
"""

import json
from pathlib import Path

from fairseq_idpg.errors import MissingFile


def is_gpt2_dictionary(dictionary, sample=1000):
    """True when the symbols after the specials are (mostly) integers: GPT-2 BPE ids."""
    symbols = dictionary.symbols[dictionary.nspecial : dictionary.nspecial + sample]
    return bool(symbols) and sum(s.isdigit() for s in symbols) >= 0.9 * len(symbols)


def find_encoder_json(bpe_dirs):
    """encoder.json of the first folder of ``bpe_dirs`` that has one."""
    for d in map(Path, bpe_dirs):
        if (d / "encoder.json").is_file():
            return d / "encoder.json"
    where = " or ".join(str(d) for d in bpe_dirs)
    raise MissingFile(
        f"--idpg-glove-bpe-dir: GPT-2 encoder.json not found in {where} (needed to turn RoBERTa "
        f"token ids back into words for GloVe; scripts/download.sh bpe fetches it)"
    )


class Detokenizer:
    """``decode(ids)`` -> text for one example's token ids (a list or 1-D tensor)."""

    def __init__(self, dictionary, bpe_dirs=()):
        self.dictionary = dictionary
        self.skip = {dictionary.bos(), dictionary.pad()}
        self.eos = dictionary.eos()
        self.gpt2 = is_gpt2_dictionary(dictionary)
        if self.gpt2:
            from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

            with open(find_encoder_json(bpe_dirs), encoding="utf-8") as f:
                by_id = {v: k for k, v in json.load(f).items()}
            byte_of = {c: b for b, c in bytes_to_unicode().items()}
            # per dictionary index: the bytes it stands for (symbols that are not ids: none)
            self.piece = [
                bytes(byte_of[c] for c in by_id[int(s)]) if s.isdigit() and int(s) in by_id else b""
                for s in dictionary.symbols
            ]

    def _segment(self, ids):
        if self.gpt2:
            return b"".join(self.piece[i] for i in ids).decode("utf-8", errors="replace").strip()
        return " ".join(self.dictionary[i] for i in ids).replace(" ##", "")

    def decode(self, ids):
        ids = [int(i) for i in ids if int(i) not in self.skip]
        segments, current = [], []
        for i in ids + [self.eos]:
            if i == self.eos:
                if current:
                    segments.append(self._segment(current))
                current = []
            else:
                current.append(i)
        return " ".join(segments)
