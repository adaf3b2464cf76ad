"""The one exception type for a user's mistake: ``ConfigError`` (defined beside the fairseq fixes, in
``fairseq_idpg_compat``, whose fix 10 reports it), a ValueError.

A configuration or input that cannot be right (a flag's value, a file that is missing or not what
the flag names) raises ``ConfigError`` with one line naming the flag or file and what was expected.
Each entry point's own kind is a subclass, so that a caller catches them all as ``ConfigError``:

- ``PrepareError``: prepare_data.py (``preprocessing/formats.py``);
- ``RunError`` (below): scripts/run.sh (``fairseq_idpg/run/``), which also passes on the one line of a command it ran;
- ``SweepError``: scripts/sweep.sh (``sweep.py``);
- ``RecordsError``, ``PublishedError``: the results command (``results/records.py``, ``results/published.py``);
- ``ConversionError``: the checkpoint converter (``conversion/errors.py``);
- ``BackboneNotFound``, ``BackboneMismatch`` (below): ``--backbone`` at build and load time;
- ``MissingFile`` (below): a file the options need is absent (a dry run of run.sh lists it).

Entry points turn them, and only them, into ``PROG: error: MESSAGE`` with exit status 2: fairseq-train and
fairseq-validate (compat fix 10) and each command above (run.sh: 130 when it was interrupted); the hub
(``RobertaModel.from_pretrained``) raises them as they are. Any other exception is a bug and keeps its
traceback (a converted model that does not reproduce its source, ``VerificationError``, is not a
mistake in the input: the converter says so and exits 1).

``option_checks()`` marks where a model or task is built from options: a ValueError or
FileNotFoundError that fairseq_idpg's own code raises there (a ``raise`` in this package, not one from
torch or fairseq) is a check of those options and becomes a ConfigError.
"""

import contextlib
import os
import sys

from fairseq_idpg_compat import ConfigError

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
__all__ = [
    "ConfigError", "RunError", "MissingFile", "BackboneNotFound", "BackboneMismatch", "option_checks",
    "one_line_errors", "refuse",
]  # fmt: skip


class RunError(ConfigError):
    """A bad request to scripts/run.sh, reported as one line before anything runs (``run.sh: error: ...``, exit 2)."""


class MissingFile(ConfigError, FileNotFoundError):
    """A file the options need is not there (a FileNotFoundError too): a dry run lists it rather than refusing."""


class BackboneNotFound(MissingFile):
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


def refuse(prog, message):
    """Say ``PROG: error: MESSAGE`` in one line on stderr; returns the exit status, 2."""
    print(f"{prog}: error: " + " ".join(str(message).split()), file=sys.stderr, flush=True)
    return 2


def one_line_errors(parser):
    """``parser`` (argparse) says a bad argument as ``PROG: error: MESSAGE`` alone, in one line, exit status 2:
    argparse's own ``error`` prints the usage first."""
    parser.error = lambda message: sys.exit(refuse(parser.prog, message))
    return parser
