"""The Hugging Face model that computes what a frozen fairseq backbone computes, and its tensor names.

An exported adapter is written for a Hugging Face model, and an imported one is read against it:

- the offline stand-in (all-MiniLM-L6-v2 converted, not RoBERTa): the original BERT folder the
  converter started from (``conversion.source`` in the stand-in's model.pt). Its vocabulary is in BERT
  order: ``token_order[i]`` is the BERT id of fairseq symbol i. LayerNorm epsilon 1e-12 there, 1e-5
  here (fairseq's, fixed): the only numerical difference (docs/standin.md: hidden states within 0.006);
- any other fairseq RoBERTa (roberta.base, roberta.large, the tests' tiny ones): ``RobertaModel``
  converted here (``write_hf_roberta``), the inverse of ``conversion.weights.map_weights``: the same
  token ids, positions offset by padding_idx + 1 on both sides, one all-zero token type, LayerNorm
  epsilon 1e-5 on both sides, exact GELU on both sides.

The classification head: fairseq's is dense -> tanh -> out_proj on the first token (``<s>``);
``RobertaForSequenceClassification.classifier`` is the same module under the same names;
``BertForSequenceClassification`` splits it into BERT's pooler (dense + tanh on ``[CLS]``) and
``classifier`` (the out_proj Linear). ``HEAD_NAMES`` maps ours onto each.
"""

import json
import os
from typing import List, NamedTuple, Optional

from fairseq_idpg.conversion.weights import FAIRSEQ_LAYER_NORM_EPS, LAYER_PAIRS
from fairseq_idpg.errors import ConfigError

ENCODER = "encoder.sentence_encoder."
# our head's modules -> the Hugging Face modules that hold them, per model type (module docstring)
HEAD_NAMES = {
    "roberta": {"dense": "classifier.dense", "out_proj": "classifier.out_proj"},
    "bert": {"dense": "bert.pooler.dense", "out_proj": "classifier"},
}
# PEFT's modules_to_save: the Hugging Face modules the head occupies (whole modules, by name)
HEAD_MODULES = {"roberta": ["classifier"], "bert": ["pooler", "classifier"]}


class HFBackbone(NamedTuple):
    """``model_type`` ("bert" or "roberta"), its folder ``path``, ``token_order`` (fairseq id -> its
    id; None when they are the same) and ``layer_norm_eps``."""

    model_type: str
    path: str
    token_order: Optional[List[int]]
    layer_norm_eps: float

    @property
    def base(self):
        """The encoder's attribute in ``*ForSequenceClassification`` ("bert" / "roberta")."""
        return self.model_type

    def layer(self, index, module=""):
        """Full name of a module of encoder layer ``index`` (``attention.self.query``, ...)."""
        return f"{self.base}.encoder.layer.{index}" + (f".{module}" if module else "")

    def hf_ids(self, fairseq_tokens):
        """Token ids [B, T] in this model's vocabulary (a gather; the same tensor when the order is ours)."""
        import torch

        if self.token_order is None:
            return fairseq_tokens
        return torch.tensor(self.token_order, dtype=torch.long)[fairseq_tokens]


EMBEDDINGS = ("word_embeddings", "position_embeddings", "token_type_embeddings", "LayerNorm")


def module_names(hf, layers):
    """The names of ``hf``'s ``*ForSequenceClassification`` modules that hold weights (embeddings, every
    layer's, the head's) and of every module above them, as ``named_modules()`` gives them and PEFT matches
    them (``interop/peft_config.py``)."""
    leaves = [f"{hf.base}.embeddings.{name}" for name in EMBEDDINGS]
    leaves += [hf.layer(i, name) for i in range(layers) for name, _ in LAYER_PAIRS]
    leaves += list(HEAD_NAMES[hf.model_type].values())
    names = {".".join(leaf.split(".")[:k]) for leaf in leaves for k in range(1, leaf.count(".") + 2)}
    return sorted(names)


def read_backbone_checkpoint(path):
    """The whole fairseq checkpoint at ``path`` (``model``, ``cfg``, and ``conversion`` when converted)."""
    from fairseq_idpg.models.frozen_roberta import load_checkpoint_file, read_backbone

    read_backbone(path)  # one line for a missing file, a folder, or not a checkpoint
    return load_checkpoint_file(path)


