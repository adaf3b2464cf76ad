"""The one exception type for a user's mistake, ``ConfigError`` (a ValueError), and the command-line helpers
every entry point shares. A leaf: it imports nothing of the project, and the fairseq fixes
(``fairseq_idpg_compat``, fix 10) import it when they report one.

A configuration or input that cannot be right (a flag's value, a file that is missing or not what
the flag names) raises ``ConfigError`` with one line naming the flag or file and what was expected.
Each entry point's own kind is a subclass, so that a caller catches them all as ``ConfigError``:

- ``PrepareError``: prepare_data.py (``preprocessing/formats.py``);
- ``RunError`` (below): scripts/run.sh (``fairseq_idpg/run/``), which also passes on the one line of a command it ran;
- ``SweepError`` (below): scripts/sweep.sh (``sweep.py``, ``sweep_estimate.py``);
- ``RecordsError``, ``PublishedError``: the results command (``results/records.py``, ``results/published.py``);
- ``ConversionError``: the checkpoint converter (``conversion/errors.py``);
- ``BackboneNotFound``, ``BackboneMismatch`` (below): ``--backbone`` at build and load time;
- ``MissingFile`` (below): a file the options need is absent (a dry run of run.sh lists it).

Entry points turn them, and only them, into ``PROG: error: MESSAGE`` with exit status 2 (``refuse``):
fairseq-train and fairseq-validate (compat fix 10) and each command above (run.sh: 130 when it was
interrupted); the hub (``RobertaModel.from_pretrained``) raises them as they are. Any other exception is a
bug and keeps its traceback (a converted model that does not reproduce its source, ``VerificationError``,
is not a mistake in the input: the converter says so and exits 1).

Checks raise these explicitly; nothing is converted after the fact, so an exception of any other type
(a ValueError of torch's own checks, a bug in the build code) keeps its traceback.
"""

import sys

__all__ = [
    "ConfigError", "RunError", "SweepError", "MissingFile", "BackboneNotFound", "BackboneMismatch",
    "one_line_errors", "refuse", "argparse_error", "has_flag", "flag_value",
]  # fmt: skip


class ConfigError(ValueError):
    """A configuration or input that cannot be right; entry points say it in one line, exit status 2."""


class RunError(ConfigError):
    """A bad request to scripts/run.sh, reported as one line before anything runs (``run.sh: error: ...``, exit 2)."""


class Interrupted(RunError):
    """The command was stopped (Ctrl-C, SIGTERM) where it was: exit status 130, and the same command resumes."""


class SweepError(ConfigError):
    """A bad sweep specification or request, reported as one line before anything runs."""


class MissingFile(ConfigError, FileNotFoundError):
    """A file the options need is not there (a FileNotFoundError too): a dry run lists it rather than refusing."""


class BackboneNotFound(MissingFile):
    """``--backbone`` names no file (a FileNotFoundError too, as before)."""


class BackboneMismatch(ConfigError, RuntimeError):
    """A trained checkpoint does not fit the backbone given (a RuntimeError too, as before)."""


def argparse_error(message):
    """An ``argparse`` parser's ``error`` that raises a ConfigError (said by the caller in one line) instead of
    printing the usage and exiting."""
    raise ConfigError(message)


def refuse(prog, message):
    """Say ``PROG: error: MESSAGE`` in one line on stderr; returns the exit status, 2."""
    print(f"{prog}: error: " + " ".join(str(message).split()), file=sys.stderr, flush=True)
    return 2


def one_line_errors(parser):
    """``parser`` (argparse) says a bad argument as ``PROG: error: MESSAGE`` alone, in one line, exit status 2:
    argparse's own ``error`` prints the usage first."""
    parser.error = lambda message: sys.exit(refuse(parser.prog, message))
    return parser


# ---------------------------------------------------------------- command lines
def has_flag(argv, flag):
    """Whether ``flag`` is in a command line (``--flag``, ``--flag VALUE`` or ``--flag=VALUE``)."""
    return any(arg == flag or arg.startswith(flag + "=") for arg in argv)


def flag_value(argv, flag):
    """The value given to ``flag`` in a command line (the last one, as argparse reads it), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


class NotExpressible(ConfigError):
    """An interchange format (PEFT, AdapterHub) cannot hold this method exactly (why: the message)."""


def listed(names, shown=3):
    """The first ``shown`` of ``names`` and how many more (for one-line messages)."""
    more = f" (and {len(names) - shown} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
