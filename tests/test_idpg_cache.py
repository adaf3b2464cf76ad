"""M(x) computed once per example and reused (IDPG section 3.1; computed in eval mode, M(x) is deterministic): through
``--task idpg_sentence_prediction`` on a slice of the real RTE files, training with the on-disk
cache equals recomputing M(x) every step, a later run reuses the rows, and the key keeps apart
backbones, splits, datasets, truncation budgets and dtypes."""

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from test_idpg_model import DIM, LAYERS, backbones  # noqa: F401  (fixture)

from fairseq_idpg.data.sentence_representation_cache import SLOT_SHIFT, SentenceRepresentationCache, cache_key
from fairseq_idpg.preprocessing.prepare import prepare

TRAIN_ROWS = 24  # of the real RTE train file; 3 batches of 8


def rte_slice(shared_data, tmp_path, rows, name):
    raw = tmp_path / f"raw-{name}"
    raw.mkdir()
    for split, n in (("train.tsv", rows), ("dev.tsv", 8)):
        lines = (shared_data / "glue" / "RTE" / split).read_text(encoding="utf-8").splitlines(keepends=True)
        (raw / split).write_text("".join(lines[: n + 1]), encoding="utf-8")
    return raw


@pytest.fixture(scope="module")
def rte(shared_data, tmp_path_factory, backbones):  # noqa: F811
    tmp = tmp_path_factory.mktemp("idpg_rte")
    vocab = str(backbones[0].folder / "vocab.txt")
    out = {}
    for name, rows in (("a", TRAIN_ROWS), ("b", TRAIN_ROWS - 1)):
        out[name] = tmp / f"bin-{name}"
        prepare(
            "RTE", str(rte_slice(shared_data, tmp, rows, name)), str(out[name]), bpe="wordpiece", vocab=vocab, workers=1
        )
    return out


def setup(data, backbone, cache_dir, *flags):
    """task + model as fairseq-train sets them up (the task builds the model, then loads splits)."""
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [
            str(data),
            "--user-dir",
            "fairseq_idpg",
            "--task",
            "idpg_sentence_prediction",
            "--criterion",
            "sentence_prediction",
            "--num-classes",
            "2",
            "--init-token",
            "0",
            "--separator-token",
            "2",
            "--arch",
            "roberta_idpg",
            "--encoder-layers",
            str(LAYERS),
            "--encoder-embed-dim",
            str(DIM),
            "--encoder-ffn-embed-dim",
            "64",
            "--encoder-attention-heads",
            "4",
            "--max-positions",
            "512",
            "--backbone",
            str(backbone.model_file),
            "--idpg-cache-dir",
            str(cache_dir),
            "--seed",
            "1",
            *flags,
        ],
    )
    task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    torch.manual_seed(0)
    model = task.build_model(args)
    return task, model


def batches(task, split, epoch=1):
    dataset = task.dataset(split)
    itr = task.get_batch_iterator(dataset, max_sentences=8, seed=1, epoch=epoch).next_epoch_itr(shuffle=True)
    return list(itr)


