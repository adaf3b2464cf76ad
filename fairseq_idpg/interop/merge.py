"""LoRA (DoRA, PiSSA), VeRA and BitFit folded into the frozen weights: a plain fairseq ``roberta`` checkpoint.

LoRA's update is linear in the input, so after training W_q + (alpha / r) B A computes the same projection with no
extra matrix products (Hu et al. 2021 section 4.2, "no additional inference latency"); ``blocks.lora.merge_lora``
does the folding, of VeRA's Lambda_b B Lambda_d A too (Kopiczko et al. 2024 section 3). BitFit trains backbone
biases in place, so its trained tensors already are the plain model's. What remains is fairseq's stock
``RobertaModel`` with the classification head: ``merged_checkpoint`` writes it with the run's cfg, its
architecture set to ``roberta``, so that fairseq-validate and the hub load it without this project's model classes
(the task of the run still reads the data). Any other block (adapters, prefixes, inducers, (IA)^3) is not a change
of the frozen weights and is refused in one line.
"""

from fairseq_idpg.errors import ConfigError
from fairseq_idpg.methods import METHODS, methods_where

# the blocks of the records that fold into the frozen weights (Method.merges_into_backbone): LoRA's, VeRA's, BitFit's
MERGEABLE = tuple(
    dict.fromkeys(block for name in methods_where(merges_into_backbone=True) for block in METHODS[name].blocks)
)


def check_mergeable(run):
    """One line unless ``run`` (``trained.TrainedRun``) holds only ``MERGEABLE`` blocks (LoRA, BitFit)."""
    mergeable = " and ".join(MERGEABLE)
    configs = getattr(run.model, "block_configs", None)
    if configs is None:
        raise ConfigError(f"{run.options.get('arch')}: only roberta_blocks runs with {mergeable} fold into weights")
    other = sorted(c.name for c in configs if c.active() and c.name not in MERGEABLE)
    if other:
        raise ConfigError(
            f"this run has {', '.join(other)} besides {mergeable}: only {mergeable} fold into the frozen weights"
        )


def merged_model(run):
    """``run.model`` with its LoRA (or VeRA) folded in; returns the plain RoBERTa state dict (backbone + head)."""
    from fairseq_idpg.blocks.lora import merge_lora

    check_mergeable(run)
    for block in MERGEABLE:  # BitFit's biases are backbone tensors already: nothing to fold
        merge_lora(run.model, block)
    full = run.model.state_dict(full=True)
    keep = run.model.backbone_names
    return {k: v for k, v in full.items() if k in keep or k.startswith("classification_heads.")}


def plain_cfg(cfg):
    """A copy of a run's cfg whose model is fairseq's ``roberta`` (no backbone to load, full checkpoints)."""
    import copy

    cfg = copy.deepcopy(cfg)
    model = cfg["model"]
    values = {"arch": "roberta", "_name": "roberta", "backbone": None, "save_trainable_only": False}
    for key, value in values.items():
        if isinstance(model, dict):
            model[key] = value
        else:
            setattr(model, key, value)
    return cfg


def merged_checkpoint(run, out_file):
    """Write the merged model of ``run`` as a plain fairseq ``roberta`` checkpoint; returns its values."""
    from fairseq_idpg.files import save_torch

    weights = merged_model(run)
    state = dict(run.state, model=weights, cfg=plain_cfg(run.state["cfg"]), last_optimizer_state=None)
    save_torch(state, out_file)
    return distinct_values(weights)


def distinct_values(weights):
    """The number of values of a state dict, each tensor counted once: the LM head's weight is the token
    embeddings' (tied), one tensor under two names."""
    seen = {(v.data_ptr(), v.dtype, tuple(v.shape), v.stride()): v.numel() for v in weights.values()}
    return sum(seen.values())
