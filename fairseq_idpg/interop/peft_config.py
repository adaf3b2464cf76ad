"""A PEFT ``LoraConfig`` read field by field on import: mapped onto our LoRA exactly, left alone because it cannot
change the function, or refused in one line naming it (docs/using.md, "Which LoraConfig fields import").

Every field of peft 0.21.2's ``LoraConfig`` is in exactly one of ``MAPPED``, ``HARMLESS``, ``REFUSED`` and
``INIT_FIELD`` (tests/test_interop_peft_fields.py checks the dataclass against them); a field this file does not
know (a later PEFT) is refused when it is set. Which modules a config selects is resolved as PEFT resolves it,
on the module names of the Hugging Face ``*ForSequenceClassification`` model (``hf_backbone.module_names``):

- ``target_modules`` a string: ``re.fullmatch`` over the full module name (peft ``match_target_against_key``);
  a list: a name equal to an entry or ending in ``.entry``, then ``layers_to_transform`` / ``layers_pattern``
  (peft ``check_target_module_exists``); ``exclude_modules`` and ``modules_to_save`` taken out first;
- ``modules_to_save``: every module whose name ends with an entry (peft ``_set_trainable``);
- ``rank_pattern`` / ``alpha_pattern``: the first key that matches ``(.*\\.)?KEY$`` (peft ``get_pattern_key``).
"""

import math
import re

from fairseq_idpg.errors import NotExpressible, listed
from fairseq_idpg.interop.hf_backbone import HEAD_MODULES

LORA_MODULES = {"q": "query", "v": "value"}  # our targets -> transformers' attention.self.<name>


def adapted_projections(model, hf, prefix, kind):
    """(our module, PEFT's module name, our state key) of every ``self_attn.{kind}_{t}`` (``kind``: lora or vera),
    layer by layer, q before v: the one walk of the LoRA and VeRA exports and imports."""
    for i, layer in enumerate(model.encoder.sentence_encoder.layers):
        for t, module in LORA_MODULES.items():
            found = getattr(layer.self_attn, f"{kind}_{t}", None)
            if found is not None:
                name = prefix + hf.layer(i, f"attention.self.{module}")
                yield found, name, f"encoder.sentence_encoder.layers.{i}.self_attn.{kind}_{t}"


# fields read into our flags, or resolved against the module names and then checked
MAPPED = (
    "r", "lora_alpha", "lora_dropout", "use_rslora", "target_modules", "exclude_modules", "layers_to_transform",
    "layers_pattern", "rank_pattern", "alpha_pattern", "modules_to_save", "base_model_name_or_path", "peft_type",
    "use_dora",
)  # fmt: skip
# fields that cannot change what the imported adapter computes (docs/using.md gives each reason)
HARMLESS = (
    "task_type", "auto_mapping", "peft_version", "revision", "inference_mode", "fan_in_fan_out", "megatron_core",
    "qalora_group_size", "runtime_config", "ensure_weight_tying", "loftq_config", "eva_config", "corda_config",
    "lora_ga_config",
)  # fmt: skip
# field: (its value when off, what it adds that ours lacks)
REFUSED = {
    "lora_bias": (False, "a bias on lora_B; ours has none"),
    "bias": ("none", "trained biases of the base model"),
    "trainable_token_indices": (None, "trained token embeddings"),
    "layer_replication": (None, "replicated layers"),
    "alora_invocation_tokens": (None, "activated LoRA, on from an invocation token"),
    "use_qalora": (False, "QALoRA's pooled input"),
    "monteclora_config": (None, "Monte Carlo sampled updates"),
    "target_parameters": (None, "LoRA on parameters rather than modules"),
    "use_bdlora": (None, "block-diagonal factors"),
    "arrow_config": (None, "routing between adapters"),
    "kasa_config": (None, "truncated singular values of the base weights"),
    "velora_config": (None, "a LoRA variant"),
    "megatron_config": (None, "Megatron's parallel layers"),
}
INIT_FIELD = "init_lora_weights"
# initialisations of A and B only: the trained tensors are what the file holds, the base is untouched
PLAIN_INITS = (True, False, "gaussian", "orthogonal", "eva")
# initialisations that also change the base, which ours recomputes exactly: PiSSA's full SVD (--lora-init pissa)
BASE_INITS = {"pissa": "pissa"}
KNOWN = set(MAPPED) | set(HARMLESS) | set(REFUSED) | {INIT_FIELD}
DEFAULT_TARGETS = ["query", "value"]  # peft's default target_modules for bert and roberta


