"""The device script's backbone: a random RoBERTa of the asked shape whose dictionary has RoBERTa's size, written
from nothing but this repository (a GPU machine may have no network and no GPT-2 BPE files).

Its vocabulary is a WordPiece ``vocab.txt`` (the format the stand-in uses, so the hub and the serving part can
tokenize English): BERT's five specials, the words and characters of the serving sentences, and filler pieces up
to ``ROBERTA_WORDS``. fairseq's dictionary of it then has RoBERTa's 50,265 rows once the task adds ``<mask>``
(``encoders.wordpiece.build_dictionary``): speed and memory depend on the dictionary's size, not its words.
"""

import string
from pathlib import Path

from fairseq_idpg.hub.timing import SENTENCES

ROBERTA_WORDS = 50260  # the lines of RoBERTa's dict.txt: + <s> <pad> </s> <unk> + <mask> = 50,265 embedding rows
ROBERTA_ROWS = ROBERTA_WORDS + 5
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def write_vocab(path, words=ROBERTA_WORDS):
    """A WordPiece vocab.txt of ``SPECIALS`` and ``words`` other pieces; returns ``path``."""
    known = [w for s in SENTENCES for w in s.split()]
    characters = list(string.ascii_lowercase + string.digits + string.punctuation)
    pieces = list(dict.fromkeys([*known, *characters, *("##" + c for c in string.ascii_lowercase)]))
    pieces += [f"w{i}" for i in range(words - len(pieces))]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([*SPECIALS, *pieces[:words]]) + "\n", encoding="utf-8")
    return path


def write_backbone(folder, shape):
    """``folder``/model (model.pt, dict.txt, vocab.txt) of a random RoBERTa at ``shape`` (``launches.Shape``), written
    once, where ``launches.train_folders`` finds it; returns that folder."""
    from fairseq_idpg.conversion.tiny import write_tiny_roberta

    model = Path(folder) / "model"
    if not (model / "model.pt").exists():
        vocab = write_vocab(Path(folder) / "vocab.txt")
        sizes = dict(layers=shape.layers, dim=shape.dim, heads=shape.heads, ffn=shape.ffn)
        write_tiny_roberta(model, **sizes, vocab_file=vocab)
    return model