def train(task, model, epochs=2):
    """A few Adam steps (dropout on), returning every step's logits and the trained tensors."""
    task.load_dataset("train")
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    torch.manual_seed(5)
    logits = []
    for epoch in range(1, epochs + 1):
        for sample in batches(task, "train", epoch):
            out, _ = model(**sample["net_input"], classification_head_name="sentence_classification_head")
            F.cross_entropy(out, sample["target"].view(-1)).backward()
            optimizer.step()
            optimizer.zero_grad()
            logits.append(out.detach())
    return logits, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_training_with_the_cache_equals_recomputing_every_step(rte, backbones, tmp_path):  # noqa: F811
    cached_task, cached = setup(rte["a"], backbones[0], tmp_path, "--idpg-preset", "m-idpg-phm")
    plain_task, plain = setup(rte["a"], backbones[0], tmp_path, "--idpg-preset", "m-idpg-phm", "--idpg-cache", "off")
    calls = []
    compute = cached.compute_sentence_representation
    cached.compute_sentence_representation = lambda *a, **k: calls.append(1) or compute(*a, **k)
    logits_cached, params_cached = train(cached_task, cached)
    logits_plain, params_plain = train(plain_task, plain)
    assert "sentence_ids" in batches(cached_task, "train")[0]["net_input"]
    assert "sentence_ids" not in batches(plain_task, "train")[0]["net_input"]
    steps = len(logits_cached) // 2
    assert len(calls) == steps  # the first epoch computes each batch once, the second reads the cache
    assert all(torch.equal(a, b) for a, b in zip(logits_cached, logits_plain, strict=False))
    assert all(torch.equal(params_cached[n], params_plain[n]) for n in params_plain)

    # a later run (new task and model) finds every train row on disk, with the values it would compute
    task, model = setup(rte["a"], backbones[0], tmp_path, "--idpg-preset", "m-idpg-phm")
    task.load_dataset("train")
    cache = model._cache(0, "float32")
    assert cache.num_filled == cache.size == TRAIN_ROWS
    model.eval()
    for sample in batches(task, "train"):
        ids = (sample["net_input"]["sentence_ids"] & ((1 << SLOT_SHIFT) - 1)).numpy()
        values, filled = cache.lookup(ids)
        assert filled.all() and np.array_equal(
            values, model.compute_sentence_representation(sample["net_input"]["src_tokens"]).numpy()
        )


def cache_folder(data, backbone, cache_dir, split, *flags):
    task, model = setup(data, backbone, cache_dir, *flags)
    task.load_dataset(split)
    return model._cache(0, "float32").path


def test_key_separates_backbones_splits_datasets_and_budgets(rte, backbones, tmp_path):  # noqa: F811
    base = ("--idpg-preset", "s-idpg-phm")
    reference = cache_folder(rte["a"], backbones[0], tmp_path, "train", *base)
    assert reference == cache_folder(
        rte["a"], backbones[0], tmp_path, "train", *base, "--idpg-hidden", "32"
    )  # M(x) does not depend on G
    others = [
        cache_folder(rte["a"], backbones[1], tmp_path, "train", *base),  # another backbone
        cache_folder(rte["a"], backbones[0], tmp_path, "valid", *base),  # another split
        cache_folder(rte["b"], backbones[0], tmp_path, "train", *base),  # another dataset
        cache_folder(
            rte["a"], backbones[0], tmp_path, "train", *base, "--idpg-prompt-length", "300"
        ),  # truncation budget
    ]
    assert len({reference, *others}) == 5
    assert all(os.path.dirname(p) == str(tmp_path) for p in others)


def test_dtype_is_part_of_the_key(rte, backbones, tmp_path):  # noqa: F811
    task, model = setup(rte["a"], backbones[0], tmp_path, "--idpg-preset", "m-idpg-phm")
    task.load_dataset("valid")
    sample = batches(task, "valid")[0]
    model.eval()
    full, _ = model(**sample["net_input"], classification_head_name="sentence_classification_head")
    assert model._cache(0, "float32").num_filled == len(sample["id"])
    assert model._cache(0, "bfloat16").num_filled == 0
    model.to(torch.bfloat16)
    half, _ = model(**sample["net_input"], classification_head_name="sentence_classification_head")
    assert half.dtype == torch.bfloat16 and torch.allclose(half.float(), full, atol=0.1)
    assert model._cache(0, "float32").path != model._cache(0, "bfloat16").path
    assert model._cache(0, "bfloat16").num_filled == len(sample["id"])


def test_cache_rows_persist_and_shapes_are_checked(tmp_path):
    key = cache_key({"any": "thing"})
    cache = SentenceRepresentationCache(10, 4, key, str(tmp_path), {"note": "test"})
    cache.store([3, 7], np.arange(8, dtype=np.float32).reshape(2, 4))
    again = SentenceRepresentationCache(10, 4, key, str(tmp_path))
    values, filled = again.lookup([7, 3, 0])
    assert filled.tolist() == [True, True, False] and values[0].tolist() == [4, 5, 6, 7]
    with pytest.raises(RuntimeError, match=r"holds \(10, 4\), expected \(11, 4\)"):
        SentenceRepresentationCache(11, 4, key, str(tmp_path))
    memory = SentenceRepresentationCache(10, 4)
    assert memory.path is None and memory.num_filled == 0
