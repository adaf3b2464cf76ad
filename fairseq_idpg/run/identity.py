"""A run's identity: the hash over its configuration (config.json) that names its folder.

    lr5e-3.seed1.ef69a6c8 = run_name(lr, seed, config_hash(config))

The hash covers everything that shapes what is trained: the backbone file, the prepared data's
provenance, the task, the method record (its name, architecture, options and **the settings its
model is built with**: the preset resolved and every default filled, ``model_settings``), lr, seed,
batch, budget, schedule, clipping, weight decay, selection, and the extra fairseq-train flags. It
leaves out where things are (folders, the model's name) and how many devices share the batch.

Finished runs keep their folders across changes of what is hashed:
- a key added to config.json after runs were named is hashed only when it differs from what runs
  before it had (``head_lr`` and the run options: only when set; the weights' digest: never);
- the model settings were added so: a method whose settings are still those it had when they were
  first recorded (``settings_before_hashing.json``, never edited) keeps the folder it always had;
  any change of its preset or of a default it relies on gives new settings, so a new folder;
- a fairseq-train flag that becomes a run option stays in ``extra_args`` where it was given
  (``fairseq=True`` in ``fairseq_idpg/run_config.py``; a test refuses such an option hashed under a key of
  its own), so the runs that passed it through keep their folder.

The same model and training spelled otherwise is the same run: a run option at its default is left out of
config.json (``RunConfig.config_options``), and so is an extra flag that sets the method's model to what it
already is (its preset's value, its family's default, or how rather than what it computes:
``canonical_extra_args``); config.json's ``extra_args`` are the others, as given.
"""

import argparse
import hashlib
import json
from functools import cache
from pathlib import Path

SETTINGS_BEFORE_HASHING = Path(__file__).with_name("settings_before_hashing.json")


@cache
def settings_before_hashing():
    """{method name: its model settings} when run folders were named without them."""
    return json.loads(SETTINGS_BEFORE_HASHING.read_text())


def model_settings(method):
    """The settings the model of ``method`` (a ``fairseq_idpg.methods.Method``) is built with, as its
    architecture resolves them from the record's options (``model_settings`` of the model class: the preset
    named there, then the defaults; only what shapes the model). {} for a stock fairseq model."""
    settings = getattr(method.model_class, "model_settings", None)
    return settings(method.options) if settings is not None else {}


# Runs named while an extra flag at its method's own value was still hashed, spelled so in a committed spec: the
# method and the extra flags as given (examples/idpg/ablation-multilayer.yaml's layer0-M-m256 gives m-idpg-phm
# its own --idpg-sharing M). The same run spelled without that flag is named as these were. Never edited.
NAMED_WITH_UNCHANGED_FLAGS = {
    "m-idpg-phm": (
        ("--fp16-init-scale", "4", "--threshold-loss-scale", "1", "--fp16-scale-window", "128",
         "--idpg-layer-input", "first", "--idpg-sharing", "M", "--idpg-hidden", "256"),
    ),
}  # fmt: skip


def canonical_extra_args(method, extra_args):
    """config.json's ``extra_args``: the extra fairseq-train flags of a run of ``method`` as given, less each flag
    that leaves its model as it is (``unchanged_model_flags``), so that a model spelled by its preset, by its
    family's defaults or by flags giving those values is one run, in one folder. A spelling runs were named by
    before (``NAMED_WITH_UNCHANGED_FLAGS``) is kept as it was named."""
    canonical = without_unchanged_model_flags(method, tuple(extra_args))
    for named in NAMED_WITH_UNCHANGED_FLAGS.get(method.name, ()):
        could_be = set(canonical) <= set(named)  # (a sweep plans thousands of runs: the others are not looked at)
        if could_be and without_unchanged_model_flags(method, named) == canonical:
            return list(named)
    return list(canonical)


