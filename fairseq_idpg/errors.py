"""The one exception type for a user's mistake: ``ConfigError`` (defined beside the fairseq fixes, in
``fairseq_idpg_compat``, whose fix 10 reports it).

A configuration or input that cannot be right (a flag's value, a file that is missing or not what
the flag names) raises ``ConfigError`` with one line naming the flag or file and what was expected.
Entry points turn it, and only it, into ``PROG: error: MESSAGE`` with exit status 2: fairseq-train and
fairseq-validate (compat fix 10), prepare_data.py (``PrepareError`` is one) and scripts/run.sh (which
passes on the one line of the command it ran); the hub (``RobertaModel.from_pretrained``) raises it as
it is. Any other exception is a bug and keeps its traceback.

``option_checks()`` marks where a model or task is built from options: a ValueError or
FileNotFoundError that fairseq_idpg's own code raises there (a ``raise`` in this package, not one from
torch or fairseq) is a check of those options and becomes a ConfigError.
"""

import contextlib
import os

from fairseq_idpg_compat import ConfigError

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
__all__ = ["ConfigError", "BackboneNotFound", "BackboneMismatch", "option_checks"]


class BackboneNotFound(ConfigError, FileNotFoundError):
    """``--backbone`` names no file (a FileNotFoundError too, as before)."""


class BackboneMismatch(ConfigError, RuntimeError):
    """A trained checkpoint does not fit the backbone given (a RuntimeError too, as before)."""


def _raised_by_package(error):
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PACKAGE)


@contextlib.contextmanager
def option_checks():
    """ValueError / FileNotFoundError raised by this package's checks inside -> ConfigError (one line)."""
    try:
        yield
    except ConfigError:
        raise
    except (ValueError, FileNotFoundError) as e:
        if not _raised_by_package(e):
            raise
        raise ConfigError(str(e)) from None
