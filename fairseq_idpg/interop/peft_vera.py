"""Our ``vera`` runs <-> PEFT ``VeraConfig`` adapter folders (peft 0.21.2's ``tuners/vera``).

PEFT computes W x + b_W + lambda_b * (B (lambda_d * (A Dropout(x)))) with one shared A [r, in], B [out, r] drawn
from ``projection_prng_key`` (``modules/attention/vera.py``: ours draws them the same way, value for value, from
``--vera-seed``). The adapter file holds, per adapted module, ``vera_lambda_b`` (our b) and ``vera_lambda_d``
(our d), with ``save_projection`` (PEFT's default) A and B once, as ``base_model.vera_A`` / ``base_model.vera_B``.

- Export: ``projection_prng_key`` = our seed, ``save_projection`` true with the A and B our seed draws (PEFT
  then loads them rather than trusting its generator on another machine), the head as ``modules_to_save``.
- Import: the fields map onto ``--vera-rank``, ``--vera-seed``, ``--vera-dropout``, ``--vera-d-initial``,
  ``--vera-targets``; stored A and B must be the draw of ``projection_prng_key`` (ours keeps no A and B of its
  own: it redraws them at every build), else the adapter is refused in one line, as is any field that changes
  the function beyond ours (biases, other modules). Every field of ``VeraConfig`` is in exactly one of
  ``MAPPED``, ``HARMLESS``, ``REFUSED`` (tests/test_interop_peft_fields.py checks the dataclass against them).
"""

import torch

from fairseq_idpg.errors import ConfigError, NotExpressible, listed
from fairseq_idpg.interop import peft_config
from fairseq_idpg.interop.peft_config import LORA_MODULES

PEFT_TYPE = "VERA"
PROJECTIONS = {"A": "base_model.vera_A", "B": "base_model.vera_B"}  # PEFT's keys of the shared pair
LAMBDAS = {"b": "vera_lambda_b", "d": "vera_lambda_d"}  # ours -> PEFT's, per adapted module
MAPPED = (
    "r", "target_modules", "projection_prng_key", "save_projection", "vera_dropout", "d_initial", "modules_to_save",
    "layers_to_transform", "layers_pattern", "base_model_name_or_path", "peft_type",
)  # fmt: skip
# cannot change what the imported adapter computes: the trained vectors are what the file holds (init_weights), and
# fan_in_fan_out is about Conv1D weights (RoBERTa's are nn.Linear)
HARMLESS = (
    "task_type", "auto_mapping", "peft_version", "revision", "inference_mode", "fan_in_fan_out", "init_weights",
)  # fmt: skip
REFUSED = {"bias": ("none", "trained biases of the base model")}  # field: (its value when off, what it adds)
KNOWN = set(MAPPED) | set(HARMLESS) | set(REFUSED)


def vera_config(model):
    """The ``vera`` block's config of a ``roberta_blocks`` model."""
    return next(c for c in model.block_configs if c.name == "vera")


# ---------------------------------------------------------------------------------------------- export
def export_config(run, hf, base_model):
    """PEFT's ``adapter_config.json`` of ``run``'s VeRA."""
    from fairseq_idpg.interop.hf_backbone import HEAD_MODULES

    config = vera_config(run.model)
    return {
        "peft_type": PEFT_TYPE,
        "task_type": "SEQ_CLS",
        "base_model_name_or_path": base_model,
        "r": config.vera_rank,
        "target_modules": [LORA_MODULES[t] for t in sorted(config.targets())],
        "projection_prng_key": config.vera_seed,
        "save_projection": True,
        "vera_dropout": config.vera_dropout,
        "d_initial": config.vera_d_initial,
        "fan_in_fan_out": False,
        "bias": "none",
        "modules_to_save": HEAD_MODULES[hf.model_type],
        "init_weights": True,
        "layers_to_transform": None,
        "layers_pattern": None,
        "inference_mode": True,
    }


