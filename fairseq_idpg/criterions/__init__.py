"""Criterions of fairseq-idpg; each module registers itself with fairseq on import, so a new
criterion file adds its name to the import line below."""

from . import sentence_prediction_metrics  # noqa: F401
