"""The split-dev protocol (ReFT Table 4's): each labelled dev file split in two by a seeded permutation, half of it
(1,000 rows of a file over 5,000, as ReFT's code) selecting the checkpoint (``valid{i}``), the rest scored
(``test{i}``), train whole. Through prepare_data.py,
run.sh's ``--split-dev`` (its own data folder, its records' budget and reported split) and a sweep's
``budget: {split_dev: true}``; a run without it keeps the folder name it had before the option existed."""

import importlib.util
import itertools
import json
from pathlib import Path

import pytest
from fairseq.data import Dictionary, data_utils
from records_support import record

from fairseq_idpg import run as main_job
from fairseq_idpg.errors import SweepError
from fairseq_idpg.preprocessing import Example, PrepareError, get_task, make_splits
from fairseq_idpg.preprocessing.prepare import SPLIT_DEV_RULE, provenance_differences, read_raw, split_for_selection
from fairseq_idpg.results.records import budget_of, reported_split
from fairseq_idpg.results.table import split_label
from fairseq_idpg.run_config import RunConfig, RunError

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "prepare_data.py"
_spec = importlib.util.spec_from_file_location("prepare_data_split_dev", SCRIPT)
cli = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cli)


def rows(examples):
    return [(e.texts, e.label) for e in examples]


# ---------------------------------------------------------------------------------------- the halves
def test_each_dev_half_is_disjoint_covers_the_file_and_follows_the_seed(shared_data):
    spec = get_task("RTE")
    data = read_raw(spec, shared_data / "glue" / "RTE")
    dev = data["dev.tsv"]  # 277 rows
    splits = make_splits(spec, data, None, None, seed=1, split_dev=True)
    assert list(splits) == ["train", "valid", "test"]
    assert splits["train"] == data["train.tsv"]  # train stays whole
    assert (len(splits["valid"]), len(splits["test"])) == (138, 139)  # floor(n/2) selects, ceil(n/2) is scored
    position = {row: i for i, row in enumerate(rows(dev))}
    assert len(position) == len(dev)  # (RTE's dev rows are distinct, so a row names its place)
    select, report = [position[r] for r in rows(splits["valid"])], [position[r] for r in rows(splits["test"])]
    assert not set(select) & set(report) and sorted(select + report) == list(range(len(dev)))
    assert select == sorted(select) and report == sorted(report)  # each half keeps the file's order
    again = make_splits(spec, data, None, None, seed=1, split_dev=True)
    assert rows(again["valid"]) == rows(splits["valid"])
    other = make_splits(spec, data, None, None, seed=2, split_dev=True)
    assert rows(other["valid"]) != rows(splits["valid"]) and len(other["valid"]) == 138


@pytest.mark.parametrize("n,selecting", [(5001, 1000), (5463, 1000), (5000, 2500), (9815, 1000), (3, 1)])
def test_a_dev_file_over_5000_rows_gives_1000_to_selection_as_refts_code(n, selecting):
    """pyreft's GLUE script (examples/loreft/train.py): 1,000 selecting rows of a dev set over 5,000 (MNLI, QQP, QNLI:
    QNLI's 5,463 and MNLI's 9,815 are here), else half; the rest is scored."""
    examples = [Example((f"s {i}",), "0") for i in range(n)]
    select, report = split_for_selection(examples, seed=2)
    assert (len(select), len(report)) == (selecting, n - selecting)
    assert sorted(e.texts for e in select + report) == sorted(e.texts for e in examples)


def test_mnli_splits_both_dev_files():
    def fake(n, tag):
        return [Example((f"{tag} premise {i}", f"hypothesis {i}"), "entailment") for i in range(n)]

    data = {"train.tsv": fake(30, "t"), "dev_matched.tsv": fake(11, "m"), "dev_mismatched.tsv": fake(8, "mm")}
    splits = make_splits(get_task("MNLI"), data, None, None, seed=4, split_dev=True)
    assert {k: len(v) for k, v in splits.items()} == {"train": 30, "valid": 5, "valid1": 4, "test": 6, "test1": 4}
    assert list(splits) == ["train", "valid", "valid1", "test", "test1"]  # fairseq's --validpref, --testpref order
    assert {e.texts[0].split()[0] for e in splits["valid"] + splits["test"]} == {"m"}
    assert {e.texts[0].split()[0] for e in splits["valid1"] + splits["test1"]} == {"mm"}
    # a fresh RandomState per file: the matched halves do not depend on the mismatched file
    fewer = {**data, "dev_mismatched.tsv": fake(20, "mm")}
    assert make_splits(get_task("MNLI"), fewer, None, None, seed=4, split_dev=True)["valid"] == splits["valid"]


