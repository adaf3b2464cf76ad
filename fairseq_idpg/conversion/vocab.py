"""Vocabularies: the fairseq dictionary and tokenizer files made from a Hugging Face vocabulary.

- BERT: ``vocab.txt`` -> ``dict.txt`` by ``fairseq_idpg.encoders.wordpiece`` (``[CLS] [PAD] [SEP]
  [UNK]`` -> ``<s> <pad> </s> <unk>``, ``[MASK]`` -> ``<mask>`` last), with ``vocab.txt`` (+
  ``tokenizer_config.json``) copied for ``--bpe wordpiece``;
- RoBERTa: ``vocab.json`` + ``merges.txt`` -> ``dict.txt`` naming each HF id by its GPT-2 BPE id, and
  GPT-2's ``encoder.json`` + ``vocab.bpe`` rebuilt from the merges for ``--bpe gpt2``.

docs/standin.md ("Vocabulary", "HF RoBERTa vocabulary") explains both.
"""

import json
import os
from typing import Dict, List, Tuple

from ..files import atomic_copy, atomic_path
from .errors import ConversionError

ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")


# ---------------------------------------------------------------- GPT-2 byte-level BPE (RoBERTa)
def read_merges(merges_file: str) -> List[Tuple[str, str]]:
    """The merges of a byte-level BPE ``merges.txt`` / ``vocab.bpe`` (``#version`` header optional)."""
    merges = []
    with open(merges_file, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#version"):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise ConversionError(f"{merges_file}: expected 'a b' merge lines, got {line!r}")
            merges.append((parts[0], parts[1]))
    return merges


def gpt2_vocab_bpe_text(merges: List[Tuple[str, str]]) -> str:
    """``vocab.bpe`` as fairseq's GPT-2 BPE reads it: it drops the first and the last line."""
    return "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)


def gpt2_encoder_from_merges(merges: List[Tuple[str, str]]) -> Dict[str, int]:
    """GPT-2's ``encoder.json`` rebuilt from its merges: the 256 byte symbols in
    ``bytes_to_unicode`` order, one token per merge in merge order, then ``<|endoftext|>``.
    (Checked to equal fairseq's downloaded ``encoder.json`` exactly.)"""
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    tokens = list(bytes_to_unicode().values()) + [a + b for a, b in merges] + ["<|endoftext|>"]
    encoder = {}
    for i, t in enumerate(tokens):
        encoder.setdefault(t, i)
    return encoder


def gpt2_bpe_args(encoder_json: str, vocab_bpe: str) -> List[str]:
    """fairseq options selecting the GPT-2 BPE with these ``encoder.json`` / ``vocab.bpe`` files."""
    return [
        "--bpe", "gpt2",
        "--gpt2-encoder-json", os.path.abspath(encoder_json),
        "--gpt2-vocab-bpe", os.path.abspath(vocab_bpe),
    ]  # fmt: skip


def roberta_dictionary_symbols(
    vocab_json: str, merges: List[Tuple[str, str]], vocab_size: int
) -> Tuple[List[str], Dict[str, int]]:
    """fairseq ``dict.txt`` symbols (indices 4 .. vocab_size-2) for a HF RoBERTa vocabulary.

    HF RoBERTa ids are fairseq dictionary indices (``<s> <pad> </s> <unk>`` = 0..3, ``<mask>``
    last); fairseq's ``dict.txt`` names each index by the token's GPT-2 BPE id. Ids the HF
    vocabulary does not name become ``madeupwordNNNN`` (as in RoBERTa's own dict.txt)."""
    try:
        with open(vocab_json, encoding="utf-8") as f:
            vocab = json.load(f)
    except (OSError, ValueError) as e:
        raise ConversionError(f"{vocab_json}: expected a JSON token -> id map ({e})") from None
    for i, special in enumerate(ROBERTA_SPECIALS):
        if vocab.get(special) != i:
            raise ConversionError(
                f"{vocab_json}: expected {special} at id {i} (fairseq's dictionary order), got {vocab.get(special)!r}"
            )
    if vocab.get("<mask>") != vocab_size - 1:
        raise ConversionError(
            f"{vocab_json}: expected <mask> at id {vocab_size - 1} (the last row, vocab_size - 1), "
            f"got {vocab.get('<mask>')!r}"
        )
    encoder = gpt2_encoder_from_merges(merges)
    by_id = {}
    for token, i in vocab.items():
        if 4 <= i < vocab_size - 1:
            by_id[i] = token
    symbols, madeup = [], 0
    for i in range(4, vocab_size - 1):
        token = by_id.get(i)
        if token is None:
            symbols.append(f"madeupword{madeup:04d}")
            madeup += 1
        elif token in encoder:
            symbols.append(str(encoder[token]))
        else:
            symbols.append(token)
    seen = set()
    for s in symbols:
        if s in seen or not s.strip() or s != s.split()[0]:
            raise ConversionError(f"{vocab_json}: token {s!r} cannot be a fairseq dict.txt symbol (duplicate or blank)")
        seen.add(s)
    return symbols, encoder


# ---------------------------------------------------------------- WordPiece (BERT)
def wordpiece_dictionary_order(vocab_file: str) -> List[int]:
    """The BERT vocabulary id of each fairseq dictionary index (``<mask>`` last), for permuting the
    embedding rows; the vocabulary must have a ``[MASK]`` token."""
    from fairseq_idpg.encoders.wordpiece import MASK, read_vocab, vocab_to_dictionary_order

    try:
        has_mask = MASK in read_vocab(vocab_file)
        order = vocab_to_dictionary_order(vocab_file)
    except (ValueError, OSError) as e:
        raise ConversionError(str(e)) from None
    if not has_mask:
        raise ConversionError(f"{vocab_file}: expected a {MASK} token (it becomes fairseq's <mask>)")
    return order


def wordpiece_bpe_args(vocab_file: str) -> List[str]:
    return ["--bpe", "wordpiece", "--wordpiece-vocab", os.path.abspath(vocab_file)]


def write_wordpiece_vocab(vocab_file: str, out_dir: str) -> None:
    """Copy ``vocab.txt`` (+ ``tokenizer_config.json`` next to it) into ``out_dir``."""
    atomic_copy(vocab_file, os.path.join(out_dir, "vocab.txt"))
    config = os.path.join(os.path.dirname(os.path.abspath(vocab_file)), "tokenizer_config.json")
    if os.path.isfile(config):
        atomic_copy(config, os.path.join(out_dir, "tokenizer_config.json"))


def write_wordpiece_dict(vocab_file: str, path: str) -> None:
    from fairseq_idpg.encoders.wordpiece import write_dict_txt

    with atomic_path(path) as tmp:
        write_dict_txt(vocab_file, tmp)
