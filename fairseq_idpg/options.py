"""The one option system: an option is a dataclass field (``option(...)``) and its flag, default and checks
come from it; plus a flag's spelling, flag checks and filling options from a preset (config as data). A
leaf module, below ``models``, ``blocks`` and ``run_config``: it imports nothing of the project but ``errors``.

A set of options is a dataclass whose fields are made with ``option`` and that mixes in ``Options``:

    @dataclass
    class IdpgOptions(Options):
        title: ClassVar[str] = "IDPG: instance-dependent prompt generation"   # its flag group

        idpg_hidden: int = option(16, "generator hidden size m", metavar="M", check=">= 1")
        idpg_sharing: str = option("M", "S, M or L", choices=SHARINGS, type=str.upper)
        idpg_residual: bool = option(False, "IDPG A.5.1 ablation: add M(x) to each prompt")

    IdpgOptions.add_args(parser)       # --idpg-hidden M (int), --idpg-sharing {S,M,L}, --idpg-residual (a switch)
    IdpgOptions.defaults()             # {"idpg_hidden": 16, "idpg_sharing": "M", "idpg_residual": False}
    IdpgOptions.check_args(args)       # the declared checks: one line naming the flag (ConfigError)

Each field generates its flag (``idpg_hidden`` -> ``--idpg-hidden``): ``bool`` is a switch, ``int`` and
``float`` the flag's type (or ``type=``), with the field's ``choices`` (a registry object stays live: argparse
reads it when it parses) and ``metavar``. argparse leaves every flag None, so that a preset fills what the
command line did not give. ``check`` is ``">= 0"``, ``"> 0"`` (any of ``>= > <= <`` and a number) or a
callable that returns what is wrong with a value (None when it is fine); a field with ``choices`` is
checked against them. Checks that read several options stay code (the model's ``check_args``).

A model family declares its presets (``{preset name: {option: value}}``) and the value of each
option no preset sets (``defaults``); argparse leaves every option it was not given at None.
``resolve_preset`` fills those from the preset named on the command line, then from the
defaults, so explicit flags always win:

    resolve_preset(args, PRESETS, "idpg_preset", IdpgOptions.defaults(), default="m-idpg-phm")

It is idempotent: fairseq calls the architecture function at parse time, and ``build_model``
calls it again for models built from a plain namespace or a stored config.

The blocks of ``roberta_blocks`` (``blocks/``: ``size=True``, a rank where 0 turns the block off) and
run.sh's flags (``run_config.py``: ``group``, ``excludes``, ``shown``, ``config``, ``fairseq``, real defaults
and its own parser) declare their fields with the same ``option``.
"""

import dataclasses
import functools
import operator
import re
import typing
from typing import Any, ClassVar, Dict

from fairseq_idpg.errors import ConfigError

POSITIVE, NON_NEGATIVE = "> 0", ">= 0"
_COMPARISONS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
_CHECK = re.compile(r"(>=|>|<=|<) (-?\d+(?:\.\d*)?)$")


def option(
    default=None, help="", group=None, *, metavar=None, choices=None, check=None, type=None, size=False,
    derived=False, late=False, excludes=None, shown=False, config=False, fairseq=False,
):  # fmt: skip
    """An option as a dataclass field: its default (the value when neither the command line nor a preset
    gives one; ``dataclasses.MISSING``: run.sh's positional argument), its flag's ``help``, ``group`` (its
    group in --help; None: the set's own), ``metavar``, ``choices``, ``type`` (argparse's; default: the
    field's ``int`` or ``float``) and ``check`` (the module docstring). ``derived``: the model computes it when
    it is unset, so no default fills it (``--dpt-probe-rank``). ``late``: added to a block after runs were named,
    so a record's settings hold it only where it differs from its default (the runs keep their folders).

    The blocks' ``size``: a rank or size where 0 turns the block off (>= 0; >= 1 when the method's settings
    give it >= 1). run.sh's (``run_config.py``): ``excludes`` (the other field, why), ``shown`` (always written
    by ``argv()``), ``config`` (part of the run's configuration; not for a fairseq-train flag) and ``fairseq`` (a
    fairseq-train flag of the same name, read from ``extra_args``, where it stays as given)."""
    if size and check is None:
        check = NON_NEGATIVE
    if isinstance(check, str) and not _CHECK.match(check):
        raise ValueError(f"option check {check!r}: use '>= N', '> N', '<= N', '< N' or a callable")
    meta = dict(option=True, help=help, group=group, metavar=metavar, choices=choices, check=check, type=type,
                size=size, derived=derived, late=late, excludes=excludes, shown=shown, config=config,
                fairseq=fairseq)  # fmt: skip
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@functools.cache
def option_fields(cls):
    """[(field, type)] of the ``option`` fields of dataclass ``cls`` (``Optional[X]`` -> X), resolved once per
    class: a sweep asks RunConfig's for each of its thousands of runs (the type hints alone took 5 of the
    14 s of table1's dry run). None for a class that is no dataclass (``Options`` itself)."""
    if not dataclasses.is_dataclass(cls):
        return ()
    hints = typing.get_type_hints(cls)
    return tuple(
        (f, next((a for a in typing.get_args(hints[f.name]) if a is not type(None)), hints[f.name]))
        for f in dataclasses.fields(cls)
        if f.metadata.get("option")
    )


