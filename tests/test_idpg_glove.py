"""GloVe sentence encoder (IDPG Eq. 5) on small GloVe-format files the tests write; token ids back
to words (WordPiece and RoBERTa's GPT-2 BPE); M-IDPG-PHM-GloVe precomputes the sentence vectors
once per example when a split loads."""

import types

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary
from test_idpg_cache import TRAIN_ROWS, batches, rte, setup  # noqa: F401  (fixtures)
from test_idpg_model import backbones  # noqa: F401  (fixture)

from fairseq_idpg.modules.prompts.detokenize import Detokenizer, is_gpt2_dictionary
from fairseq_idpg.modules.prompts.glove import GloveSentenceEncoder, read_glove_dim, sentence_words

VECTORS = {"the": [1, 0, 0, 0], "cat": [0, 2, 0, 0], "sat": [0, 0, 3, 0], "dont": [0, 0, 0, 4], "mat": [5, 5, 5, 5]}


def write_glove(path, vectors=VECTORS):
    with open(path, "w", encoding="utf-8") as f:
        for word, v in vectors.items():
            f.write(word + " " + " ".join(f"{x:.1f}" for x in v) + "\n")
    return path


def test_eq5_mean_of_known_lowercased_words_without_punctuation(tmp_path):
    glove = GloveSentenceEncoder(write_glove(tmp_path / "g.txt"))
    assert glove.dim == 4
    assert sentence_words("The cat, sat! Don't -- ") == ["the", "cat", "sat", "dont"]
    out = glove.encode_texts(["The cat, sat!", "CAT the unknown", "nothing known here", "Don't"])
    v = {w: np.array(x, dtype=np.float32) for w, x in VECTORS.items()}
    assert np.allclose(out[0], (v["the"] + v["cat"] + v["sat"]) / 3)
    assert np.allclose(out[1], (v["cat"] + v["the"]) / 2)  # unknown words are left out of the mean
    assert np.array_equal(out[2], np.zeros(4))  # Decision: no known word -> zero vector
    assert np.allclose(out[3], v["dont"])
    assert "mat" not in glove._vectors  # only the words the inputs contain are read


def test_not_a_glove_file(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("just some words\n")
    with pytest.raises(ValueError, match="not a GloVe text file"):
        read_glove_dim(bad)
    with pytest.raises(FileNotFoundError, match="--idpg-glove-vectors .*absent.txt: cannot read it"):
        read_glove_dim(tmp_path / "absent.txt")


def test_wordpiece_ids_back_to_words(backbones):  # noqa: F811
    from fairseq_idpg.encoders.wordpiece import WordpieceBPE

    d = Dictionary.load(str(backbones[0].folder / "dict.txt"))
    bpe = WordpieceBPE(
        types.SimpleNamespace(wordpiece_vocab=str(backbones[0].folder / "vocab.txt"), wordpiece_cased=False)
    )
    ids = lambda text: d.encode_line(bpe.encode(text), add_if_not_exist=False, append_eos=True).tolist()  # noqa: E731
    row = [d.bos()] + ids("The Unbelievable cat, sat!") + [d.eos()] + ids("Hello world.") + [d.pad()] * 2
    assert not is_gpt2_dictionary(d)
    text = Detokenizer(d).decode(row)
    assert text == "the unbelievable cat , sat ! hello world ."
    assert sentence_words(text) == ["the", "unbelievable", "cat", "sat", "hello", "world"]


def test_gpt2_ids_back_to_text(roberta_bpe):
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    d = Dictionary.load(str(roberta_bpe / "dict.txt"))
    encoder = get_encoder(str(roberta_bpe / "encoder.json"), str(roberta_bpe / "vocab.bpe"))
    ids = lambda text: d.encode_line(
        " ".join(map(str, encoder.encode(text))), add_if_not_exist=False, append_eos=True
    ).tolist()  # noqa: E731
    row = [d.bos()] + ids("Hello world, it's café time.") + [d.eos()] + ids("A second one") + [d.pad()]
    assert is_gpt2_dictionary(d)
    assert Detokenizer(d, [roberta_bpe]).decode(row) == "Hello world, it's café time. A second one"
    with pytest.raises(FileNotFoundError, match="--idpg-glove-bpe-dir: GPT-2 encoder.json not found"):
        Detokenizer(d, [roberta_bpe / "absent"])


def test_glove_vectors_are_precomputed_once_per_example(rte, backbones, tmp_path):  # noqa: F811
    words = {
        w: np.random.default_rng(len(w)).normal(size=300).round(3) for w in ("the", "a", "of", "in", "to", "is", "was")
    }
    glove = str(write_glove(tmp_path / "glove.test.300d.txt", words))
    flags = ("--idpg-preset", "m-idpg-phm-glove", "--idpg-glove-vectors", glove)
    task, model = setup(rte["a"], backbones[0], tmp_path / "cache", *flags)
    texts = []
    encode = model.glove.encode_texts
    model.glove.encode_texts = lambda t: texts.extend(t) or encode(t)
    task.load_dataset("train")
    cache = model._cache(0, "float32")
    assert len(texts) == cache.num_filled == cache.size == TRAIN_ROWS  # all at load time, once each
    model.glove.encode_tokens = None  # forward passes never go back to the text
    model.eval()
    for sample in batches(task, "train"):
        ids = sample["id"].numpy()
        values, _ = cache.lookup(ids)
        assert np.array_equal(values, encode([texts[i] for i in ids]))  # row i = example i's text
        logits, _ = model(**sample["net_input"], classification_head_name="sentence_classification_head")
        assert torch.isfinite(logits).all()

    task2, model2 = setup(rte["a"], backbones[0], tmp_path / "cache", *flags)  # a later run: from disk
    model2.glove.encode_texts = lambda t: pytest.fail("recomputed GloVe vectors that were on disk")
    task2.load_dataset("train")
    assert model2._cache(0, "float32").num_filled == TRAIN_ROWS