def test_split_dev_refuses_the_other_sampling_in_one_line():
    data = {"train.csv": [Example((f"s {i}",), "0") for i in range(1200)], "test.csv": [Example(("x",), "1")] * 4}
    with pytest.raises(PrepareError) as e:
        make_splits(get_task("CR"), data, 100, None, 1, split_dev=True)
    assert str(e.value) == "--split-dev and --few-shot exclude each other (--few-shot samples its dev set from train)"
    with pytest.raises(PrepareError, match="^--split-dev and --dev-from-train exclude each other .*\\)$"):
        make_splits(get_task("CR"), data, None, 50, 1, split_dev=True)
    for argv, message in (
        (["RTE", "--split-dev", "--few-shot", "16"], "--split-dev and --few-shot exclude each other"),
        (["RTE", "--split-dev", "--dev-from-train", "9"], "--dev-from-train and --split-dev exclude each other"),
    ):
        with pytest.raises(RunError) as e:
            RunConfig.from_argv(argv).validate()
        assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_prepare_data_split_dev_cli_writes_both_halves(shared_data, roberta_bpe, tmp_path, capsys):
    raw = tmp_path / "RTE"
    raw.mkdir()
    for name, n in (("train.tsv", 24), ("dev.tsv", 21)):  # header + rows of the real files
        with (shared_data / "glue" / "RTE" / name).open(encoding="utf-8", newline="") as lines:
            (raw / name).write_text("".join(itertools.islice(lines, n + 1)), encoding="utf-8", newline="")
    out = tmp_path / "bin"
    base = ["RTE", "--raw", str(raw), "--bpe-dir", str(roberta_bpe), "--workers", "1"]

    assert cli.main([*base, "--out", str(tmp_path / "bad"), "--split-dev", "--dev-from-train", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "prepare_data.py: error: --split-dev and --dev-from-train exclude each other "
        "(--dev-from-train samples its dev set from train)"
    )
    assert not (tmp_path / "bad").exists()

    assert cli.main([*base, "--out", str(out), "--split-dev", "--seed", "3"]) == 0
    info = json.loads((out / "task.json").read_text())
    assert info["splits"] == {"train": 24, "valid": 10, "test": 11}
    assert (info["split_dev"], info["seed"], info["provenance"]["split_dev"], info["provenance"]["seed"]) == (
        True, 3, SPLIT_DEV_RULE, 3
    )  # fmt: skip
    expected = make_splits(get_task("RTE"), read_raw(get_task("RTE"), raw), None, None, 3, split_dev=True)
    labels = Dictionary.load(str(out / "label" / "dict.txt"))
    for split in ("valid", "test"):
        dataset = data_utils.load_indexed_dataset(str(out / "label" / split), labels)
        assert [labels[dataset[i][0]] for i in range(len(dataset))] == [e.label for e in expected[split]]

    plain = tmp_path / "plain"
    assert cli.main([*base, "--out", str(plain)]) == 0
    recorded = json.loads((plain / "task.json").read_text())
    assert "split_dev" not in recorded and "split_dev" not in recorded["provenance"]  # as before the option
    assert provenance_differences(recorded["provenance"], info["provenance"]) == [
        "sampling seed None -> 3", "--split-dev off -> on"
    ]  # fmt: skip
    # data split by the earlier rule (every file halved; its provenance said true) is prepared again
    earlier = {**info["provenance"], "split_dev": True}
    assert provenance_differences(earlier, info["provenance"]) == [f"--split-dev's rule True -> {SPLIT_DEV_RULE!r}"]


# ---------------------------------------------------------------------------------------- run.sh
def planned(argv, work):
    """(config with where things are left out, its hash, the run folder) of ``run.sh ARGV --dry-run``."""
    p = main_job.plan(main_job.parse_args([*argv, "--dry-run", "--work-dir", str(work)]), log=main_job.quiet)
    config = json.loads(json.dumps(p.config))
    config["model"].update(path="MODEL", sha256=None, dict_sha256=None, weights_sha256=None)
    config["data"]["folder"] = config["data"]["folder"].replace(str(work), "WORK")
    (config["data"]["provenance"] or {})["raw"] = "RAW"
    return config, main_job.config_hash(config), p.folder


# computed on the checkout before --split-dev existed: runs without it keep their folders
BEFORE = {
    ("RTE", "--method", "lora"): "ed0adbd6",
    ("RTE", "--method", "lora", "--dev-from-train", "100", "--data-seed", "2"): "b0397f87",
    ("SST-2", "--method", "loreft", "--model", "roberta.large", "--seed", "3"): "8912f6d4",
}


def test_runs_without_split_dev_keep_their_names_and_split_dev_runs_get_their_own(shared_data, standin_stub, tmp_path):
    for argv, digest in BEFORE.items():
        config, found, _ = planned(argv, tmp_path / "work")
        assert (found, "split_dev" in config["data"]["provenance"]) == (digest, False), argv
    config, found, folder = planned(["RTE", "--method", "lora", "--split-dev", "--data-seed", "2"], tmp_path / "work")
    assert config["data"]["folder"] == "WORK/data-bin/standin/RTE.split-dev.seed2"
    assert (config["data"]["provenance"]["split_dev"], config["data"]["provenance"]["seed"]) == (SPLIT_DEV_RULE, 2)
    assert found not in BEFORE.values() and config["select_on"] == "valid"
    assert RunConfig.from_config(config).split_dev and RunConfig.from_config(config).data_seed == 2


def test_split_dev_records_report_the_scored_half_beside_reft_table4(tmp_path, capsys):
    from fairseq_idpg.results.__main__ import main as results

    for seed, test in ((1, 60.0), (2, 62.0)):
        made = record(task="RTE", method="lora", lr=2e-4, seed=seed, dev=70.0 + seed, test=test, model="roberta.large")
        made["config"]["data"]["provenance"].update(split_dev=True, seed=1)
        (tmp_path / f"seed{seed}").mkdir()
        (tmp_path / f"seed{seed}" / "results.json").write_text(json.dumps(made))
    assert budget_of(made) == "split-dev" and reported_split(made["results"], "valid") == "test"
    assert reported_split({"valid": {}, "valid1": {}, "test": {}, "test1": {}}, "valid1") == "test1"
    assert (
        split_label("MNLI", "valid/test1", "split-dev") == "dev_matched (selecting half)/dev_mismatched (scored half)"
    )

    assert results([str(tmp_path), "--published", "reft-table4"]) == 0
    table = capsys.readouterr().out
    assert "## roberta.large, split-dev" in table.splitlines()
    assert "| lora | 61.0 ± 1.4 (paper 86.3) | 61.0 (paper 86.3) |" in table.splitlines()  # test, not valid (71, 72)
    assert "Reported split: RTE dev (scored half)." in table.splitlines()
    assert "Split-dev (ReFT's protocol)" in table


# ---------------------------------------------------------------------------------------- sweeps
def spec_file(tmp_path, budget):
    path = tmp_path / "spec.yaml"
    path.write_text(f"name: halves\ntasks: [RTE]\nmethods: [lora]\nlrs: recipe\nseeds: [1, 2]\nbudget: {budget}\n")
    return path


def test_a_sweep_with_split_dev_plans_its_runs_on_the_split_data(shared_data, standin_stub, tmp_path):
    from fairseq_idpg.sweep_spec import load_spec

    runs = load_spec(spec_file(tmp_path, "{split_dev: true, data_seed: 5}")).runs
    assert [(r.name, r.budget, r.split_dev, r.data_seed) for r in runs] == [
        ("RTE.lora.split-dev.data5.lr-recipe.seed1", "split-dev", True, 5),
        ("RTE.lora.split-dev.data5.lr-recipe.seed2", "split-dev", True, 5),
    ]
    assert "--split-dev" in runs[0].argv("standin", tmp_path / "work")
    p = main_job.plan(runs[0].request("standin", tmp_path / "work", dry_run=True), log=main_job.quiet)
    assert p.config["data"]["folder"] == str(tmp_path / "work" / "data-bin" / "standin" / "RTE.split-dev.seed5")
    assert p.config["data"]["provenance"]["split_dev"] == SPLIT_DEV_RULE
    each_seed = load_spec(spec_file(tmp_path, "{split_dev: true}")).runs  # data_seed: the run's seed
    assert [r.data_seed for r in each_seed] == [1, 2]


@pytest.mark.parametrize(
    "budget, message",
    [
        ("{split_dev: yes_please}", "budget.split_dev: 'yes_please'; valid: true (leave it out for the whole dev set)"),
        ("{split_dev: false}", "budget.split_dev: false; valid: true (leave it out for the whole dev set)"),
        ("{split_dev: true, few_shot: 16}", "budget: few_shot and split_dev exclude each other"),
        ("{split_dev: true, data_seed: -1}", "budget.data_seed: -1 is too small (valid: integers >= 0)"),
    ],
)
def test_a_bad_split_dev_budget_is_refused_in_one_line(tmp_path, budget, message):
    from fairseq_idpg.sweep_spec import load_spec

    path = spec_file(tmp_path, budget)
    with pytest.raises(SweepError) as e:
        load_spec(path)
    assert str(e.value) == f"{path}: {message}"
