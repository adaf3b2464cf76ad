"""Tasks of fairseq-idpg; each module registers itself with fairseq on import, so a new task file
adds its name to the import line below."""

from . import (  # noqa: F401
    efl_sentence_prediction,
    idpg_sentence_prediction,
    model_protocol,
    peft_sentence_prediction,
)
