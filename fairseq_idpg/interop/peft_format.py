"""Our trained methods <-> Hugging Face PEFT adapter folders (adapter_config.json + adapter_model.safetensors).

What PEFT can hold exactly, and what it cannot (docs/using.md, "PEFT and adapters"):

- **LoRA** (``lora``, ``--lora-targets`` q/v): PEFT's ``LoraConfig`` on ``query``/``value`` computes
  W x + (alpha / r) B A Dropout(x), our update (Hu et al. 2021, Eq. 3; ``modules/attention/lora.py``),
  with the same init (A kaiming-uniform a = sqrt(5), B = 0). Exported and imported; the classification
  head goes as ``modules_to_save``. Its variants too: **DoRA** (``dora``, ``--lora-dora``) as ``use_dora``, the
  magnitude as ``lora_magnitude_vector``; **PiSSA** (``pissa``, ``--lora-init pissa``) as
  ``init_lora_weights="pissa"``: PEFT recomputes the residual from the original base weights when it loads the
  adapter, as ours does when it builds the model (a full SVD each: equal to float rounding).
- **VeRA** (``vera``): PEFT's ``VeraConfig`` on ``query``/``value``, the same draw of the shared A and B from
  ``projection_prng_key`` (our ``--vera-seed``) and the same update; ``interop/peft_vera.py``.
- **Prompt tuning** (``prompt-tuning-5/100/134``): not exportable. PEFT prepends the virtual tokens
  *before* ``<s>``/``[CLS]`` and the classifier then reads the first virtual token's output
  (``PeftModelForSequenceClassification.forward``: ``cat(prompts, inputs_embeds)``; RoBERTa's head takes
  ``features[:, 0]``, BERT's pooler ``hidden[:, 0]``), while ours inserts them right after ``<s>`` (IDPG
  appendix A.4, position 0) and the head reads ``<s>``: another function of the same prompt.
- **Prefix tuning** (``prefix-tuning``) and **P-tuning v2**: not exportable. PEFT hands the prefixes to
  transformers as a key/value cache, and transformers then numbers the real tokens' positions from l
  (``past_key_values_length``), where ours (Li & Liang 2021 section 4.2, He et al. 2021) leaves them at
  0..T-1; on RoBERTa PEFT 0.21.2 does not run at all (transformers 5: "Model does not support past key
  values"; 4.57: it gives the cache to the classifier as the pooled output). Our ``p-tuning-v2-5`` is
  IDPG's scheme besides: prompts *added* to the hidden states at the prompt slots after each layer
  (IDPG section 4.1), whose keys then depend on the input; PEFT's P-tuning v2 is static prefixes.

On import, which fields of a PEFT ``LoraConfig`` map onto ours and which are refused: ``peft_config``; the base
model is checked by ``base_model``; a tensor of the weights file ours has no place for is refused too.

Everything refused raises ``NotExpressible`` (a ConfigError: one line, exit status 2 from the scripts)
before anything is written.
"""

import os
import re

from fairseq_idpg.errors import ConfigError, NotExpressible, listed
from fairseq_idpg.interop import peft_config, peft_vera
from fairseq_idpg.interop.hf_backbone import HEAD_MODULES, HEAD_NAMES
from fairseq_idpg.interop.peft_config import LORA_MODULES

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."  # PEFT's key prefix of the wrapped model's tensors
MAGNITUDE = "lora_magnitude_vector"  # DoRA's m in PEFT's adapter files (no ".weight")
HEAD_KEY = "classification_heads.{head}.{part}.{kind}"


# ---------------------------------------------------------------------------------------------- reading ours
def active_blocks(model):
    """Names of the active blocks of a ``roberta_blocks`` model (None for another architecture)."""
    configs = getattr(model, "block_configs", None)
    return None if configs is None else sorted(config.name for config in configs if config.active())


def describe(options):
    """The method as its preset names it (for messages)."""
    name = options.get("blocks_preset") or options.get("prompt_preset") or options.get("idpg_preset")
    return name or options.get("arch") or options.get("_name")


def refuse_prompt(options):
    """Why our prompt methods cannot go to PEFT (module docstring); always raises."""
    method = describe(options)
    if options.get("prompt_deep"):
        raise NotExpressible(
            f"{method}: PEFT's P-tuning v2 is static key/value prefixes (and numbers positions from l), while "
            f"ours adds a prompt to the hidden states at the prompt slots after each layer (IDPG section 4.1), "
            f"whose keys depend on the input"
        )
    raise NotExpressible(
        f"{method}: PEFT inserts the virtual tokens before <s> and its classifier reads the first of them; ours "
        f"inserts them after <s> (--prompt-position {options.get('prompt_position', 0)}) and the head reads <s>: "
        f"not the same function of the prompt"
    )


