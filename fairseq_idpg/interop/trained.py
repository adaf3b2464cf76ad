"""A trained run as our model, without its data: what the exporters read and the importers write.

    run = load_trained("checkpoints/standin/SST-2/lora/lr2e-4.seed1.0123abcd")   # or a checkpoint file
    run.model        # the method's model (eval mode), its trained tensors and heads loaded
    run.head         # the classification head's name ("sentence_classification_head")

The model is rebuilt from the checkpoint's own options (``cfg.model``) on its backbone (``backbone=``
overrides where it is now), with a dictionary of the backbone's size: the exporters need tensors,
not tokens. The reverse (tensors made elsewhere -> a compact checkpoint) is
``method_checkpoint``.
"""

from pathlib import Path
from typing import NamedTuple

from fairseq_idpg.errors import ConfigError

CHECKPOINT = "checkpoint_best.pt"
HEAD_PREFIX = "classification_heads."


class TrainedRun(NamedTuple):
    model: object
    head: str
    state: dict  # the checkpoint as read
    options: dict  # its model options
    backbone: str


def checkpoint_file(run):
    """``run``'s checkpoint: the file itself, or a run folder's checkpoint_best.pt; one line otherwise."""
    path = Path(run)
    if path.is_dir():
        path = path / CHECKPOINT
        if not path.is_file():
            raise ConfigError(f"{run}: no {CHECKPOINT} in this folder (give a run folder of run.sh, or a checkpoint)")
    elif not path.is_file():
        raise ConfigError(f"{run}: no such run folder or checkpoint")
    return path


def sized_dictionary(rows):
    """A fairseq Dictionary of ``rows`` entries (ours: specials first, padding 1), for building a model
    whose token embeddings come from the backbone."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    while len(dictionary) < rows:
        dictionary.add_symbol(f"madeupword{len(dictionary):05d}")
    return dictionary


def heads_of(weights):
    """{head name: (classes, inner dim)} of the classification heads in a model state."""
    heads = {}
    for key, value in weights.items():
        if key.startswith(HEAD_PREFIX) and key.endswith(".out_proj.weight"):
            name = key[len(HEAD_PREFIX) : -len(".out_proj.weight")]
            heads[name] = (value.shape[0], value.shape[1])
    return heads


def build_from_options(options, backbone):
    """Our model of ``options`` (a checkpoint's ``cfg.model``) on ``backbone``, without heads."""
    from fairseq_idpg.models.build import build_model
    from fairseq_idpg.models.frozen_roberta import read_backbone

    rows = read_backbone(backbone)["encoder.sentence_encoder.embed_tokens.weight"].shape[0]
    arch = options.get("arch") or options.get("_name")
    skip = {"arch", "_name", "backbone", "data", "user_dir"}
    return build_model(arch, sized_dictionary(rows), backbone=backbone, **{
        k: v for k, v in options.items() if k not in skip
    })  # fmt: skip


def load_trained(run, backbone=None):
    """The trained model of ``run`` (a run folder or checkpoint), in eval mode; see the module docstring."""
    from fairseq_idpg.files import read_checkpoint
    from fairseq_idpg.interop.hf_backbone import model_cfg

    file = checkpoint_file(run)
    state = read_checkpoint(file)
    options = model_cfg(state)
    backbone = str(backbone or options.get("backbone") or "")
    if not backbone:
        raise ConfigError(f"{file}: not a frozen-backbone method's checkpoint (no --backbone in its options)")
    model = build_from_options(options, backbone)
    heads = heads_of(state["model"])
    if len(heads) != 1:
        raise ConfigError(f"{file}: expected one classification head, found {len(heads)} ({', '.join(heads)})")
    ((head, (classes, inner)),) = heads.items()
    model.register_classification_head(head, num_classes=classes, inner_dim=inner)
    model.load_state_dict(state["model"])
    return TrainedRun(model.eval(), head, state, options, backbone)
