"""The conversion run: a Hugging Face BERT or RoBERTa folder -> a fairseq RoBERTa model folder.

``convert(HF_DIR, OUT_DIR)`` writes what ``RobertaModel.from_pretrained(OUT_DIR, "model.pt", ...)``
and ``fairseq-train --restore-file OUT_DIR/model.pt`` read:

- ``model.pt``: a checkpoint in the layout fairseq 0.12.2's trainer writes (``weights``);
- ``dict.txt``: the fairseq dictionary (the task appends ``<mask>``);
- BERT: ``vocab.txt`` (+ ``tokenizer_config.json``) for ``--bpe wordpiece``;
  RoBERTa: ``encoder.json`` + ``vocab.bpe`` for ``--bpe gpt2`` (``vocab``).

Every input check runs before the first file is written (staging happens in a temporary folder);
each file is written atomically, ``model.pt`` last. docs/standin.md describes the result.
"""

import json
import logging
import os
import tempfile
import time
from typing import Dict, List, Optional, Tuple

from ..files import atomic_copy, atomic_write_text, save_torch
from .errors import ConversionError
from .source import _config_int, inspect_source, load_hf_state_dict
from .vocab import (
    gpt2_bpe_args,
    gpt2_vocab_bpe_text,
    read_merges,
    roberta_dictionary_symbols,
    wordpiece_bpe_args,
    wordpiece_dictionary_order,
    write_wordpiece_dict,
    write_wordpiece_vocab,
)
from .weights import (
    FAIRSEQ_LAYER_NORM_EPS,
    _Weights,
    build_fairseq_roberta,
    checkpoint_state,
    load_mapped_weights,
    map_weights,
)

logger = logging.getLogger("fairseq_idpg.conversion")


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
    save_torch(checkpoint, os.path.join(out_dir, "model.pt"))


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
            vocab_file = src.vocab_files["vocab.txt"]
            order = wordpiece_dictionary_order(vocab_file)
            write_wordpiece_dict(vocab_file, staged_dict)
            bpe_args = wordpiece_bpe_args(os.path.join(out_dir, "vocab.txt"))
        else:
            vocab_size = _config_int(src.config, "vocab_size", os.path.join(src.hf_dir, "config.json"))
            merges = read_merges(src.vocab_files["merges.txt"])
            symbols, encoder = roberta_dictionary_symbols(src.vocab_files["vocab.json"], merges, vocab_size)
            order = list(range(vocab_size))
            with open(staged_dict, "w", encoding="utf-8") as f:
                f.writelines(f"{s} 1\n" for s in symbols)
            bpe_args = gpt2_bpe_args(os.path.join(out_dir, "encoder.json"), os.path.join(out_dir, "vocab.bpe"))

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
        load_mapped_weights(model, mapped)

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
