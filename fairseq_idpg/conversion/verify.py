"""Verification: load a converted folder the way users do and compare it with ``transformers``.

``verify`` encodes real sentences (SST-2 dev singles, RTE dev pairs; built-in ones when no GLUE
data is found) with both tokenizers, checks that the token ids map one to one, and compares the
final hidden states (and the LM logits when the source has an MLM head) by cosine. The measured
agreement on the stand-in is in docs/standin.md.
"""

import csv
import logging
import os
from pathlib import Path
from typing import Optional, Sequence, Tuple

from .errors import VerificationError
from .source import inspect_source, load_hf_state_dict

logger = logging.getLogger("fairseq_idpg.conversion")

USER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../fairseq_idpg
FALLBACK_SENTENCES = [
    "it 's a charming and often affecting journey .",
    "Hello world",
    "The quick brown fox jumps over the lazy dog, doesn't it?",
]
FALLBACK_PAIRS = [
    ("A man is playing a guitar on stage.", "Someone is performing music."),
]


# ---------------------------------------------------------------- loading the converted folder
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


# ---------------------------------------------------------------- test sentences
def dev_file(task, glue_dir=None):
    """``glue_dir/<task>/dev.tsv`` when given, else the first found where the main job looks (``$GLUE_DIR``, the
    checkout's data/ from scripts/download.sh, ...); None if none has it."""
    from fairseq_idpg.layout import raw_places

    places = [Path(glue_dir) / task] if glue_dir else [place for _, place in raw_places(task)]
    return next((str(p / "dev.tsv") for p in places if (p / "dev.tsv").is_file()), None)


def glue_examples(glue_dir: Optional[str] = None, n_single: int = 8, n_pairs: int = 4):
    """A few real sentences (SST-2 dev) and sentence pairs (RTE dev); built-in ones if absent."""

    def rows(task, columns, n):
        path = dev_file(task, glue_dir)
        if path is None:
            return []
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            return [tuple(r[c].strip() for c in columns) for _, r in zip(range(n), reader, strict=False)]

    singles = [s for (s,) in rows("SST-2", ("sentence",), n_single)]
    pairs = rows("RTE", ("sentence1", "sentence2"), n_pairs)
    if not singles and not pairs:
        logger.info("no GLUE dev files under %s: verifying on built-in sentences", glue_dir)
        return list(FALLBACK_SENTENCES), list(FALLBACK_PAIRS)
    return singles, pairs


# ---------------------------------------------------------------- comparison
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
