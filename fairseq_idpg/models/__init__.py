"""Registered fairseq models and architectures; each module registers itself on import, so a new
model file adds its name to the import line below."""

from . import build, frozen_roberta, prompted_roberta, roberta_blocks, roberta_idpg, roberta_prompt, stock_roberta  # noqa: F401
