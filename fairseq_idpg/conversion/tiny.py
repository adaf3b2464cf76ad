"""Tiny randomly initialised fairseq RoBERTa folders for tests.

``write_tiny_roberta(out_dir)`` writes ``model.pt`` (the same checkpoint layout as
``scripts/convert_hf_to_fairseq.py``: a stock ``--arch roberta`` model built by fairseq's option
parser, task ``masked_lm``), ``dict.txt`` and the WordPiece ``vocab.txt`` (+
``tokenizer_config.json``). By default the vocabulary is the offline stand-in's (all-MiniLM-L6-v2's
``vocab.txt``), so the folder pairs with data prepared with ``--bpe wordpiece`` for the stand-in. With ``bpe_dir``
(a GPT-2 BPE folder: ``dict.txt``, ``encoder.json``, ``vocab.bpe``, e.g. ../shared/roberta_bpe) the
folder has RoBERTa's own 50,265-entry dictionary and GPT-2 BPE files instead, as roberta.base and
roberta.large have, and pairs with data prepared with ``--bpe gpt2``:

    from fairseq_idpg.conversion.tiny import write_tiny_roberta
    out = write_tiny_roberta(tmp_path / "tiny")          # 2 layers x 32, 4 heads, ffn 64
    hub = RobertaModel.from_pretrained(out, "model.pt", user_dir=..., bpe="wordpiece",
                                       wordpiece_vocab=os.path.join(out, "vocab.txt"))
    base = write_tiny_roberta(tmp_path / "base", layers=12, dim=768, heads=12, ffn=3072,
                              bpe_dir="../shared/roberta_bpe")   # roberta.base's sizes, random weights

The weights are fairseq's own initialisation (``init_bert_params``) under ``seed``; the global
RNG state is left as it was.
"""

import os
import tempfile
from typing import Optional

from ..files import atomic_copy
from .convert import write_model_folder
from .source import standin_source_dir
from .vocab import gpt2_bpe_args, wordpiece_bpe_args, write_wordpiece_dict
from .weights import build_fairseq_roberta, checkpoint_state

GPT2_FILES = ("dict.txt", "encoder.json", "vocab.bpe")


def write_tiny_roberta(
    out_dir,
    layers: int = 2,
    dim: int = 32,
    heads: int = 4,
    ffn: int = 64,
    vocab_file: Optional[str] = None,
    seed: int = 0,
    max_positions: int = 512,
    bpe_dir: Optional[str] = None,
) -> str:
    """Write a random fairseq RoBERTa folder; returns its absolute path (a str)."""
    import torch

    if dim % heads:
        raise ValueError(f"dim {dim} is not divisible by heads {heads}")
    if bpe_dir is not None and vocab_file is not None:
        raise ValueError("give vocab_file (WordPiece) or bpe_dir (GPT-2 BPE), not both")
    out_dir = os.path.abspath(os.fspath(out_dir))
    if bpe_dir is not None:
        bpe_dir = os.path.abspath(os.fspath(bpe_dir))
        missing = [f for f in GPT2_FILES if not os.path.isfile(os.path.join(bpe_dir, f))]
        if missing:
            raise ValueError(f"bpe_dir {bpe_dir}: {', '.join(missing)} not found (a GPT-2 BPE folder has {GPT2_FILES})")
        bpe_args = gpt2_bpe_args(os.path.join(out_dir, "encoder.json"), os.path.join(out_dir, "vocab.bpe"))
    else:
        vocab_file = os.path.abspath(vocab_file or os.path.join(standin_source_dir(), "vocab.txt"))
        bpe_args = wordpiece_bpe_args(os.path.join(out_dir, "vocab.txt"))
    with tempfile.TemporaryDirectory(prefix="tiny-roberta.") as staging:
        staged_dict = os.path.join(staging, "dict.txt")
        if bpe_dir is not None:
            atomic_copy(os.path.join(bpe_dir, "dict.txt"), staged_dict)
        else:
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
                bpe_args=bpe_args,
            )
        info = {"source": "random", "seed": seed, "vocab": vocab_file or bpe_dir, "lm_head": "random"}
        checkpoint = checkpoint_state(cfg, model, out_dir, info)
        if bpe_dir is not None:  # the tokenizer files before model.pt, whose presence means a complete folder
            os.makedirs(out_dir, exist_ok=True)
            for name in GPT2_FILES[1:]:
                atomic_copy(os.path.join(bpe_dir, name), os.path.join(out_dir, name))
        write_model_folder(out_dir, staged_dict, checkpoint, wordpiece_vocab=vocab_file)
    return out_dir