def head_tensors(run, hf):
    """The classification head under PEFT's names for ``hf``'s ``*ForSequenceClassification``."""
    head = run.model.classification_heads[run.head]
    return {
        key: getattr(getattr(head, part), kind).detach().float().contiguous()
        for key, (part, kind) in head_keys(hf).items()
    }


def head_keys(hf):
    """PEFT's names of our head's tensors: {their key: (our part, kind)}."""
    return {
        f"{PREFIX}{hf_name}.{kind}": (part, kind)
        for part, hf_name in HEAD_NAMES[hf.model_type].items()
        for kind in ("weight", "bias")
    }


def lora_settings(model):
    """(rank, alpha, dropout, targets, dora, init) of the LoRA of a model whose only block is LoRA."""
    config = next(c for c in model.block_configs if c.name == "lora")
    targets = sorted(config.targets())
    return config.lora_rank, config.lora_alpha, config.lora_dropout, targets, config.lora_dora, config.lora_init


# ---------------------------------------------------------------------------------------------- export
def check_exportable(run):
    """The PEFT type ``run``'s method exports to ("LORA", "VERA"); ``NotExpressible`` otherwise."""
    options = run.options
    if options.get("arch", options.get("_name", "")).startswith("roberta_prompt"):
        refuse_prompt(options)
    blocks = active_blocks(run.model)
    if blocks == ["lora"]:
        return "LORA"
    if blocks == ["vera"]:
        return peft_vera.PEFT_TYPE
    method = describe(options)
    if blocks and "prefix" in blocks:
        raise NotExpressible(
            f"{method}: PEFT gives prefixes to transformers as a key/value cache, which numbers the real tokens' "
            f"positions from l (ours: 0..T-1), and on RoBERTa PEFT 0.21.2 does not run it; prefix tuning and "
            f"the MAM adapter go to adapters (scripts/export_peft.py --format adapters)"
        )
    raise NotExpressible(
        f"{method}: PEFT holds LoRA and VeRA here (blocks of this run: {', '.join(blocks or ['none'])}); "
        f"adapters go to --format adapters, the rest has no PEFT form (docs/using.md)"
    )


def lora_tensors(run, hf):
    """The LoRA A and B of every layer under PEFT's names (A: [r, in], B: [out, r], as ``nn.Linear``)."""
    out = {}
    for lora, name, _ in peft_config.adapted_projections(run.model, hf, PREFIX, "lora"):
        out[f"{name}.lora_A.weight"] = lora.A.detach().float().contiguous()
        out[f"{name}.lora_B.weight"] = lora.B.detach().float().contiguous()
        if hasattr(lora, "magnitude"):  # DoRA
            out[f"{name}.{MAGNITUDE}"] = lora.magnitude.detach().float().contiguous()
    return out


def export_peft(run, hf, out_dir, base_model):
    """Write ``run`` (a ``trained.TrainedRun``) as a PEFT folder for the Hugging Face model ``hf``
    (``hf_backbone.HFBackbone``) named ``base_model`` in its config; returns the config."""
    if check_exportable(run) == peft_vera.PEFT_TYPE:
        config = peft_vera.export_config(run, hf, base_model)
        tensors = {**peft_vera.export_tensors(run, hf, PREFIX), **head_tensors(run, hf)}
        return write_peft(config, tensors, out_dir)
    rank, alpha, dropout, targets, dora, init = lora_settings(run.model)
    config = {
        "peft_type": "LORA",
        "task_type": "SEQ_CLS",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": [LORA_MODULES[t] for t in targets],
        "modules_to_save": HEAD_MODULES[hf.model_type],
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": bool(dora),
        "init_lora_weights": init if init != "kaiming" else True,
        "inference_mode": True,
    }
    return write_peft(config, {**lora_tensors(run, hf), **head_tensors(run, hf)}, out_dir)


def write_peft(config, tensors, out_dir):
    """``out_dir`` as PEFT's ``save_pretrained`` writes it; returns the config."""
    from fairseq_idpg.files import save_safetensors, write_json

    os.makedirs(out_dir, exist_ok=True)
    save_safetensors(tensors, os.path.join(out_dir, WEIGHTS), metadata={"format": "pt"})
    write_json(config, os.path.join(out_dir, CONFIG))
    return config