def without_unchanged_model_flags(method, extra_args):
    """``extra_args`` (a tuple) less the flags, with their values, of ``unchanged_model_flags``."""
    given = model_flags(method, extra_args)
    unchanged = unchanged_model_flags(method, given)
    if not unchanged:
        return extra_args
    parser, kept, skip = model_flag_parser(method.model_class), [], 0
    for token in extra_args:
        if skip:
            skip -= 1
            continue
        action = parser._option_string_actions.get(token.split("=", 1)[0]) if token.startswith("--") else None
        if action is not None and action.dest in unchanged:
            skip = 0 if "=" in token or action.nargs == 0 else 1  # --flag VALUE, --flag=VALUE or a switch
            continue
        kept.append(token)
    return tuple(kept)


def unchanged_model_flags(method, given):
    """The options of ``given`` (``model_flags``) whose flags leave the model as it is: left out one at a time, the
    settings it is built with stay those of all of them (a value its preset or its family's default already
    gives, or an option of how it computes, which no settings hold)."""
    if not given:
        return set()
    settings = method.model_class.model_settings
    built, kept = settings({**method.options, **given}), dict(given)
    for option in given:
        fewer = {k: v for k, v in kept.items() if k != option}
        if settings({**method.options, **fewer}) == built:
            kept = fewer
    return set(given) - set(kept)


def model_flags(method, extra_args):
    """{option: value} of the flags among ``extra_args`` that set an option of ``method``'s model (the last one
    given wins); {} for a stock fairseq model, and for flags its parser refuses (fairseq-train then says why)."""
    model_class = method.model_class
    if not hasattr(model_class, "resolved_options") or not any(a.startswith("--") for a in extra_args):
        return {}
    try:
        given, _ = model_flag_parser(model_class).parse_known_args(list(extra_args))
    except ValueError:
        return {}
    if not vars(given):  # (the settings are resolved only for flags of the model's)
        return {}
    options = {*model_class.resolved_options(method.options), *model_class.runtime_options()}
    return {k: v for k, v in vars(given).items() if k in options}


def _refuse(message):
    raise ValueError(message)


@cache
def model_flag_parser(model_class):
    """A parser of ``model_class``'s flags that yields only those given: no defaults, any value of a choice (the
    model's checks are fairseq-train's), a value it cannot read a ValueError (argparse would exit)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.error = _refuse
    model_class.add_args(parser)
    for action in parser._actions:
        action.default, action.choices = argparse.SUPPRESS, None
    return parser


def format_lr(lr):
    """5e-3 -> "5e-3", 2e-05 -> "2e-5", 0.3 -> "3e-1": short and exact for folder names."""
    mantissa, exponent = f"{lr:.10e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def run_name(lr, seed, digest):
    """The run folder's name: ``lr<lr>.seed<seed>.<hash>``."""
    return f"lr{format_lr(lr)}.seed{seed}.{digest}"


def config_hash(config):
    """8 hex digits over what defines the run (not where it is, nor how many devices share the batch)."""
    defining = json.loads(json.dumps(config, default=str))
    defining.pop("layout", None)
    defining["data"].pop("folder", None)
    (defining["data"].get("provenance") or {}).pop("raw", None)  # the same files elsewhere are the same data
    defining["model"].pop("name", None)
    # added after runs were named: a run folder's name (and a record's) stays what it was
    defining["model"].pop("weights_sha256", None)
    method = defining["method"]
    if "settings" in method and method["settings"] == settings_before_hashing().get(method["name"]):
        del method["settings"]
    return hashlib.sha256(json.dumps(defining, sort_keys=True).encode()).hexdigest()[:8]


def portable_hash(config):
    """``config_hash`` without the model file's path, which the run folder's hash has always included (to
    keep finished runs' folders, it still does): the same run in another checkout or work folder has the
    same portable hash. The backbone is identified by its weights' sha256 where the config has it (the
    same tensors in another build of the file: a fresh clone's stand-in), else by its file's sha256
    (records made before the weights' digest, which match only the same file)."""
    defining = json.loads(json.dumps(config, default=str))
    defining["model"].pop("path", None)
    weights = defining["model"].get("weights_sha256")
    if weights:
        defining["model"]["sha256"] = "weights:" + weights  # config_hash drops weights_sha256 itself
    return config_hash(defining)
