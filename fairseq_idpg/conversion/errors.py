"""The two ways a conversion fails: a bad input (``ConversionError``) or a converted model that does
not reproduce its source (``VerificationError``). The CLI turns each into one line on stderr."""

from fairseq_idpg.errors import ConfigError


class ConversionError(ConfigError):
    """An input problem: one line naming the file and what was expected."""


class VerificationError(Exception):
    """The converted model does not reproduce the Hugging Face model."""