# ---------------------------------------------------------------------------------------------- import
def read_peft(folder):
    """(config, tensors) of a PEFT adapter folder; one line when it is not one, or a file of it is damaged."""
    from fairseq_idpg.files import read_json, read_tensors

    config_file, weights_file = os.path.join(folder, CONFIG), os.path.join(folder, WEIGHTS)
    for path in (config_file, weights_file):
        if not os.path.isfile(path):
            raise ConfigError(f"{folder}: not a PEFT adapter folder (no {os.path.basename(path)})")
    config = read_json(config_file, "the adapter folder")
    if not isinstance(config, dict) or config.get("peft_type") == "LORA" and not valid_rank(config.get("r")):
        raise ConfigError(
            f"{config_file}: not a PEFT LoRA config (a JSON object with a positive integer r); "
            f"copy the adapter folder again"
        )
    return config, read_tensors(weights_file, "the adapter folder")


def valid_rank(r):
    return isinstance(r, int) and not isinstance(r, bool) and r >= 1


LAYER_KEY = re.compile(r"(?P<base>\w+)\.encoder\.layer\.(?P<index>\d+)\.")


def check_sizes(found, hidden, hf, dims, where, every_layer=True):
    """One line where the tensors (``found``: their ``LAYER_KEY`` matches; ``hidden``: their input size, None
    when unknown) were made for another model than ``hf`` with ``dims`` (``run.model_dims``)."""
    if not found:
        return
    base, layers = found[0].group("base"), 1 + max(int(m.group("index")) for m in found)
    ours = (dims["--encoder-layers"], dims["--encoder-embed-dim"])
    if base != hf.base or hidden not in (None, ours[1]) or layers > ours[0] or every_layer and layers != ours[0]:
        size = f"hidden size {hidden}" if hidden is not None else "its hidden size"
        raise ConfigError(
            f"{where}: made for a {base} model with {layers} layers and {size}; --backbone is a {hf.model_type} "
            f"model with {ours[0]} layers and hidden size {ours[1]}: the sizes differ (give the backbone it was "
            f"trained on)"
        )


def layer_matches(tensors):
    """The ``LAYER_KEY`` matches of PEFT's per-layer tensors."""
    return [m for m in (LAYER_KEY.match(k[len(PREFIX) :]) for k in tensors if k.startswith(PREFIX)) if m]


def check_lora_sizes(tensors, hf, dims, config, where):
    """``check_sizes`` of PEFT's LoRA tensors (``layers_to_transform`` may leave layers out)."""
    found = layer_matches(tensors)
    hidden = next((v.shape[-1] for k, v in tensors.items() if k.endswith(".lora_A.weight")), None)
    check_sizes(found, hidden, hf, dims, where, every_layer=config.get("layers_to_transform") is None)


def check_ranks(tensors, modules, rank, where):
    """One line where a LoRA tensor's rank is not the config's r (an edited config)."""
    for name in (n for found in modules.values() for n in found):
        for part, axis in (("lora_A", 0), ("lora_B", 1)):
            key = f"{PREFIX}{name}.{part}.weight"
            if key in tensors and tensors[key].dim() == 2 and tensors[key].shape[axis] != rank:
                raise ConfigError(
                    f"{where}: {key} has rank {tensors[key].shape[axis]}, its {CONFIG} r {rank}: the config and "
                    f"the weights disagree (an edited r?); copy the adapter folder again"
                )


def lora_import_settings(config, hf, dims, tensors, folder):
    """(overrides of our flags, {our target: module names}) for a PEFT LoRA adapter on ``hf``; one line
    (``NotExpressible`` for what ours lacks, ``interop/peft_config.py``) where it does not fit."""
    from fairseq_idpg.interop.hf_backbone import module_names

    where = os.path.join(folder, CONFIG)
    if config.get("peft_type") != "LORA":
        raise NotExpressible(
            f"{where}: a PEFT {config.get('peft_type')} adapter; only LORA and VERA have our form here"
        )
    check_lora_sizes(tensors, hf, dims, config, folder)
    layers = dims["--encoder-layers"]
    overrides, modules = peft_config.lora_import_settings(config, hf, module_names(hf, layers), layers, where)
    check_ranks(tensors, modules, overrides["--lora-rank"], folder)
    return overrides, modules