def hf_backbone_for(backbone_path, out_dir=None):
    """The Hugging Face model of the fairseq backbone at ``backbone_path``: the stand-in's original
    BERT, else a ``RobertaModel`` written to ``out_dir`` (None: not written; ``path`` is then None)."""
    state = read_backbone_checkpoint(backbone_path)
    conversion = state.get("conversion") or {}
    source = conversion.get("source")
    if conversion.get("model_type") == "bert":
        if not source or not os.path.isfile(os.path.join(source, "config.json")):
            raise ConfigError(
                f"--backbone {backbone_path}: converted from the BERT folder {source}, which is gone; "
                f"rebuild the stand-in (bash scripts/build_standin.sh) so that its source is known"
            )
        from fairseq_idpg.encoders.wordpiece import vocab_to_dictionary_order

        order = vocab_to_dictionary_order(os.path.join(source, "vocab.txt"))
        eps = json.load(open(os.path.join(source, "config.json"))).get("layer_norm_eps", 1e-12)
        return HFBackbone("bert", source, order, eps)
    if out_dir is not None:
        write_hf_roberta(state, out_dir)
    return HFBackbone("roberta", out_dir, None, FAIRSEQ_LAYER_NORM_EPS)


def model_cfg(state):
    """The model options of a fairseq checkpoint (``cfg.model``, a Namespace or a dict) as a dict."""
    cfg = state.get("cfg")
    model = cfg["model"] if cfg is not None else state["args"]
    return dict(model) if isinstance(model, dict) else vars(model)


def hf_roberta_config(options, vocab_size, positions):
    """config.json of the ``RobertaModel`` equal to a fairseq RoBERTa with these model options."""
    if options.get("activation_fn", "gelu") != "gelu" or options.get("encoder_normalize_before"):
        raise ConfigError(
            "the backbone is not a post-LayerNorm GELU RoBERTa (activation "
            f"{options.get('activation_fn')}, normalize_before {options.get('encoder_normalize_before')}): "
            "transformers' RobertaModel cannot compute it"
        )
    return {
        "architectures": ["RobertaModel"],
        "model_type": "roberta",
        "vocab_size": vocab_size,
        "hidden_size": options["encoder_embed_dim"],
        "num_hidden_layers": options["encoder_layers"],
        "num_attention_heads": options["encoder_attention_heads"],
        "intermediate_size": options["encoder_ffn_embed_dim"],
        "hidden_act": "gelu",
        "hidden_dropout_prob": options.get("dropout", 0.1),
        "attention_probs_dropout_prob": options.get("attention_dropout", 0.1),
        "max_position_embeddings": positions,
        "type_vocab_size": 1,
        "layer_norm_eps": FAIRSEQ_LAYER_NORM_EPS,
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "initializer_range": 0.02,
    }


def hf_roberta_weights(weights, num_layers, prefix="roberta."):
    """The fairseq encoder ``weights`` under ``RobertaModel``'s names (``prefix`` before each)."""
    import torch

    enc = ENCODER
    dim = weights[enc + "embed_tokens.weight"].shape[1]
    out = {
        "embeddings.word_embeddings.weight": weights[enc + "embed_tokens.weight"],
        "embeddings.position_embeddings.weight": weights[enc + "embed_positions.weight"],
        "embeddings.token_type_embeddings.weight": torch.zeros(1, dim),
        "embeddings.LayerNorm.weight": weights[enc + "layernorm_embedding.weight"],
        "embeddings.LayerNorm.bias": weights[enc + "layernorm_embedding.bias"],
    }
    for i in range(num_layers):
        for hf_name, fs_name in LAYER_PAIRS:
            for kind in ("weight", "bias"):
                out[f"encoder.layer.{i}.{hf_name}.{kind}"] = weights[f"{enc}layers.{i}.{fs_name}.{kind}"]
    return {prefix + k: v.float().contiguous() for k, v in out.items()}


def write_hf_roberta(state, out_dir):
    """Write ``out_dir``/config.json and model.safetensors: the fairseq RoBERTa checkpoint ``state`` as
    transformers' ``RobertaModel`` (no LM head: an adapter needs the encoder only)."""
    from fairseq_idpg.files import save_safetensors, write_json

    options, weights = model_cfg(state), state["model"]
    vocab, positions = (weights[ENCODER + f"{name}.weight"].shape[0] for name in ("embed_tokens", "embed_positions"))
    config = hf_roberta_config(options, vocab, positions)
    os.makedirs(out_dir, exist_ok=True)
    tensors = hf_roberta_weights(weights, options["encoder_layers"], prefix="")
    save_safetensors(tensors, os.path.join(out_dir, "model.safetensors"))  # atomically
    write_json(config, os.path.join(out_dir, "config.json"))
    return out_dir
