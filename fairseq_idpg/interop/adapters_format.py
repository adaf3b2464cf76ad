"""Our adapter family <-> AdapterHub ``adapters`` folders (adapter_config.json + pytorch_adapter.bin, and the
classification head as head_config.json + pytorch_model_head.bin), as ``model.save_adapter(..., with_head=True)``
of adapters 1.3.0 writes them for ``BertAdapterModel`` / ``RobertaAdapterModel``.

What ``adapters`` holds exactly (each field below was checked against adapters 1.3.0's ``BnConfig``,
``methods/modeling.py`` and ``methods/prefix_tuning.py``; docs/using.md, "PEFT and adapters"):

- **Houlsby adapter** (``--adapter houlsby``): ``BnConfig(mh_adapter, output_adapter, original_ln_before=False,
  original_ln_after=True, residual_before_ln=True, non_linearity="relu" or "gelu", scaling=1.0)`` computes
  LN(x + h + f(h)) with h the sublayer's output after its dropout and f(h) = W_up act(W_down h + b_d) + b_u
  (Houlsby et al. 2019, Figure 2: the adapter inside the residual, before the layer's LayerNorm), ours
  (``modules/adapters/adapted_layer.py``); the bottleneck r is ``reduction_factor`` = d / r.
- **Compacter** (``--adapter compacter``): the same placement with ``phm_layer``: W = sum_i kron(A_i, s_i t_i)
  (Karimi Mahabadi et al. 2021, Eq. 3 and section 3.2 "low-rank parameterisation"; adapters' ``PHMLayer``
  is rabeehk/compacter's code), exact GELU on both sides (``non_linearity="gelu"``: transformers'
  ``GELUActivation``). Ours shares one A set between an adapter's down- and up-projection (IDPG appendix
  A.1.2's count); adapters can share A across *all* layers (``shared_phm_rule``) or not at all, so the
  export writes ``shared_phm_rule=False`` with the A set copied into both projections: the same function,
  though training on in adapters would untie the copies (n^3 more trained values per adapter).
- **MAM adapter** (prefix l + parallel FFN adapter, He et al. 2021 section 4.4): ``ConfigUnion`` of
  ``PrefixTuningConfig`` and a parallel ``BnConfig`` (``is_parallel``, ``output_adapter``, scaling s):
  LN(x + Dropout(FFN(x)) + s (W_up ReLU(W_down x + b_d) + b_u)), and keys/values [P_k; K], [P_v; V] prepended
  inside the attention, the real tokens' positions untouched (unlike PEFT's key/value cache). The prefix
  MLP (Embedding(l, d) -> Linear(d, m) -> tanh -> Linear(m, 2 L d)) is adapters' ``PrefixTuning`` module with
  the same flattened [l, L, 2, d] layout; a stored-form run (prefixes only) goes as ``flat`` prefixes.
  Prefix tuning alone and the parallel adapter alone go the same way.

- **Prompt tuning** (``prompt-tuning-5/100/134``, DPT and the other ``roberta_prompt`` prompts): not exact, refused
  both ways. ``PromptTuningConfig(combine="prefix_after_bos")`` does put its t vectors right after ``<s>``, as ours
  (IDPG appendix A.4), and its head reads ``<s>`` (``outputs[0][:, 0]``), as ours; but it inserts them with a
  forward hook on the *output* of ``RobertaEmbeddings`` (``ModelBaseAdaptersMixin.post_embedding_forward``), so:
  (1) its prompt gets no position embedding and no embedding LayerNorm, where ours is a row of token embeddings
  that gets positions 3..t+2 (RoBERTa's numbering, from padding_idx + 1) and the embedding LayerNorm; at
  evaluation that is a fixed reparameterisation Q_j = LN(P_j + E_pos[j + 2] + E_type[0]) of ours, but not every
  vector of theirs is a LayerNorm output, and training differs (ours drops the prompt out with the embeddings);
  (2) its real tokens keep positions 2..T+1, ours shift by t (``insertion.insert_prompts``): no config field
  changes that, only a ``position_ids`` argument on every call; (3) under transformers' default ``sdpa``
  attention, ``utils.prefix_attention_mask(mask, [2, 3])`` prepends t all-zero *rows* to the [B, 1, T, T] mask,
  so ``<s>`` and the first t - 1 prompt vectors attend to the padding of a padded batch (a bug on adapters'
  side; eager attention's [B, 1, 1, T] mask is right). With Q, our ``position_ids`` and eager attention the
  logits are ours within float rounding (tests/test_interop_adapters.py): these three are the whole difference.

Not expressible, refused with the reason (``NotExpressible``): prompts (above), any other block beside these, a
sequential adapter together with a parallel one, and on import gates, new LayerNorms, other placements or
non-linearities, per-layer sizes, ``leave_out``, learned scaling, invertible adapters, a shared W, and a
prediction head that is not dense -> tanh -> out_proj on the first token. Training-only differences
(initialisation, where dropout sits) are documented in docs/using.md, not refused: the function is exact.
"""