def argument(f, kind, default=None):
    """argparse's keywords for the flag of option field ``f`` of type ``kind``: ``bool`` a switch, ``int`` and
    ``float`` the flag's type (unless the field names one), the field's choices (read when argparse parses:
    a registry stays live), metavar and help."""
    meta = f.metadata
    if kind is bool:
        return dict(action="store_true", default=default, help=meta["help"])
    kwargs = dict(
        type=meta["type"] or (kind if kind in (int, float) else None),
        default=default,
        metavar=meta["metavar"],
        choices=meta["choices"],
        help=meta["help"],
    )
    return {k: v for k, v in kwargs.items() if v is not None}


def check_value(dest, value, check, error=ConfigError):
    """``error`` with one line naming the flag of ``dest`` when ``value`` fails ``check`` (``">= 0"``, ...,
    or a callable that returns what is wrong, None when nothing is)."""
    if check is None:
        return
    if callable(check):
        problem = check(value)
    else:
        comparison, bound = _CHECK.match(check).groups()
        ok = value is not None and _COMPARISONS[comparison](value, float(bound))
        problem = None if ok else f"must be {check}, got {value}"
    if problem:
        raise error(f"{flag(dest)} {problem}")


def check_option(f, value):
    """The checks option field ``f`` declares: its choices, then its ``check`` (ConfigError, one line)."""
    if f.metadata["choices"] is not None:
        _check_choice(f.name, value, f.metadata["choices"])
    check_value(f.name, value, f.metadata["check"])


class Options:
    """A dataclass of ``option`` fields (see the module docstring): its flags, defaults and checks."""

    title: ClassVar[str] = ""  # the flag group of the fields without a ``group`` of their own

    @classmethod
    def options(cls):
        """[(field, type)] of the fields made with ``option``."""
        return option_fields(cls)

    @classmethod
    def add_args(cls, parser, group=None):
        """One flag per field, argparse default None (a preset fills what the command line did not give):
        in ``group`` (default: a new group titled ``cls.title``), or in a group of the field's own title."""
        groups = {None: group}
        for f, kind in cls.options():
            title = f.metadata["group"]
            if groups.get(title) is None:
                groups[title] = parser.add_argument_group(title or cls.title)
            groups[title].add_argument(flag(f.name), **argument(f, kind))

    @classmethod
    def defaults(cls) -> Dict[str, Any]:
        """{option: default} of the options a preset or the defaults fill (not the ``derived`` ones)."""
        return {f.name: f.default for f, _ in cls.options() if not f.metadata["derived"]}

    @classmethod
    def from_args(cls, args):
        return cls(**{f.name: getattr(args, f.name) for f, _ in cls.options()})

    @classmethod
    def check_args(cls, args):
        """The checks the fields declare, of the values on ``args`` (a namespace or an instance)."""
        for f, _ in cls.options():
            check_option(f, getattr(args, f.name))


def flag(dest):
    """The command-line spelling of an option: ``idpg_phm_n`` -> ``--idpg-phm-n``."""
    return "--" + dest.replace("_", "-")


def resolve_preset(args, presets, preset_dest, defaults, default=None):
    """Fill every option of ``defaults`` left unset (None) on ``args`` from the preset named by
    ``args.<preset_dest>`` (``default`` when unset), then from ``defaults``; returns the preset."""
    _unlock(args)
    name = getattr(args, preset_dest, None)
    if name is None:
        name = default
        setattr(args, preset_dest, name)
    if name is not None and name not in presets:
        raise ConfigError(f"{flag(preset_dest)} must be one of {', '.join(presets)}, got {name!r}")
    preset = presets.get(name, {})
    for key in (*defaults, *(k for k in preset if k not in defaults)):
        if getattr(args, key, None) is None:
            setattr(args, key, preset.get(key, defaults.get(key)))
    return preset


def check_choice(args, dest, valid):
    """One line naming the flag and what would be valid."""
    _check_choice(dest, getattr(args, dest), valid)


def _check_choice(dest, value, valid):
    if value not in valid:
        raise ConfigError(f"{flag(dest)} must be one of {', '.join(map(str, valid))}, got {value!r}")


def check_at_least(args, dest, minimum, why=""):
    value = getattr(args, dest)
    if value is None or value < minimum:
        raise ConfigError(f"{flag(dest)} must be >= {minimum}{why and ' (' + why + ')'}, got {value}")


def _unlock(args):
    """A stored config (omegaconf, struct mode) refuses new keys; a namespace takes them."""
    try:
        from omegaconf import OmegaConf
    except ImportError:  # pragma: no cover
        return
    if OmegaConf.is_config(args):
        OmegaConf.set_struct(args, False)
