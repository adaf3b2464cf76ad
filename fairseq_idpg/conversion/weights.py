"""Weight mapping: Hugging Face BERT/RoBERTa tensors -> a stock fairseq RoBERTa and its checkpoint.

The model is built by fairseq's own option parser (``--arch roberta``, task ``masked_lm``, the
source's dimensions), the mapped tensors are loaded into it, and ``checkpoint_state`` gives the
dict fairseq 0.12.2's trainer saves (``cfg``, ``model``, ``optimizer_history``, ``extra_state``, ...).

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

import logging
from typing import List, Optional, Sequence, Tuple

from .errors import ConversionError
from .source import FAIRSEQ_PAD, HFSource

logger = logging.getLogger("fairseq_idpg.conversion")

FAIRSEQ_LAYER_NORM_EPS = 1e-5  # fairseq.modules.LayerNorm default, used by every RoBERTa LayerNorm
# the modules of one encoder layer: Hugging Face BERT/RoBERTa name (under ``encoder.layer.{i}.``) ->
# fairseq name (under ``encoder.sentence_encoder.layers.{i}.``); each has a weight and a bias
LAYER_PAIRS = (
    ("attention.self.query", "self_attn.q_proj"),
    ("attention.self.key", "self_attn.k_proj"),
    ("attention.self.value", "self_attn.v_proj"),
    ("attention.output.dense", "self_attn.out_proj"),
    ("attention.output.LayerNorm", "self_attn_layer_norm"),
    ("intermediate.dense", "fc1"),
    ("output.dense", "fc2"),
    ("output.LayerNorm", "final_layer_norm"),
)


# ---------------------------------------------------------------- HF tensors -> fairseq names
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
        pos[FAIRSEQ_PAD + 1 :] = source_pos[:P]
    else:  # HF RoBERTa rows are fairseq rows already
        pos[:] = source_pos[: P + FAIRSEQ_PAD + 1]
    if weights.has("embeddings.token_type_embeddings.weight"):
        types = weights.get("embeddings.token_type_embeddings.weight")
        pos[FAIRSEQ_PAD + 1 :] += types[0]  # fairseq uses no token types: fold type 0 in
    out[enc + "embed_positions.weight"] = pos
    out[enc + "layernorm_embedding.weight"] = weights.get("embeddings.LayerNorm.weight", (d,))
    out[enc + "layernorm_embedding.bias"] = weights.get("embeddings.LayerNorm.bias", (d,))

    for i in range(src.layers):
        hf, fs = f"encoder.layer.{i}.", f"{enc}layers.{i}."
        shapes = {"fc1": (f, d), "fc2": (d, f)}
        for hf_name, fs_name in LAYER_PAIRS:
            shape = None if fs_name.endswith("layer_norm") else shapes.get(fs_name, (d, d))
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
                    "them, so the decoder weight is dropped",
                    weights.weights_file,
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


# ---------------------------------------------------------------- the fairseq model and checkpoint
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
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import fairseq_idpg  # noqa: F401  (registers --bpe wordpiece)

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


def load_mapped_weights(model, mapped: dict) -> None:
    """Copy the ``map_weights`` entries into ``model``; every fairseq parameter must be filled with
    its own shape (a mismatch is a converter bug, not an input problem: ``RuntimeError``)."""
    state = model.state_dict()
    missing = [k for k in state if k not in mapped and not k.endswith(".version")]
    if missing:  # a fairseq parameter this converter does not know: a bug here, not the input
        raise RuntimeError(f"converter does not fill fairseq parameters {missing}")
    for key, value in mapped.items():
        if tuple(state[key].shape) != tuple(value.shape):
            raise RuntimeError(f"{key}: converted shape {tuple(value.shape)} != fairseq {tuple(state[key].shape)}")
        state[key] = value
    model.load_state_dict(state, strict=True)  # copies into the tied parameter: stays tied


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