import os

import torch

from fairseq_idpg.errors import ConfigError, NotExpressible
from fairseq_idpg.files import read_json, read_tensors, save_torch, write_json
from fairseq_idpg.interop.peft_format import HEAD_KEY, LAYER_KEY, active_blocks, check_sizes, describe
from fairseq_idpg.modules.adapters.bottleneck import ACTIVATIONS

CONFIG, WEIGHTS = "adapter_config.json", "pytorch_adapter.bin"
SAFE_WEIGHTS = "adapter.safetensors"  # what save_adapter(use_safetensors=True) writes instead
HEAD_CONFIG, HEAD_WEIGHTS = "head_config.json", "pytorch_model_head.bin"
VERSION = "adapters.1.3.0"
LAYER = "encoder.sentence_encoder.layers.{i}."
# our adapters -> the module of a transformers layer whose output they follow (adapters' "locations")
LOCATIONS = {"attn_adapter": "attention.output", "ffn_adapter": "output", "parallel_adapter": "output"}
# our head -> adapters' ClassificationHead(layers=2): [Dropout, Linear (1), tanh, Dropout, Linear (4)]
FLEX_HEAD = {"dense": "heads.{name}.1", "out_proj": "heads.{name}.4"}
MODEL_CLASS = {"bert": "BertAdapterModel", "roberta": "RobertaAdapterModel"}
PREFIX_MLP = {"embedding": "wte", "hidden": "control_trans.0", "output": "control_trans.2"}
# the parallel adapter without prefixes: no record has it alone, so it is built from --ffn-adapter-* alone
PARALLEL_ALONE = "parallel adapter (--ffn-adapter-dim/--ffn-adapter-scale, no --blocks-preset)"

# adapters 1.3.0 BnConfig with its defaults: every key that save_adapter writes (a complete config loads
# the same in later versions that add fields)
BN_DEFAULTS = {
    "adapter_residual_before_ln": False, "cross_adapter": False, "dropout": 0.0, "factorized_phm_W": True,
    "factorized_phm_rule": False, "hypercomplex_nonlinearity": "glorot-uniform", "init_weights": "bert",
    "init_weights_seed": None, "inv_adapter": None, "inv_adapter_reduction_factor": None, "is_parallel": False,
    "learn_phm": True, "leave_out": [], "ln_after": False, "ln_before": False, "mh_adapter": False,
    "non_linearity": "relu", "original_ln_after": True, "original_ln_before": False, "output_adapter": False,
    "phm_bias": True, "phm_c_init": "normal", "phm_dim": 4, "phm_init_range": 0.0001, "phm_layer": False,
    "phm_rank": 1, "reduction_factor": 16, "residual_before_ln": True, "scaling": 1.0, "shared_W_phm": False,
    "shared_phm_rule": True, "stochastic_depth": 0.0, "use_gating": False,
}  # fmt: skip
PREFIX_DEFAULTS = {
    "architecture": "prefix_tuning", "bottleneck_size": 512, "cross_prefix": True, "dropout": 0.0,
    "encoder_prefix": True, "flat": False, "init_weights_seed": None, "leave_out": [], "non_linearity": "tanh",
    "prefix_length": 30, "shared_gating": True, "use_gating": False,
}  # fmt: skip