def check_fields(config, where):
    """``NotExpressible`` naming every field of ``config`` that ours cannot hold (one line)."""
    bad = [
        f"{name} {config[name]!r} ({why})"
        for name, (off, why) in REFUSED.items()
        if config.get(name, off) not in (off, None, False, {}, [])
    ]
    init = config.get(INIT_FIELD, True)
    if init not in PLAIN_INITS and init not in BASE_INITS:
        randomised = isinstance(init, str) and init.startswith("pissa_niter_")
        why = "a randomised SVD's residual, which no one recomputes exactly" if randomised else "another residual"
        bad.append(
            f"{INIT_FIELD} {init!r} (its base weights are not the original ones: {why}; PEFT's save_pretrained with "
            f"path_initial_model_for_weight_conversion writes the same adapter as a LoRA of the original base)"
        )
    unknown = sorted(k for k, v in config.items() if k not in KNOWN and v not in (None, False, {}, [], ""))
    bad += [f"{name} {config[name]!r} (a field this importer does not know)" for name in unknown]
    if bad:
        raise NotExpressible(
            f"{where}: LoRA with {'; '.join(bad)}: ours is (alpha / r) B A on query and/or value (with DoRA's "
            f"magnitude, or from PiSSA's full SVD), nothing else trained but the classification head (docs/using.md)"
        )


# ---------------------------------------------------------------------------------------------- PEFT's matching
def excluded(config, key):
    """Whether PEFT leaves ``key`` out before matching targets: ``exclude_modules``, or a module to save."""
    exclude = config.get("exclude_modules")
    if isinstance(exclude, str) and re.fullmatch(exclude, key):
        return True
    if isinstance(exclude, list) and (key in exclude or any(key.endswith(f".{e}") for e in exclude)):
        return True
    return any(re.match(rf"(^|.*\.){m}($|\..*)", key) for m in config.get("modules_to_save") or [])


def layer_index(config, key):
    """The layer index PEFT reads from ``key`` for ``layers_to_transform`` (None: none found)."""
    patterns = config.get("layers_pattern")
    if not patterns:
        match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", key)
    else:
        match = None
        for pattern in [patterns] if isinstance(patterns, str) else patterns:
            match = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", key)
            if match is not None:
                break
    return int(match.group("idx")) if match else None


def in_layers(config, key):
    """PEFT's ``layers_to_transform`` test of a module that a list of target names selected."""
    layers = config.get("layers_to_transform")
    if layers is None or isinstance(layers, list) and not layers:
        return True
    index = layer_index(config, key)
    return index is not None and (index == layers if isinstance(layers, int) else index in layers)


def targeted(config, key, linear):
    """Whether PEFT puts LoRA on the module ``key`` (``linear``: the Linear modules, for "all-linear")."""
    if excluded(config, key):
        return False
    targets = config.get("target_modules")
    targets = DEFAULT_TARGETS if targets is None else targets
    if isinstance(targets, str):
        if targets.lower() == "all-linear":
            return key in linear
        return re.fullmatch(targets, key) is not None
    if key in targets:
        return True
    return any(key.endswith(f".{t}") for t in targets) and in_layers(config, key)


def pattern_value(patterns, key, default):
    """``rank_pattern`` / ``alpha_pattern``'s value for ``key`` (PEFT's ``get_pattern_key``)."""
    for pattern in patterns or {}:
        if re.match(rf"(.*\.)?({pattern})$", key):
            return patterns[pattern]
    return default


