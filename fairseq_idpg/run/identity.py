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
  (``fairseq_idpg/run_config.py``), so its runs keep their folder.
"""

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