def reduction_factor(dim, bottleneck):
    """adapters' ``reduction_factor`` whose bottleneck ``int(dim // factor)`` is ``bottleneck``: d / r when r
    divides d, else d / (r + 1/2) (strictly inside the interval of factors that give r)."""
    for factor in (dim / bottleneck, dim / (bottleneck + 0.5)):
        if int(dim // factor) == bottleneck:
            return factor
    raise NotExpressible(f"no adapters reduction_factor gives a bottleneck of {bottleneck} for d = {dim}")


# ---------------------------------------------------------------------------------------------- export
def export_plan(run):
    """{"adapter" | "ffn_adapter" | "prefix": our block config} of what ``run`` holds; ``NotExpressible``
    for anything adapters cannot hold exactly (module docstring)."""
    method = describe(run.options)
    if run.options.get("arch", run.options.get("_name", "")).startswith("roberta_prompt"):
        refuse_prompt(method, run.options.get("prompt_deep"))
    blocks = active_blocks(run.model) or []
    if (
        not blocks
        or not set(blocks) <= {"adapter", "ffn_adapter", "prefix"}
        or {"adapter", "ffn_adapter"} <= set(blocks)
    ):
        raise NotExpressible(
            f"{method}: adapters holds the Houlsby adapter, Compacter, the parallel FFN adapter and prefix tuning "
            f"(the MAM adapter) here, one kind of bottleneck at a time (blocks of this run: "
            f"{', '.join(blocks or ['none'])}); LoRA goes to --format peft"
        )
    return {c.name: c for c in run.model.block_configs if c.active()}


def refuse_prompt(what, deep=False):
    """Why a prompt cannot go between ours and adapters' prompt tuning (module docstring); always raises."""
    if deep:
        raise NotExpressible(
            f"{what}: adapters' prompt tuning is one prompt at the input; ours also adds a prompt to the hidden "
            f"states at the prompt slots after each layer (IDPG section 4.1)"
        )
    raise NotExpressible(
        f"{what}: adapters' prompt tuning (combine prefix_after_bos) inserts the prompt after <s> but after the "
        f"embedding layer: the prompt gets no positions and no embedding LayerNorm and the real tokens keep "
        f"their positions, where ours embeds it at positions 3..t+2 and shifts the real tokens by t (and under "
        f"sdpa attention its <s> attends to padding): not the same function (docs/using.md)"
    )


def bn_config(plan, dim, encoder_dropout):
    """The ``BnConfig`` dict of our sequential or parallel adapter in ``plan`` (None when it has neither)."""
    if "adapter" in plan:
        ours = plan["adapter"]
        config = dict(BN_DEFAULTS, mh_adapter=True, output_adapter=True)
        config["reduction_factor"] = reduction_factor(dim, ours.adapter_dim)
        if ours.adapter == "houlsby":
            # exact GELU on both sides, as for Compacter below
            return dict(config, non_linearity=ours.adapter_activation, init_weights="houlsby")
        # Compacter: A ~ N(0, 0.01^2), s, t Glorot-uniform (CompacterAdapter); biases 0 either way
        return dict(
            config, non_linearity="gelu", phm_layer=True, phm_dim=ours.compacter_n, phm_rank=ours.compacter_rank,
            shared_phm_rule=False, phm_init_range=0.01,
        )  # fmt: skip
    if "ffn_adapter" in plan:
        ours = plan["ffn_adapter"]
        return dict(
            BN_DEFAULTS, output_adapter=True, is_parallel=True, non_linearity="relu", init_weights="mam_adapter",
            reduction_factor=reduction_factor(dim, ours.ffn_adapter_dim), scaling=float(ours.ffn_adapter_scale),
            dropout=float(encoder_dropout),
        )  # fmt: skip
    return None


def prefix_config(plan, prefix_encoder):
    """The ``PrefixTuningConfig`` dict of our prefixes (None without): the MLP, or flat stored prefixes."""
    if "prefix" not in plan:
        return None
    ours = plan["prefix"]
    return dict(
        PREFIX_DEFAULTS, prefix_length=ours.prefix_length, bottleneck_size=ours.prefix_mid_dim,
        flat=prefix_encoder.stored,
    )  # fmt: skip


def adapter_tensors(model, hf, name):
    """Our adapters' tensors under adapters' names (nn.Linear layouts as ours; PHM: ``phm_rule`` = A,
    ``W_left`` = s [n, in/n, k], ``W_right`` = t [n, k, out/n], ``b`` = bias)."""
    out = {}
    for i, layer in enumerate(model.encoder.sentence_encoder.layers):
        for ours, location in LOCATIONS.items():
            block = getattr(layer, ours, None)
            if block is None:
                continue
            base = f"{hf.layer(i, location)}.adapters.{name}"
            for part, theirs in (("down", "adapter_down.0"), ("up", "adapter_up")):
                module = getattr(block, part)
                if hasattr(module, "s"):  # PHMLinear
                    values = {"phm_rule": module.A_set(), "W_left": module.s, "W_right": module.t, "b": module.bias}
                else:
                    values = {"weight": module.weight, "bias": module.bias}
                for key, value in values.items():
                    out[f"{base}.{theirs}.{key}"] = value.detach().float().contiguous().clone()
    return out


def prefix_tensors(prefix_encoder, hf, name):
    """Our prefixes under adapters' pool names: the MLP's three layers, or flat [l * L * 2 * d] (adapters
    views it as [l, L * 2, H, d_h]; ours is stored [L, 2, l, d])."""
    base = f"{hf.base}.prefix_tuning.prefix_tunings.{name}.self_prefix"
    if prefix_encoder.stored:
        return {f"{base}.control_trans": prefix_encoder.kv.detach().float().permute(2, 0, 1, 3).reshape(-1).clone()}
    out = {}
    for ours, theirs in PREFIX_MLP.items():
        for key, value in getattr(prefix_encoder, ours).named_parameters():
            out[f"{base}.{theirs}.{key}"] = value.detach().float().contiguous().clone()
    return out


def head_files(run, hf, name, base_model):
    """(head_config.json dict, tensors): our head as adapters' 2-layer tanh classification head on the first
    token (``use_pooler`` False: BERT's pooler is not used, our dense is the head's first layer)."""
    head = run.model.classification_heads[run.head]
    classes = head.out_proj.weight.shape[0]
    tensors = {
        f"{FLEX_HEAD[part].format(name=name)}.{kind}": getattr(getattr(head, part), kind).detach().float().clone()
        for part in FLEX_HEAD
        for kind in ("weight", "bias")
    }
    labels = {f"LABEL_{i}": i for i in range(classes)}
    config = {
        "activation_function": "tanh", "bias": True, "dropout_prob": None, "head_type": "classification",
        "label2id": labels, "layers": 2, "num_labels": classes, "use_pooler": False,
    }  # fmt: skip
    return module_file(config, hf, name, base_model, tensors[f"heads.{name}.1.weight"].shape[0]), tensors


def module_file(config, hf, name, base_model, hidden):
    """The json adapters writes beside a module's weights (``build_full_config``)."""
    return {
        "config": config, "hidden_size": hidden, "model_class": MODEL_CLASS[hf.model_type],
        "model_name": base_model, "model_type": hf.model_type, "name": name, "version": VERSION,
    }  # fmt: skip


def export_adapters(run, hf, out_dir, base_model, name):
    """Write ``run`` (a ``trained.TrainedRun``) as an adapters folder named ``name`` for the Hugging Face model
    ``hf`` (``hf_backbone.HFBackbone``) named ``base_model`` in its files; returns the adapter config."""
    plan = export_plan(run)
    dim = run.model.encoder.sentence_encoder.embed_tokens.weight.shape[1]
    prefix = getattr(run.model, "prefix_encoder", None)
    configs = [c for c in (prefix_config(plan, prefix), bn_config(plan, dim, run.options.get("dropout", 0.1))) if c]
    config = configs[0] if len(configs) == 1 else {"architecture": "union", "configs": configs}
    tensors = adapter_tensors(run.model, hf, name)
    if prefix is not None and "prefix" in plan:
        tensors.update(prefix_tensors(prefix, hf, name))
    head_config, head = head_files(run, hf, name, base_model)
    os.makedirs(out_dir, exist_ok=True)
    save_torch(tensors, os.path.join(out_dir, WEIGHTS))
    save_torch(head, os.path.join(out_dir, HEAD_WEIGHTS))
    for file, content in ((CONFIG, module_file(config, hf, name, base_model, dim)), (HEAD_CONFIG, head_config)):
        write_json(content, os.path.join(out_dir, file), indent=2)
    return config


# ---------------------------------------------------------------------------------------------- import
def is_adapters_folder(folder):
    """Whether ``folder`` looks like an adapters folder (its weights file) rather than a PEFT one."""
    return any(os.path.isfile(os.path.join(folder, f)) for f in (WEIGHTS, SAFE_WEIGHTS))


def read_adapters(folder):
    """(adapter_config.json, adapter tensors, head_config.json or None, head tensors or None) of ``folder``."""

    def weights(*names):
        for file in names:
            path = os.path.join(folder, file)
            if os.path.isfile(path):
                return read_tensors(path, "the adapter folder")
        return None

    if not os.path.isfile(os.path.join(folder, CONFIG)) or not is_adapters_folder(folder):
        raise ConfigError(f"{folder}: not an adapters folder (needs {CONFIG} and {WEIGHTS} or {SAFE_WEIGHTS})")
    config = read_json(os.path.join(folder, CONFIG), "the adapter folder")
    if not isinstance(config, dict) or "config" not in config or "name" not in config:
        raise ConfigError(f"{folder}: {CONFIG} is not one adapters' save_adapter writes (no config / name)")
    head_file = os.path.join(folder, HEAD_CONFIG)
    head_config = read_json(head_file, "the adapter folder") if os.path.isfile(head_file) else None
    return config, weights(WEIGHTS, SAFE_WEIGHTS), head_config, weights(HEAD_WEIGHTS, "model_head.safetensors")


def differences(config, expected, folder):
    """One ``NotExpressible`` naming every field of ``config`` that differs from ``expected``."""
    bad = [f"{k} {config.get(k, BN_DEFAULTS.get(k))!r}" for k, v in expected.items() if config.get(k, v) != v]
    if bad:
        raise NotExpressible(f"{folder}: an adapter with {', '.join(bad)}: ours has {expected} (docs/using.md)")


def import_settings(config, dim, folder):
    """(method name, overrides of our flags) for an adapters config; ``NotExpressible`` for what ours lacks."""
    inner = config["config"]
    parts = inner["configs"] if inner.get("architecture") == "union" else [inner]
    if any(c.get("architecture") == "prompt_tuning" for c in parts):
        refuse_prompt(f"{folder}: adapters prompt tuning")
    prefixes = [c for c in parts if c.get("architecture") == "prefix_tuning"]
    bottlenecks = [c for c in parts if c.get("architecture") is None]
    if len(prefixes) + len(bottlenecks) != len(parts) or len(prefixes) > 1 or len(bottlenecks) > 1:
        kinds = ", ".join(str(c.get("architecture") or "bottleneck") for c in parts)
        raise NotExpressible(f"{folder}: adapters {kinds}: ours holds one bottleneck adapter and/or prefix tuning")
    overrides, method = {}, None
    if prefixes:
        p = prefixes[0]
        differences(p, {"leave_out": [], "use_gating": False, "encoder_prefix": True}, folder)
        if not p.get("flat"):
            differences(p, {"non_linearity": "tanh"}, folder)
        overrides.update({"--prefix-length": p["prefix_length"], "--prefix-mid-dim": p.get("bottleneck_size", 512)})
        method = "prefix-tuning"
    if bottlenecks:
        b = bottlenecks[0]
        factor = b["reduction_factor"]
        if not isinstance(factor, (int, float)):
            raise NotExpressible(f"{folder}: per-layer reduction_factor {factor}: ours has one bottleneck size")
        bottleneck = int(dim // factor)
        common = {
            "original_ln_before": False, "original_ln_after": True, "residual_before_ln": True, "ln_before": False,
            "ln_after": False, "use_gating": False, "leave_out": [], "inv_adapter": None, "cross_adapter": False,
            "adapter_residual_before_ln": False,
        }  # fmt: skip
        if b.get("is_parallel"):
            parallel = dict(common, mh_adapter=False, output_adapter=True, non_linearity="relu", phm_layer=False)
            differences(b, parallel, folder)
            if not isinstance(b.get("scaling", 1.0), (int, float)):
                raise NotExpressible(f"{folder}: scaling {b['scaling']!r}: ours is a constant s")
            overrides.update({"--ffn-adapter-dim": bottleneck, "--ffn-adapter-scale": float(b.get("scaling", 1.0))})
            method = "mam-adapter" if prefixes else PARALLEL_ALONE
        else:
            differences(b, dict(common, mh_adapter=True, output_adapter=True, scaling=1.0), folder)
            if b.get("phm_layer"):
                expected = {"non_linearity": "gelu", "factorized_phm_W": True, "shared_W_phm": False, "phm_bias": True}
                differences(b, expected, folder)
                overrides.update({"--adapter": "compacter", "--compacter-n": b["phm_dim"]})
                overrides["--compacter-rank"] = b.get("phm_rank", 1)
                method = "compacter"
            else:
                if b.get("non_linearity") not in ACTIVATIONS:
                    raise NotExpressible(
                        f"{folder}: an adapter with non_linearity {b.get('non_linearity')!r}: ours has "
                        f"{' or '.join(ACTIVATIONS)}"
                    )
                overrides.update({"--adapter": "houlsby", "--adapter-activation": b["non_linearity"]})
                method = "houlsby-adapter"
            overrides["--adapter-dim"] = bottleneck
    return method, overrides


def phm_rule(tensors, key, shared, folder):
    """A PHM layer's A set: its own ``phm_rule`` (or left @ right when factorised), else the model-wide
    shared one (``shared_phm_rule``: one A set for every layer, which ours copies into each adapter)."""
    for source in (key, shared):
        if f"{source}.phm_rule" in tensors:
            return tensors[f"{source}.phm_rule"]
        if f"{source}.phm_rule_left" in tensors:
            return torch.bmm(tensors[f"{source}.phm_rule_left"], tensors[f"{source}.phm_rule_right"])
    raise ConfigError(f"{folder}: {WEIGHTS} lacks {key}.phm_rule (and no shared one)")


def stored(source, key, folder):
    """``source[key]``; a ``ConfigError`` naming the key where the folder lacks it."""
    if key not in source:
        raise ConfigError(f"{folder}: lacks {key}")
    return source[key]


def imported_projection(tensors, theirs, mine, phm, folder):
    """One projection's entries: a PHM layer's factors (W_left, W_right) and bias, else a linear layer's."""
    pairs = (("W_left", "s"), ("W_right", "t"), ("b", "bias")) if phm else (("weight", "weight"), ("bias", "bias"))
    return {f"{mine}.{ours}": stored(tensors, f"{theirs}.{key}", folder) for key, ours in pairs}


def imported_adapter(tensors, base, mine, block, shared, where, folder):
    """One adapter's entries; a Compacter's one A set where its down- and up-projection's agree."""
    state, rules = {}, []
    for part, theirs in (("down", "adapter_down.0"), ("up", "adapter_up")):
        phm = hasattr(getattr(block, part), "s")
        state.update(imported_projection(tensors, f"{base}.{theirs}", f"{mine}.{part}", phm, folder))
        if phm:
            rules.append(phm_rule(tensors, f"{base}.{theirs}", shared, folder))
    if rules:
        if not torch.equal(rules[0], rules[1]):
            raise NotExpressible(
                f"{folder}: {where} Compacter has different A sets in its down- and "
                f"up-projection; ours shares one per adapter (IDPG appendix A.1.2)"
            )
        state[f"{mine}.A"] = rules[0]
    return state


def imported_adapters(tensors, hf, model, name, folder):
    """The entries of every adapter ``model`` has, layer by layer."""
    state = {}
    shared = f"{hf.base}.shared_parameters.{name}"
    for i, layer in enumerate(model.encoder.sentence_encoder.layers):
        for ours, location in LOCATIONS.items():
            block = getattr(layer, ours, None)
            if block is not None:
                base, mine = f"{hf.layer(i, location)}.adapters.{name}", LAYER.format(i=i) + ours
                where = f"layer {i}'s {location}"
                state.update(imported_adapter(tensors, base, mine, block, shared, where, folder))
    return state


def imported_prefix(tensors, hf, model, name, folder):
    """The prefix encoder's entries (none without one): its flat key/values, else its MLP's weights."""
    prefix = getattr(model, "prefix_encoder", None)
    if prefix is None:
        return {}
    base = f"{hf.base}.prefix_tuning.prefix_tunings.{name}.self_prefix"
    if f"{base}.control_trans" in tensors:  # flat: our stored form
        kv = tensors[f"{base}.control_trans"].view(prefix.length, prefix.num_layers, 2, prefix.dim)
        return {"prefix_encoder.kv": kv.permute(1, 2, 0, 3).contiguous()}
    return {
        f"prefix_encoder.{ours}.{key}": stored(tensors, f"{base}.{theirs}.{key}", folder)
        for ours, theirs in PREFIX_MLP.items()
        for key, _ in getattr(prefix, ours).named_parameters()
    }


def imported_head(head_tensors, head, name, folder):
    """The classification head's entries from the head's own tensors."""
    state = {}
    for part, theirs in FLEX_HEAD.items():
        for kind in ("weight", "bias"):
            key = HEAD_KEY.format(head=head, part=part, kind=kind)
            state[key] = stored(head_tensors, f"{theirs.format(name=name)}.{kind}", folder)
    return state


def imported_state(tensors, head_tensors, hf, model, head, name, folder):
    """Our state entries from adapters' ``tensors`` (and the head's); ``NotExpressible`` where down- and
    up-projection of one Compacter adapter have different A sets (ours shares one)."""
    return {
        **imported_adapters(tensors, hf, model, name, folder),
        **imported_prefix(tensors, hf, model, name, folder),
        **imported_head(head_tensors, head, name, folder),
    }


def check_head(head_config, folder):
    """One line unless the folder's head is adapters' 2-layer tanh classification head on the first token."""
    config = (head_config or {}).get("config") or {}
    wanted = {"head_type": "classification", "layers": 2, "activation_function": "tanh", "use_pooler": False}
    if head_config is None:
        raise NotExpressible(f"{folder}: no prediction head (save_adapter(..., with_head=True) writes one)")
    bad = [f"{k} {config.get(k)!r}" for k, v in wanted.items() if config.get(k) != v]
    if bad:
        raise NotExpressible(
            f"{folder}: a prediction head with {', '.join(bad)}: ours is dense -> tanh -> out_proj on the first "
            f"token (adapters' classification head, layers 2, tanh, use_pooler False)"
        )


def method_record(method):
    """The record ``method`` is built from; the parallel adapter alone: the MAM adapter's without its preset
    (whose prefixes a prefix length of 0 would turn off, which a preset refuses), so only its flags apply."""
    from dataclasses import replace

    from fairseq_idpg.methods import METHODS

    if method == PARALLEL_ALONE:
        return replace(METHODS["mam-adapter"], options={"save_trainable_only": True})
    return METHODS[method]


def check_adapter_sizes(config, tensors, hf, dims, folder):
    """One line where the folder's tensors were made for a model of other sizes than ``--backbone``'s."""
    found = [m for m in (LAYER_KEY.match(k) for k in tensors) if m]
    check_sizes(found, config.get("hidden_size"), hf, dims, folder)


def import_adapters(folder, hf, backbone, data, out_file, any_base=False):
    """Write the adapters ``folder`` (trained on ``hf``, the Hugging Face model of ``backbone``) as our compact
    checkpoint for the prepared ``data``; returns (the method's record name, out_file). The base model is
    checked (``base_model.check_base_model``) unless ``any_base``."""
    from fairseq_idpg.interop.base_model import check_base_model
    from fairseq_idpg.interop.method_checkpoint import build_for_import, copy_imported, save_imported
    from fairseq_idpg.run import model_dims

    config, tensors, head_config, head_tensors = read_adapters(folder)
    check_head(head_config, folder)
    dims = model_dims(backbone)
    method, overrides = import_settings(config, dims["--encoder-embed-dim"], folder)
    check_adapter_sizes(config, tensors, hf, dims, folder)
    if not any_base:
        check_base_model(config.get("model_name"), folder, backbone, hf, "model_name")
    model, cfg = build_for_import(method_record(method), backbone, data, overrides)
    head = next(iter(model.classification_heads))
    state = imported_state(tensors, head_tensors, hf, model, head, config["name"], folder)
    if "prefix_encoder.kv" in state:
        model.prefix_encoder.to_stored(torch.zeros_like(state["prefix_encoder.kv"]))
    copy_imported(model, state, folder)
    return method, save_imported(model, cfg, out_file, source=f"adapters:{os.path.abspath(folder)}")