def imported_state(tensors, hf, model, head, folder, vera=False):
    """Our state entries (LoRA or ``vera``'s b and d, + head) from PEFT's ``tensors``; a missing one is one line
    naming it, and so is a tensor ours has no place for. A BERT head trained without the pooler in
    ``modules_to_save`` keeps BERT's pretrained pooler."""
    state, used = {}, set()

    def take(key, ours):
        if key not in tensors:
            raise ConfigError(f"{folder}: {WEIGHTS} lacks {key}")
        state[ours] = tensors[key]
        used.add(key)

    if vera:  # b and d; the shared A and B were checked against the seed's draw (peft_vera.check_projections)
        for key, ours in peft_vera.layer_keys(model, hf, PREFIX):
            take(key, ours)
        used.update(k for k in peft_vera.PROJECTIONS.values() if k in tensors)
    for lora, name, ours in peft_config.adapted_projections(model, hf, PREFIX, "lora"):
        take(f"{name}.lora_A.weight", f"{ours}.A")
        take(f"{name}.lora_B.weight", f"{ours}.B")
        if hasattr(lora, "magnitude"):  # DoRA
            take(f"{name}.{MAGNITUDE}", f"{ours}.magnitude")
    pretrained = pretrained_pooler(hf) if f"{PREFIX}bert.pooler.dense.weight" not in tensors else {}
    for key, (part, kind) in head_keys(hf).items():
        ours = HEAD_KEY.format(head=head, part=part, kind=kind)
        if key in pretrained:
            state[ours] = pretrained[key]
        else:
            take(key, ours)
    unused = sorted(set(tensors) - used)
    if unused:
        raise NotExpressible(
            f"{folder}: {WEIGHTS} holds tensors ours has no place for: {listed(unused)}; ours holds LoRA's A and B "
            f"(and DoRA's magnitude where use_dora is true), or VeRA's lambda_b and lambda_d, and the head"
        )
    return state


def pretrained_pooler(hf):
    """BERT's pretrained pooler (``base_model.model.bert.pooler.dense.*``) from ``hf``'s own weights."""
    if hf.model_type != "bert":
        return {}
    from fairseq_idpg.conversion.source import inspect_source, load_hf_state_dict

    weights = load_hf_state_dict(inspect_source(hf.path).weights_file)
    return {
        f"{PREFIX}bert.pooler.dense.{kind}": weights[key]
        for kind in ("weight", "bias")
        for key in (f"pooler.dense.{kind}", f"bert.pooler.dense.{kind}")
        if key in weights
    }


def lora_record(overrides):
    """The record a PEFT LoRA adapter imports as: ``dora`` (use_dora), ``pissa`` (init_lora_weights "pissa") or
    ``lora``; its settings are the overrides in each case."""
    if overrides.get("--lora-dora"):
        return "dora"
    return "pissa" if overrides.get("--lora-init") == "pissa" else "lora"


def import_peft(folder, hf, backbone, data, out_file, any_base=False):
    """Write the PEFT LoRA adapter ``folder`` (trained on ``hf``, the Hugging Face model of ``backbone``)
    as our compact checkpoint of its record (``lora_record``) for the prepared ``data``; every check
    (``lora_import_settings``, the base model unless ``any_base``) before anything is built. Returns
    (the record's name, the rank)."""
    from fairseq_idpg.interop.base_model import check_base_model
    from fairseq_idpg.interop.method_checkpoint import build_for_import, copy_imported, save_imported
    from fairseq_idpg.methods import METHODS
    from fairseq_idpg.run import model_dims

    config, tensors = read_peft(folder)
    vera = config.get("peft_type") == peft_vera.PEFT_TYPE
    if vera:
        check_sizes(layer_matches(tensors), None, hf, model_dims(backbone), folder, every_layer=False)
        overrides, _ = peft_vera.import_settings(config, hf, model_dims(backbone), tensors, folder)
    else:
        overrides, _ = lora_import_settings(config, hf, model_dims(backbone), tensors, folder)
    method = METHODS["vera" if vera else lora_record(overrides)]
    if not any_base:
        check_base_model(config.get("base_model_name_or_path"), folder, backbone, hf, "base_model_name_or_path")
    model, cfg = build_for_import(method, backbone, data, overrides)
    head = cfg.model.classification_head_name if hasattr(cfg.model, "classification_head_name") else None
    head = head or next(iter(model.classification_heads))
    state = imported_state(tensors, hf, model, head, folder, vera=vera)
    copy_imported(model, state, folder)
    save_imported(model, cfg, out_file, source=f"peft:{os.path.abspath(folder)}")
    return method.name, overrides["--vera-rank" if vera else "--lora-rank"]
