"""GloVe sentence encoder: the light M(x) of M-IDPG-PHM-GloVe (IDPG section 4.5.1, Eq. 5).

    M(x) = (1/k) sum_{j=1..k} GloVe(t_j)                                  [d_in] (300 for glove.6B.300d)

over the k words t_j of the input x that GloVe knows. As in the authors' code, the words are the
input's text (token ids decoded back by ``Detokenizer``) split on white space, each stripped of
punctuation characters and lower-cased; words GloVe does not have are left out of the mean.

**Decision:** an input with no known word gets the zero vector (the authors' code draws a fresh
N(0, 0.6^2) vector each time, which makes M(x) random and impossible to precompute).

The file is the standard GloVe text format (one word per line, then its ``dim`` numbers separated
by spaces: ``glove.6B.300d.txt`` from ``scripts/download.sh glove``). Only the vectors of words that
the inputs contain are read, in one pass over the file per call that meets new words, so the
1 GB file never sits in memory. The model precomputes the sentence vectors once per example
(``SentenceRepresentationCache``, filled when a split is loaded); ``encode_tokens`` is the
text-processing step (a loop over examples, like BPE encoding), never part of a training step.
"""

import string

import numpy as np

from fairseq_idpg.data.digest import file_sha256
from fairseq_idpg.errors import ConfigError, MissingFile

_STRIP = str.maketrans("", "", string.punctuation)


def sentence_words(text):
    """The words of Eq. 5: white-space split, punctuation removed, lower-cased, empty ones dropped."""
    words = (w.translate(_STRIP).lower() for w in text.split())
    return [w for w in words if w]


def read_glove_dim(path):
    """Vector size of a GloVe text file (from its first line); a clear error if it is not one."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.readline().rstrip("\n").split(" ")
    except OSError as e:
        raise MissingFile(f"--idpg-glove-vectors {path}: cannot read it ({e.strerror})") from None
    try:
        values = [float(v) for v in first[1:]]
    except ValueError:
        values = []
    if len(first) < 2 or not values:
        raise ConfigError(f"--idpg-glove-vectors {path}: not a GloVe text file (line 1 is not 'word v1 v2 ...')")
    return len(values)


class GloveSentenceEncoder:
    """Eq. 5 over a GloVe text file. ``encode_texts(texts)`` -> float32 [N, dim]."""

    def __init__(self, path, detokenizer=None):
        self.path = str(path)
        self.dim = read_glove_dim(self.path)
        self.detokenizer = detokenizer
        self._vectors = {}  # word -> float32 [dim], or None when the file does not have it

    def _load(self, words):
        wanted = {w for w in words if w not in self._vectors}
        if not wanted:
            return
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.rstrip("\n").split(" ")
                word = " ".join(parts[: -self.dim])  # words may hold spaces in some GloVe files
                if word in wanted:
                    self._vectors[word] = np.asarray(parts[-self.dim :], dtype=np.float32)
        for w in wanted:
            self._vectors.setdefault(w, None)

    def encode_texts(self, texts):
        per_text = [sentence_words(t) for t in texts]
        self._load({w for words in per_text for w in words})
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, words in enumerate(per_text):
            found = [self._vectors[w] for w in words if self._vectors[w] is not None]
            if found:
                out[i] = np.mean(found, axis=0)
        return out

    def encode_tokens(self, rows):
        """Sentence vectors of token-id rows (``<s>``, ``</s>`` and padding are ignored)."""
        if self.detokenizer is None:
            raise RuntimeError("GloveSentenceEncoder was built without a detokenizer: use encode_texts")
        return self.encode_texts([self.detokenizer.decode(r) for r in rows])

    def digest(self):
        """sha256 of the file (the cache key of the sentence vectors), computed once."""
        return file_sha256(self.path)
