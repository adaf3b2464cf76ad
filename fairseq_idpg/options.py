"""Option helpers shared by the model families and the blocks: a flag's spelling, flag checks and
filling options from a preset (config as data). A leaf module, below ``models`` and ``blocks``: it
imports nothing of the project but ``errors``.

A model family declares its presets (``{preset name: {option: value}}``) and the value of each
option no preset sets (``defaults``); argparse leaves every option it was not given at None.
``resolve_preset`` fills those from the preset named on the command line, then from the
defaults, so explicit flags always win:

    resolve_preset(args, PRESETS, "idpg_preset", DEFAULTS, default="m-idpg-phm")

It is idempotent: fairseq calls the architecture function at parse time, and ``build_model``
calls it again for models built from a plain namespace or a stored config.
"""

from fairseq_idpg.errors import ConfigError


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
    value = getattr(args, dest)
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
