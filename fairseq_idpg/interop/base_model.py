"""The base model an adapter was trained on: named portably on export, checked against ``--backbone`` on import.

- **Export** writes the backbone's name, never a local path, into ``base_model_name_or_path`` (PEFT) or
  ``model_name`` (adapters): the stand-in's Hugging Face name (sentence-transformers/all-MiniLM-L6-v2) for the
  stand-in, FacebookAI/roberta-large / -base for ``models/roberta.large`` / ``roberta.base``, else the model
  folder's name (or ``--base-model NAME``). Beside the adapter it writes ``BACKBONE_FILE``: that name and the
  sha256 of the backbone's weights (``data.digest.weights_sha256``, the digest run records keep).
- **Import** accepts the adapter when (1) its ``BACKBONE_FILE`` holds the weights sha256 of ``--backbone``;
  else (2) the name it gives is the backbone's (its names above, or the local Hugging Face folder the stand-in
  was converted from); else (3) that name is a local Hugging Face folder whose encoder weights are the
  backbone's, tensor for tensor. Anything else, or no name at all, is one line naming both (``--ignore-base-model``
  imports it anyway: an adapter trained on other weights of the same shape computes another function).
"""

import os

import torch

from fairseq_idpg.errors import ConfigError

BACKBONE_FILE = "fairseq_backbone.json"
STANDIN_NAME = "sentence-transformers/all-MiniLM-L6-v2"
HUB_NAMES = {"roberta.large": "FacebookAI/roberta-large", "roberta.base": "FacebookAI/roberta-base"}
OVERRIDE = "--ignore-base-model"


def _real(path):
    return os.path.realpath(os.path.abspath(str(path)))


def backbone_name(backbone, hf):
    """The portable name of the fairseq ``backbone`` (module docstring)."""
    from fairseq_idpg.conversion.errors import ConversionError
    from fairseq_idpg.conversion.source import standin_source_dir

    if hf.model_type == "bert":
        try:
            if _real(hf.path) == _real(standin_source_dir()):
                return STANDIN_NAME
        except ConversionError:
            pass
    folder = os.path.basename(os.path.dirname(_real(backbone)))
    return HUB_NAMES.get(folder, folder)


def names_of(backbone, hf):
    """Every name an adapter may give for ``backbone``: its name, that name without its organisation, and the
    local Hugging Face folder it was converted from."""
    name = backbone_name(backbone, hf)
    names = {name, name.split("/")[-1]}
    if hf.model_type == "bert" and hf.path:
        names.add(_real(hf.path))
    return names


def write_backbone_file(out_dir, backbone, name):
    """``BACKBONE_FILE`` in ``out_dir``: the backbone's ``name`` and its weights' sha256."""
    from fairseq_idpg.data.digest import weights_sha256
    from fairseq_idpg.files import write_json

    write_json({"name": name, "weights_sha256": weights_sha256(backbone)}, os.path.join(out_dir, BACKBONE_FILE))


def hf_weights(backbone, hf):
    """The encoder tensors of ``hf`` without the ``bert.``/``roberta.`` prefix (as ``load_hf_state_dict``)."""
    from fairseq_idpg.conversion.source import inspect_source, load_hf_state_dict
    from fairseq_idpg.interop.hf_backbone import hf_roberta_weights, model_cfg, read_backbone_checkpoint

    if hf.model_type == "bert":
        return load_hf_state_dict(inspect_source(hf.path).weights_file)
    state = read_backbone_checkpoint(backbone)
    return hf_roberta_weights(state["model"], model_cfg(state)["encoder_layers"], prefix="")


def local_weights_file(claimed):
    """The weights file of the local Hugging Face folder ``claimed`` (None: not one)."""
    from fairseq_idpg.conversion.source import WEIGHT_FILES

    if not isinstance(claimed, str) or not os.path.isfile(os.path.join(claimed, "config.json")):
        return None
    return next((os.path.join(claimed, f) for f in WEIGHT_FILES if os.path.isfile(os.path.join(claimed, f))), None)


def same_local_weights(claimed, backbone, hf):
    """Whether ``claimed`` is a local Hugging Face folder whose encoder weights are ``backbone``'s."""
    from fairseq_idpg.conversion.errors import ConversionError
    from fairseq_idpg.conversion.source import load_hf_state_dict

    weights = local_weights_file(claimed)
    if weights is None:
        return False
    try:
        theirs = load_hf_state_dict(weights)
    except ConversionError:
        return False
    ours = hf_weights(backbone, hf)
    return all(k in theirs and theirs[k].shape == v.shape and torch.equal(theirs[k].float(), v.float())
               for k, v in ours.items() if not k.startswith("pooler."))  # fmt: skip


def check_base_model(claimed, folder, backbone, hf, field):
    """One line unless the adapter ``folder`` (whose config gives ``claimed`` in ``field``) was trained on
    ``backbone`` (module docstring)."""
    from fairseq_idpg.data.digest import weights_sha256
    from fairseq_idpg.files import read_json

    ours = backbone_name(backbone, hf)
    side = os.path.join(folder, BACKBONE_FILE)
    recorded = read_json(side, "the adapter folder") if os.path.isfile(side) else None
    if isinstance(recorded, dict) and recorded.get("weights_sha256"):
        if recorded["weights_sha256"] == weights_sha256(backbone):
            return
        raise ConfigError(
            f"{folder}: exported from the backbone {recorded.get('name')!r} (its {BACKBONE_FILE}: weights sha256 "
            f"{recorded['weights_sha256'][:12]}...), --backbone {backbone} is {ours!r} (weights sha256 "
            f"{weights_sha256(backbone)[:12]}...): give the backbone it was trained on, or {OVERRIDE}"
        )
    if claimed in names_of(backbone, hf) or isinstance(claimed, str) and _real(claimed) in names_of(backbone, hf):
        return
    if same_local_weights(claimed, backbone, hf):
        return
    said = f"was trained on {claimed!r} ({field})" if claimed else f"names no base model ({field} is empty)"
    raise ConfigError(
        f"{folder}: {said}, --backbone {backbone} is {ours!r}: give the backbone it was trained on, or "
        f"{OVERRIDE} if you know their weights are the same"
    )
