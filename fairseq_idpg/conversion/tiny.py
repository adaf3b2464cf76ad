"""Tiny randomly initialised fairseq RoBERTa folders for tests.

``write_tiny_roberta(out_dir)`` writes ``model.pt`` (the same checkpoint layout as
``scripts/convert_hf_to_fairseq.py``: a stock ``--arch roberta`` model built by fairseq's option
parser, task ``masked_lm``), ``dict.txt`` and the WordPiece ``vocab.txt`` (+
``tokenizer_config.json``). By default the vocabulary is the offline stand-in's (all-MiniLM-L6-v2's
``vocab.txt``), so the folder pairs with data prepared with ``--bpe wordpiece`` for the stand-in:

    from fairseq_idpg.conversion.tiny import write_tiny_roberta
    out = write_tiny_roberta(tmp_path / "tiny")          # 2 layers x 32, 4 heads, ffn 64
    hub = RobertaModel.from_pretrained(out, "model.pt", user_dir=..., bpe="wordpiece",
                                       wordpiece_vocab=os.path.join(out, "vocab.txt"))

The weights are fairseq's own initialisation (``init_bert_params``) under ``seed``; the global
RNG state is left as it was.
"""

import os
import tempfile
from typing import Optional

from .convert import write_model_folder
from .source import standin_source_dir
from .vocab import wordpiece_bpe_args, write_wordpiece_dict
from .weights import build_fairseq_roberta, checkpoint_state


def write_tiny_roberta(
    out_dir,
    layers: int = 2,
    dim: int = 32,
    heads: int = 4,
    ffn: int = 64,
    vocab_file: Optional[str] = None,
    seed: int = 0,
    max_positions: int = 512,
) -> str:
    """Write a random fairseq RoBERTa folder; returns its absolute path (a str)."""
    import torch

    if dim % heads:
        raise ValueError(f"dim {dim} is not divisible by heads {heads}")
    vocab_file = os.path.abspath(vocab_file or os.path.join(standin_source_dir(), "vocab.txt"))
    out_dir = os.path.abspath(os.fspath(out_dir))
    with tempfile.TemporaryDirectory(prefix="tiny-roberta.") as staging:
        staged_dict = os.path.join(staging, "dict.txt")
        write_wordpiece_dict(vocab_file, staged_dict)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            cfg, _, model = build_fairseq_roberta(
                staging,
                layers,
                dim,
                heads,
                ffn,
                max_positions,
                bpe_args=wordpiece_bpe_args(os.path.join(out_dir, "vocab.txt")),
            )
        info = {"source": "random", "seed": seed, "vocab": vocab_file, "lm_head": "random"}
        checkpoint = checkpoint_state(cfg, model, out_dir, info)
        write_model_folder(out_dir, staged_dict, checkpoint, wordpiece_vocab=vocab_file)
    return out_dir
