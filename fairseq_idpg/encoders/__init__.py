"""Tokenizers registered with fairseq's ``--bpe`` registry."""

from . import wordpiece  # noqa: F401