def export_tensors(run, hf, prefix):
    """The shared A, B and every layer's b, d under PEFT's names (float32)."""
    shared = run.model.vera_projections
    out = {key: getattr(shared, ours).detach().float().contiguous() for ours, key in PROJECTIONS.items()}
    params = dict(run.model.named_parameters())
    for theirs, ours in layer_keys(run.model, hf, prefix):
        out[theirs] = params[ours].detach().float().contiguous()
    return out


# ---------------------------------------------------------------------------------------------- import
def check_fields(config, where):
    """``NotExpressible`` naming every field set to what ours cannot hold, or unknown to this importer."""
    bad = [f"{name} {config[name]!r} ({why})" for name, (off, why) in REFUSED.items() if config.get(name, off) != off]
    unknown = sorted(k for k, v in config.items() if k not in KNOWN and v not in (None, False, {}, [], ""))
    bad += [f"{name} {config[name]!r} (a field this importer does not know)" for name in unknown]
    if bad:
        raise NotExpressible(
            f"{where}: VeRA with {'; '.join(bad)}: ours is lambda_b B lambda_d A on query and/or value, nothing else "
            f"trained but the classification head (docs/using.md)"
        )


def import_settings(config, hf, dims, tensors, folder):
    """(overrides of our flags, {our target: module names}) for a PEFT VeRA adapter on ``hf``; one line where it
    does not fit (a field, the sizes, projections that are not the seed's draw)."""
    import os

    from fairseq_idpg.interop.hf_backbone import module_names

    where = os.path.join(folder, "adapter_config.json")
    integer = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    if not (integer(config.get("r")) and config["r"] >= 1 and integer(config.get("projection_prng_key", 0))):
        raise ConfigError(f"{where}: not a PEFT VeRA config (a positive integer r and an integer projection_prng_key)")
    check_fields(config, where)
    layers = dims["--encoder-layers"]
    names = module_names(hf, layers)
    peft_config.check_modules_to_save(config, hf, names, where)
    modules = peft_config.lora_modules(config, hf, names, layers, where, method="VeRA")
    overrides = {
        "--vera-rank": config["r"],
        "--vera-seed": int(config.get("projection_prng_key", 0)),
        "--vera-dropout": float(config.get("vera_dropout", 0.0)),
        "--vera-d-initial": float(config.get("d_initial", 0.1)),
        "--vera-targets": ",".join(modules),
    }
    check_projections(config, tensors, dims["--encoder-embed-dim"], folder)
    return overrides, modules


def check_projections(config, tensors, dim, folder):
    """Stored A and B (``save_projection``) must be what ``projection_prng_key`` draws: ours redraws them."""
    from fairseq_idpg.modules.attention.vera import SharedProjections

    stored = {ours: tensors.get(key) for ours, key in PROJECTIONS.items()}
    if config.get("save_projection", True) and any(v is None for v in stored.values()):
        lacking = listed(PROJECTIONS.values())
        raise ConfigError(f"{folder}: save_projection is true but the weights file lacks {lacking}")
    if all(v is None for v in stored.values()):
        return
    key = int(config.get("projection_prng_key", 0))
    drawn = SharedProjections(dim, dim, config["r"], key)
    for ours, value in stored.items():
        if value is None or value.shape != getattr(drawn, ours).shape:
            shape = None if value is None else tuple(value.shape)
            raise ConfigError(
                f"{folder}: {PROJECTIONS[ours]} has shape {shape}, r {config['r']} and hidden size {dim} give "
                f"{tuple(getattr(drawn, ours).shape)} (made for another model?)"
            )
        if not torch.equal(value.float(), getattr(drawn, ours)):
            raise NotExpressible(
                f"{folder}: {PROJECTIONS[ours]} is not the draw of projection_prng_key {key} (another PEFT's "
                f"generator or edited projections): ours redraws A and B from the seed and keeps none"
            )


def layer_keys(model, hf, prefix):
    """[(PEFT's key, our state key)] of every layer's b and d."""
    return [
        (f"{name}.{theirs}", f"{ours}.{mine}")
        for _, name, ours in peft_config.adapted_projections(model, hf, prefix, "vera")
        for mine, theirs in LAMBDAS.items()
    ]
