"""Two record sets of the same runs compared run by run (fairseq_idpg/results/paired.py): pairs by cell, lr and
seed; the paired difference, its t-test and the verdict against the seeds' spread; runs on one side only."""

import pytest
from records_support import write_record

from fairseq_idpg.results.paired import main, paired
from fairseq_idpg.results.records import read_records

A = {1: 70.0, 2: 72.0, 3: 74.0}


def sets(tmp_path, b_scores, extra_b_seed=None):
    for seed, score in A.items():
        write_record(tmp_path / "a", seed=seed, few_shot=1000, data_seed=1, dev=80.0, test=score)
    for seed, score in b_scores.items():
        write_record(tmp_path / "b", seed=seed, few_shot=1000, data_seed=1, dev=80.0, test=score)
    if extra_b_seed:
        write_record(tmp_path / "b", seed=extra_b_seed, few_shot=1000, data_seed=1, dev=80.0, test=50.0)
    return read_records([tmp_path / "a"]), read_records([tmp_path / "b"])


def test_a_shift_within_the_seeds_spread_agrees(tmp_path):
    table, lonely = paired(*sets(tmp_path, {1: 71.0, 2: 72.0, 3: 76.0}, extra_b_seed=9))
    (row,) = table.to_dict("records")
    assert (row["n"], row["mean_a"], row["mean_b"]) == (3, 72.0, pytest.approx(73.0))
    assert row["difference"] == pytest.approx(1.0) and row["std_a"] == pytest.approx(2.0)
    assert row["verdict"] == "agree" and 0.05 < row["p"] < 1
    assert lonely["seed"].tolist() == [9]  # seed 9 only in b: left out of the pairs


def test_a_shift_beyond_the_seeds_spread_differs(tmp_path, capsys):
    table, _ = paired(*sets(tmp_path, {1: 75.0, 2: 77.5, 3: 79.0}))
    (row,) = table.to_dict("records")
    assert row["difference"] == pytest.approx(5.1666, abs=1e-3) and row["verdict"] == "differ" and row["p"] < 0.01
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--names", "alone", "fused"]) == 0
    out = capsys.readouterr().out
    assert (
        "| alone | fused | fused - alone (paired) |" in out
        and "| 72.0 ± 2.0 | 77.2 ± 2.0 | +5.2 ± 0.3 | 0.00 | differ |" in out
    )


def test_no_pairs_is_an_error_in_one_line(tmp_path, capsys):
    write_record(tmp_path / "a", seed=1, dev=80.0)
    write_record(tmp_path / "b", seed=2, dev=80.0)
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_one_pair_has_no_verdict(tmp_path):
    """A cell with one seed on both sides has no spread: neither "agree" nor "differ" (a sweep still running)."""
    table, _ = paired(*sets(tmp_path, {1: 75.0}))
    (row,) = table.to_dict("records")
    assert (row["n"], row["difference"], row["verdict"]) == (1, 5.0, "one seed")


def test_two_methods_of_one_record_set_are_paired_by_seed_each_at_its_chosen_lr(tmp_path, capsys):
    """``--methods A B``: each method at the lr of its best mean dev score, B's run of a seed against A's of that
    seed; a seed one method lacks is left out and said."""
    for seed, (a, b) in {1: (70.0, 74.0), 2: (72.0, 75.0), 3: (71.0, 76.5)}.items():
        write_record(tmp_path, method="lora", label="lora", lr=2e-4, seed=seed, dev=80.0, test=a)
        write_record(
            tmp_path, method="lora", label="lora", lr=1e-4, seed=seed, dev=60.0, test=99.0
        )  # the lr dev does not choose
        write_record(tmp_path, method="loreft", label="loreft", lr=6e-4, seed=seed, dev=81.0, test=b)
    write_record(tmp_path, method="loreft", label="loreft", lr=6e-4, seed=4, dev=81.0, test=50.0)
    from fairseq_idpg.results.paired import paired_methods

    table, lonely = paired_methods(read_records([tmp_path]), "lora", "loreft")
    (row,) = table.to_dict("records")
    assert (row["n"], row["lr"], row["lr_b"], row["label"]) == (3, 2e-4, 6e-4, "loreft - lora")
    assert row["mean_a"] == pytest.approx(71.0) and row["difference"] == pytest.approx(4.1666, abs=1e-3)
    assert row["verdict"] == "differ" and row["p"] < 0.05 and lonely["seed"].tolist() == [4]
    assert main([str(tmp_path), "--methods", "lora", "loreft"]) == 0
    out = capsys.readouterr().out
    assert "| loreft - lora | 0.0002 / 0.0006 | 3 | 71.0 ± 1.0 | 75.2 ± 1.3 | +4.2 ± 1.3 | 0.03 | differ |" in out
    assert "only in loreft: SST-2 loreft - lora seed 4 (left out)" in out
    assert main([str(tmp_path), "--methods", "lora", "vera"]) == 2
    assert capsys.readouterr().err == "paired: error: --methods: no record of vera (the records hold lora, loreft)\n"
    assert main([str(tmp_path)]) == 2 and "--methods A B" in capsys.readouterr().err
