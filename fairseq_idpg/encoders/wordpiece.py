"""WordPiece tokenization for BERT-derived encoders converted to fairseq RoBERTa format.

The offline stand-in for roberta.large (all-MiniLM-L6-v2, see
``scripts/convert_hf_to_fairseq.py``) is a BERT: its inputs are WordPiece tokens, not
GPT-2 BPE. This module does for it what ``multiprocessing_bpe_encoder`` + ``dict.txt`` do
for RoBERTa:

- ``WordpieceBPE`` (``--bpe wordpiece --wordpiece-vocab FILE``) turns text into
  space-separated WordPiece tokens, using the ``tokenizers`` library;
- ``build_dictionary`` maps the BERT vocabulary onto a fairseq ``Dictionary`` with
  fairseq's specials: ``[CLS] -> <s>``, ``[PAD] -> <pad>``, ``[SEP] -> </s>``,
  ``[UNK] -> <unk>`` (``[MASK]`` becomes the ``<mask>`` that RoBERTa appends); every
  other vocabulary entry follows in vocabulary order. ``vocab_to_dictionary_order``
  gives, for each fairseq index, the BERT row it comes from (used to permute the
  embedding matrix when converting weights).

Lower-casing follows ``tokenizer_config.json`` next to the vocabulary when present
(``do_lower_case``); otherwise the vocabulary is taken as uncased unless
``--wordpiece-cased`` is given.
"""

import json
import os
from dataclasses import dataclass, field
from typing import List, Optional

from fairseq.data import Dictionary
from fairseq.data.encoders import register_bpe
from fairseq.dataclass import FairseqDataclass

from fairseq_idpg.errors import ConfigError, MissingFile

BERT_TO_FAIRSEQ_SPECIALS = {"[CLS]": "<s>", "[PAD]": "<pad>", "[SEP]": "</s>", "[UNK]": "<unk>"}
MASK = "[MASK]"


def read_vocab(vocab_file: str) -> List[str]:
    if not os.path.isfile(vocab_file):
        raise MissingFile(f"--wordpiece-vocab: {vocab_file} not found (expected a BERT vocab.txt, one token a line)")
    with open(vocab_file, encoding="utf-8") as f:
        tokens = [line.rstrip("\n") for line in f]
    missing = [t for t in BERT_TO_FAIRSEQ_SPECIALS if t not in tokens]
    if missing:
        raise ConfigError(f"{vocab_file}: not a BERT WordPiece vocabulary, missing {', '.join(missing)}")
    return tokens


def vocab_is_lowercase(vocab_file: str, default: bool = True) -> bool:
    config = os.path.join(os.path.dirname(os.path.abspath(vocab_file)), "tokenizer_config.json")
    if os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            return bool(json.load(f).get("do_lower_case", default))
    return default


def vocab_to_dictionary_order(vocab_file: str) -> List[int]:
    """BERT vocabulary row for each fairseq dictionary index (``<mask>`` last)."""
    tokens = read_vocab(vocab_file)
    row = {t: i for i, t in enumerate(tokens)}
    order = [row[bert] for bert in ("[CLS]", "[PAD]", "[SEP]", "[UNK]")]
    specials = set(BERT_TO_FAIRSEQ_SPECIALS) | {MASK}
    order += [i for i, t in enumerate(tokens) if t not in specials and t.strip() and t == t.split()[0]]
    if MASK in row:
        order.append(row[MASK])
    return order


def build_dictionary(vocab_file: str) -> Dictionary:
    """fairseq ``Dictionary`` for a WordPiece vocabulary (without ``<mask>``, as dict.txt)."""
    tokens = read_vocab(vocab_file)
    d = Dictionary()  # <s> <pad> </s> <unk>
    for i in vocab_to_dictionary_order(vocab_file)[4:]:
        if tokens[i] != MASK:
            d.add_symbol(tokens[i], n=1)
    return d


def write_dict_txt(vocab_file: str, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        build_dictionary(vocab_file).save(f)


@dataclass
class WordpieceBPEConfig(FairseqDataclass):
    wordpiece_vocab: Optional[str] = field(
        default=None, metadata={"help": "path to the BERT vocab.txt (WordPiece vocabulary)"}
    )
    wordpiece_cased: bool = field(
        default=False,
        metadata={"help": "do not lower-case (default: tokenizer_config.json next to the vocab, else uncased)"},
    )


@register_bpe("wordpiece", dataclass=WordpieceBPEConfig)
class WordpieceBPE(object):
    def __init__(self, cfg):
        from tokenizers import BertWordPieceTokenizer

        if not cfg.wordpiece_vocab:
            raise ConfigError("--bpe wordpiece needs --wordpiece-vocab (the model's vocab.txt)")
        read_vocab(cfg.wordpiece_vocab)
        lowercase = False if cfg.wordpiece_cased else vocab_is_lowercase(cfg.wordpiece_vocab)
        self.tokenizer = BertWordPieceTokenizer(
            cfg.wordpiece_vocab, lowercase=lowercase, strip_accents=lowercase, clean_text=True
        )

    def encode(self, x: str) -> str:
        return " ".join(self.tokenizer.encode(x, add_special_tokens=False).tokens)

    def encode_batch(self, lines: List[str]) -> List[str]:
        """Many lines at once (the Rust tokenizer runs them in parallel threads)."""
        encoded = self.tokenizer.encode_batch(lines, add_special_tokens=False)
        return [" ".join(e.tokens) for e in encoded]

    def decode(self, x: str) -> str:
        return " ".join(x.split()).replace(" ##", "")

    def is_beginning_of_word(self, x: str) -> bool:
        return not x.startswith("##")
