"""peft_sentence_prediction: truncation that leaves room for inserted tokens."""

import numpy as np
import pytest
import torch
from fairseq.data import ListDataset

from fairseq_idpg.data import TruncatedSentencesDataset, longest_first_lengths


def longest_first_reference(a, b, budget):
    """Token-at-a-time longest-first truncation (the definition)."""
    while a + b > budget:
        if a > b:
            a -= 1
        else:
            b -= 1
    return a, b


def test_closed_form_equals_token_by_token_truncation():
    rng = np.random.default_rng(0)
    len_a, len_b = rng.integers(0, 60, 500), rng.integers(0, 60, 500)
    for budget in (0, 1, 7, 30, 59, 200):
        kept_a, kept_b = longest_first_lengths(len_a, len_b, budget)
        ref = np.array([longest_first_reference(a, b, budget) for a, b in zip(len_a, len_b, strict=False)])
        assert np.array_equal(kept_a, ref[:, 0]) and np.array_equal(kept_b, ref[:, 1]), budget


def _sentences(lengths, start):
    """Binarized sentences as fairseq-preprocess writes them: tokens then </s> (2)."""
    items = [torch.cat([torch.arange(start, start + n), torch.tensor([2])]) for n in lengths]
    return ListDataset(items, sizes=np.array([len(x) for x in items]))


def test_pair_layout_and_budget():
    first, second = _sentences([10, 3, 2], 100), _sentences([4, 20, 1], 500)
    ds = TruncatedSentencesDataset(first, second, init_token=0, separator_token=2, max_tokens=12)
    # 12 tokens - 4 specials = 8 text tokens, longest first
    assert ds[0].tolist() == [0, 100, 101, 102, 103, 2, 2, 500, 501, 502, 503, 2]
    assert ds[1].tolist() == [0, 100, 101, 102, 2, 2, 500, 501, 502, 503, 504, 2]
    assert ds[2].tolist() == [0, 100, 101, 2, 2, 500, 2]  # short: untouched
    assert ds.sizes.tolist() == [len(ds[i]) for i in range(3)] == [12, 12, 7]
    assert ds.num_truncated == 2


def test_single_sentence_keeps_final_eos():
    ds = TruncatedSentencesDataset(_sentences([10], 100), None, init_token=0, separator_token=2, max_tokens=5)
    assert ds[0].tolist() == [0, 100, 101, 102, 2]


def test_budget_too_small_for_specials():
    with pytest.raises(ValueError, match="--max-positions leaves 3 tokens"):
        TruncatedSentencesDataset(_sentences([3], 1), _sentences([3], 1), 0, 2, max_tokens=3)


def test_task_reserves_inserted_tokens(tmp_path):
    """The hook: a model's num_inserted_tokens shrinks the budget of datasets loaded after it."""
    from fairseq.data import Dictionary, indexed_dataset

    d = Dictionary()
    for w in "abcdefgh":
        d.add_symbol(w)
    data = tmp_path / "bin"
    for key, lines in {"input0": ["a b c d e f g h", "a b"], "label": ["0", "1"]}.items():
        (data / key).mkdir(parents=True)
        dictionary = d if key == "input0" else Dictionary()
        if key == "label":
            dictionary.add_symbol("0"), dictionary.add_symbol("1")
        dictionary.save(str(data / key / "dict.txt"))
        builder = indexed_dataset.make_builder(str(data / key / "valid.bin"), impl="mmap", vocab_size=len(dictionary))
        for line in lines:
            builder.add_item(dictionary.encode_line(line, add_if_not_exist=False, append_eos=True).long())
        builder.finalize(str(data / key / "valid.idx"))

    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [
            str(data),
            "--user-dir",
            "fairseq_idpg",
            "--task",
            "peft_sentence_prediction",
            "--num-classes",
            "2",
            "--criterion",
            "sentence_prediction",
            "--arch",
            "roberta",
            "--init-token",
            "0",
            "--separator-token",
            "2",
            "--max-positions",
            "8",
        ],
    )
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.set_num_inserted_tokens(3)
    ds = task.load_dataset("valid")
    sizes = sorted(len(ds[i]["net_input.src_tokens"]) for i in range(2))
    assert sizes == [4, 5]  # 8 positions - 3 inserted = 5: <s> a b c </s>
    assert ds[0]["target"].item() in (0, 1)

    with pytest.raises(ValueError, match="do not fit --max-positions 8"):
        task.set_num_inserted_tokens(6)
    with pytest.raises(RuntimeError, match="loaded before the model was built"):
        task.set_num_inserted_tokens(2)


def test_task_json_provenance_round_trip(tmp_path):
    """task.json records what the data was made from; files written before that field still read (None)."""
    import json

    from fairseq_idpg.data.task_info import TaskInfo

    origin = {"raw": "/raw/RTE", "raw_sha256": {"train.tsv": "ab", "dev.tsv": "cd"}, "bpe": "gpt2",
              "bpe_sha256": {"encoder.json": "ef"}, "few_shot": None, "dev_from_train": None, "seed": None}  # fmt: skip
    info = TaskInfo("RTE", 2, False, True, "accuracy", {"train": 2490, "valid": 277}, bpe="gpt2", provenance=origin)
    info.write(tmp_path)
    assert TaskInfo.exists(tmp_path) and TaskInfo.read(tmp_path) == info
    old = {k: v for k, v in info.to_dict().items() if k != "provenance"}
    (tmp_path / "task.json").write_text(json.dumps({**old, "doubled_by_swapping": True}))
    read = TaskInfo.read(tmp_path)
    assert read.provenance is None and read.extra == {"doubled_by_swapping": True}
    assert not TaskInfo.exists(tmp_path / "nothing")