# ---------------------------------------------------------------------------------------------- our settings
def lora_modules(config, hf, names, layers, where, method="LoRA"):
    """{our target ("q" / "v"): its module names}; ``NotExpressible`` unless the config selects query and/or
    value and nothing else, in every layer (``method``: the update the messages name, LoRA or VeRA)."""
    linear = {n for n in names if n.rsplit(".", 1)[-1] in ("query", "key", "value", "dense", "out_proj", "classifier")}
    chosen = [n for n in names if targeted(config, n, linear)]
    ours = {hf.layer(i, f"attention.self.{m}"): t for i in range(layers) for t, m in LORA_MODULES.items()}
    spec = f"target_modules {config.get('target_modules')!r}"
    if config.get("exclude_modules"):  # what it takes out shapes the selection: the refusal names it too
        spec += f" less exclude_modules {config['exclude_modules']!r}"
    other = [n for n in chosen if n not in ours]
    if other or not chosen:
        what = f"selects {listed(other)}" if other else "selects no module"
        raise NotExpressible(f"{where}: {spec} {what}: ours puts {method} on query and/or value only")
    modules = {t: [n for n in chosen if ours[n] == t] for t in sorted(set(ours[n] for n in chosen))}
    for t, found in modules.items():
        if len(found) != layers:
            given = config.get("layers_to_transform")
            raise NotExpressible(
                f"{where}: {spec}{'' if given is None else f' with layers_to_transform {given!r}'} puts {method} on "
                f"{LORA_MODULES[t]} in {len(found)} of {layers} layers: ours has it in every layer"
            )
    return modules


def rank_and_alpha(config, modules, where):
    """(r, lora_alpha) of every selected module (``rank_pattern`` / ``alpha_pattern`` resolved); one pair or
    ``NotExpressible``."""
    pairs = {
        name: (
            pattern_value(config.get("rank_pattern"), name, config["r"]),
            pattern_value(config.get("alpha_pattern"), name, config.get("lora_alpha", 8)),
        )
        for found in modules.values()
        for name in found
    }
    if len(set(pairs.values())) > 1:
        shown = listed([f"{name} r {r} alpha {a}" for name, (r, a) in pairs.items()])
        raise NotExpressible(
            f"{where}: rank_pattern / alpha_pattern give the modules different ranks or alphas ({shown}): "
            f"ours has one r and one alpha"
        )
    return next(iter(pairs.values()))


def check_modules_to_save(config, hf, names, where):
    """``NotExpressible`` where ``modules_to_save`` selects a module outside the classification head."""
    head = [n for n in names if any(n == m or n.endswith("." + m) for m in HEAD_MODULES[hf.model_type])]
    saved = config.get("modules_to_save") or []
    other = [
        n for n in names if any(n.endswith(m) for m in saved) and not any(n == h or n.startswith(h + ".") for h in head)
    ]
    if other:
        raise NotExpressible(
            f"{where}: modules_to_save {saved!r} selects {listed(other)}: ours trains the classification head only "
            f"({', '.join(head)})"
        )


def lora_import_settings(config, hf, names, layers, where):
    """(overrides of our flags, {our target: module names}) for a PEFT LoRA config on ``hf`` with ``layers``
    layers whose modules are ``names``; ``NotExpressible`` (one line naming the field) for what ours lacks."""
    check_fields(config, where)
    check_modules_to_save(config, hf, names, where)
    modules = lora_modules(config, hf, names, layers, where)
    rank, alpha = rank_and_alpha(config, modules, where)
    if config.get("use_rslora"):
        alpha = alpha * math.sqrt(rank)  # PEFT's alpha / sqrt(r) as our alpha' / r
    overrides = {
        "--lora-rank": rank,
        "--lora-alpha": float(alpha),
        "--lora-dropout": float(config.get("lora_dropout", 0.0)),
        "--lora-targets": ",".join(modules),
    }
    if config.get("use_dora"):
        overrides["--lora-dora"] = True
    if config.get(INIT_FIELD, True) in BASE_INITS:
        overrides["--lora-init"] = BASE_INITS[config[INIT_FIELD]]
    return overrides, modules
