"""python -m fairseq_idpg.results: paper tables from generated run records (tests/records_support.py)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.patches import Rectangle
from records_support import curve, write_record

from fairseq_idpg.methods import METHODS
from fairseq_idpg.results import plots, published
from fairseq_idpg.results.__main__ import main
from fairseq_idpg.results.records import curve_points, read_records
from fairseq_idpg.results.table import cells, choose_runs, long_table, markdown

REPO = Path(__file__).resolve().parents[1]
# dev scores per (lr, seed): 5e-3 has the better mean (82 vs 75), 1e-3 the best seed 1 (85 vs 80)
GRID = {(5e-3, 1): 80.0, (5e-3, 2): 82.0, (5e-3, 3): 84.0, (1e-3, 1): 85.0, (1e-3, 2): 70.0, (1e-3, 3): 70.0}


def write_grid(root, task="SST-2", method="m-idpg-phm", offset=0.0, **fields):
    for (lr, seed), dev in GRID.items():
        write_record(root, task=task, method=method, lr=lr, seed=seed, dev=dev + offset, **fields)


def table_of(root, selection="mean-dev", paper=None):
    chosen = choose_runs(read_records([root]), selection)
    return long_table(cells(chosen), published.lookup(paper) if paper else None)


def cell(long, label, task):
    found = long[(long["label"] == label) & (long["task"] == task)]
    assert len(found) == 1
    return found.iloc[0]


def test_mean_dev_selection_reports_the_chosen_lr_mean_and_sample_std(tmp_path):
    write_grid(tmp_path)
    row = cell(table_of(tmp_path), "m-idpg-phm", "SST-2")
    assert (row["lr"], row["n"], row["split"]) == ("0.005", 3, "valid")
    assert row["mean"] == pytest.approx(82.0) and row["std"] == pytest.approx(2.0)  # ddof 1: sqrt((4 + 0 + 4) / 2)


def test_best_per_seed_differs_from_mean_dev(tmp_path):
    write_grid(tmp_path)
    row = cell(table_of(tmp_path, "best-per-seed"), "m-idpg-phm", "SST-2")
    # seed 1 takes 1e-3 (85 > 80), seeds 2 and 3 take 5e-3
    assert row["lr"] == "0.005 x2, 0.001 x1" and row["n"] == 3
    assert row["mean"] == pytest.approx((85 + 82 + 84) / 3)
    assert row["std"] == pytest.approx(pd.Series([85.0, 82.0, 84.0]).std(ddof=1))


def test_a_diverged_run_is_never_chosen_nor_scored(tmp_path, capsys):
    """SST-2: at lr 0.1 seed 1 diverged and seeds 2, 3 scored 99: mean-dev keeps 1e-3 (an lr where a seed
    diverged is not chosen while another lr trained every seed); best-per-seed gives seeds 2 and 3 their 99.
    RTE diverged at its only lr: the cell says so, with its lr and count, and the average leaves it out."""
    diverged = {"update": 4, "reason": "valid loss nan"}
    for seed, dev in ((1, 70.0), (2, 72.0), (3, 74.0)):
        write_record(tmp_path, task="SST-2", lr=1e-3, seed=seed, dev=dev)
        write_record(tmp_path, task="RTE", lr=0.1, seed=seed, diverged=diverged)
    write_record(tmp_path, task="SST-2", lr=0.1, seed=1, diverged=diverged)
    for seed in (2, 3):
        write_record(tmp_path, task="SST-2", lr=0.1, seed=seed, dev=99.0)
    runs = read_records([tmp_path])
    assert runs["diverged"].sum() == 4 and runs.loc[runs["diverged"], "dev"].isna().all()
    long = table_of(tmp_path)
    sst2, rte = cell(long, "m-idpg-phm", "SST-2"), cell(long, "m-idpg-phm", "RTE")
    assert (sst2["lr"], sst2["n"], sst2["diverged"], sst2["mean"]) == ("0.001", 3, 0, pytest.approx(72.0))
    assert (rte["lr"], rte["n"], rte["diverged"]) == ("0.1", 3, 3) and math.isnan(rte["mean"])
    assert cell(long, "m-idpg-phm", "average")["mean"] == pytest.approx(72.0)
    text = markdown(long)
    assert "| m-idpg-phm | 72.0 ± 2.0 | diverged | 72.0 (1 of 2 tasks) |" in text
    assert "| m-idpg-phm | 0.001 (n 3) | 0.1 (n 3, 3 diverged) |" in text
    per_seed = cell(table_of(tmp_path, "best-per-seed"), "m-idpg-phm", "SST-2")
    assert per_seed["lr"] == "0.1 x2, 0.001 x1" and per_seed["mean"] == pytest.approx((70 + 99 + 99) / 3)


def test_sampled_data_reports_the_official_test_set(tmp_path):
    for (lr, seed), dev in GRID.items():  # the test scores favour 1e-3, but dev selects
        write_record(
            tmp_path, few_shot=100, data_seed=seed, lr=lr, seed=seed, dev=dev, test=60.0 + seed + 10 * (lr < 5e-3)
        )
    long = table_of(tmp_path, paper="idpg-table3")
    row = cell(long, "m-idpg-phm", "SST-2")
    assert (row["budget"], row["split"], row["lr"], row["n"]) == ("K=100", "test", "0.005", 3)
    assert row["mean"] == pytest.approx(62.0) and row["std"] == pytest.approx(1.0)
    assert row["published"] == 85.9 and row["published_std"] == 1.2  # IDPG Table 3, K = 100, M-IDPG-PHM, SST-2


def test_the_reported_split_is_named_by_its_file_glue_dev_is_dev(tmp_path):
    for task in ("SST-2", "MR"):  # sampled: the official files are test; SST-2's is GLUE's dev set, MR's its test set
        write_record(tmp_path / "K", task=task, few_shot=100, dev=80.0, test=70.0)
    assert "Reported split: MR test, SST-2 dev.\n" in markdown(table_of(tmp_path / "K"))
    write_record(tmp_path / "full", task="SST-2", dev=80.0)  # full data: valid is dev.tsv
    write_record(tmp_path / "full", task="MNLI", select_on="valid1", dev=80.0)  # dev_mismatched.tsv
    write_record(tmp_path / "full", task="CR", dev=80.0)  # LM-BFF's CR has no dev file: valid is test.csv
    text = markdown(table_of(tmp_path / "full"))
    assert "Reported split: CR test, SST-2 dev, MNLI dev_mismatched.\n" in text
    assert "SST-2 test" not in text and "SST-2 valid" not in text
    write_record(tmp_path / "dev100", task="RTE", dev_from_train=100, dev=80.0)  # no official score recorded
    assert "Reported split: RTE dev (sampled from train).\n" in markdown(table_of(tmp_path / "dev100"))


def test_a_per_task_k_table_takes_the_papers_numbers_at_its_default_k(tmp_path):
    budget = "K=1000 (CR: 775)"  # the stand-in study: CR's train file leaves 775 beside the 1,000-example dev set
    for task, k in (("SST-2", 1000), ("CR", 775)):
        write_record(tmp_path, task=task, few_shot=k, dev=80.0, test=70.0, budget=budget)
    long = table_of(tmp_path, paper="idpg-table3")
    sst2, cr = cell(long, "m-idpg-phm", "SST-2"), cell(long, "m-idpg-phm", "CR")
    assert (sst2["budget"], sst2["published"], sst2["published_std"]) == (budget, 93.7, 0.6)  # Table 3, K = 1000
    assert (cr["published"], cr["published_std"]) == (89.2, 1.2)
    assert cell(long, "m-idpg-phm", "average")["published"] == pytest.approx((93.7 + 89.2) / 2)
    said = "(paper x) is the paper's number at K=1000 for every task, where this table trained with K=1000 (CR: 775)."
    assert said in markdown(long)
    write_record(tmp_path, task="SST-2", few_shot=900, dev=80.0, test=70.0, budget="K=900 (CR: 775)")
    assert table_of(tmp_path, paper="idpg-table3").query("budget == 'K=900 (CR: 775)'")["published"].isna().all()


def test_missing_cells_are_missing_and_the_average_says_over_fewer_tasks(tmp_path):
    write_grid(tmp_path)
    write_grid(tmp_path, task="RTE", offset=-10)
    write_grid(tmp_path, method="prompt-tuning-5", offset=-5)  # no RTE run
    long = table_of(tmp_path, paper="idpg-table1")
    assert math.isnan(cell(long, "prompt-tuning-5", "RTE")["mean"])
    text = markdown(long)
    assert "| prompt-tuning-5 | 77.0 ± 2.0 (paper 94.2) | — | 77.0 (1 of 2 tasks) (paper 94.2) |" in text
    assert "| m-idpg-phm | 82.0 ± 2.0 (paper 96.0) | 72.0 ± 2.0 (paper 83.5) | 77.0 (paper 89.8) |" in text
    assert "| prompt-tuning-5 | 0.005 (n 3) | — |" in text
    assert "the lr with the best mean dev score over seeds (the IDPG protocol)" in text
    csv = pd.read_csv(pd.io.common.StringIO(long.to_csv(index=False)))
    missing = csv[(csv["label"] == "prompt-tuning-5") & (csv["task"] == "RTE")].iloc[0]
    assert missing[["lr", "n", "mean", "std"]].isna().all() and missing["published"] == 87.0  # empty, not 0


def test_label_names_the_row_and_defaults_to_the_method(tmp_path):
    write_record(tmp_path, method="m-idpg-phm", label="M-IDPG-PHM (ours)", dev=81.0)
    write_record(tmp_path, method="s-idpg-phm", dev=79.0)
    long = table_of(tmp_path, paper="idpg-table1")
    assert cell(long, "M-IDPG-PHM (ours)", "SST-2")["published"] == 96.0  # matched by its method
    assert cell(long, "s-idpg-phm", "SST-2")["mean"] == 79.0 and math.isnan(cell(long, "s-idpg-phm", "SST-2")["std"])


def test_cli_writes_tables_and_plots_with_the_published_numbers(tmp_path, capsys):
    write_grid(tmp_path / "runs")
    out = tmp_path / "out"
    assert main([str(tmp_path / "runs"), "--published", "idpg-table1", "--out-dir", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "| m-idpg-phm | 82.0 ± 2.0 (paper 96.0) | 82.0 (paper 96.0) |" in stdout
    assert (out / "table.md").read_text() == stdout
    csv = pd.read_csv(out / "table.csv")
    assert list(csv.columns) == ["model", "budget", "task", "label", "method", "metric", "split", "lr", "n", "mean",
                                 "std", "diverged", "published", "published_std"]  # fmt: skip
    assert csv.iloc[0][["task", "mean", "std", "published"]].tolist() == ["SST-2", 82.0, 2.0, 96.0]
    for name in ("bars.png", "curves.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([str(tmp_path / "runs"), "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("model,budget,task,label,")


def test_plots_have_a_bar_per_cell_and_a_line_per_label(tmp_path):
    for (lr, seed), dev in GRID.items():
        write_record(tmp_path, lr=lr, seed=seed, dev=dev, curve=curve([60.0 + seed, dev]))
        write_record(tmp_path, task="RTE", lr=lr, seed=seed, dev=dev - 10, curve=curve([50.0, dev - 10]))
        write_record(tmp_path, method="dpt", lr=lr, seed=seed, dev=dev - 5, curve=curve([55.0, dev - 5]))
    chosen = choose_runs(read_records([tmp_path]))
    long = long_table(cells(chosen), published.lookup("idpg-table1"))
    bars = plots.bar_figure(long, published.legend("idpg-table1")).axes
    assert len(bars) == 1
    assert len([p for p in bars[0].patches if isinstance(p, Rectangle)]) == 3  # m-idpg-phm x 2 tasks, dpt x SST-2
    assert sorted(bars[0].get_legend_handles_labels()[1]) == ["dpt", "idpg-table1 (roberta.large)", "m-idpg-phm"]
    panels = {ax.get_title(): ax for ax in plots.curve_figure(curve_points(chosen), long).axes if ax.get_title()}
    assert sorted(panels) == ["RTE (standin, full)", "SST-2 (standin, full)"]
    assert [line.get_label() for line in panels["SST-2 (standin, full)"].get_lines()] == [
        "m-idpg-phm (n 3)",
        "dpt (n 3)",
    ]
    line = panels["SST-2 (standin, full)"].get_lines()[0]
    assert list(line.get_xdata()) == [100, 200] and list(line.get_ydata()) == pytest.approx([62.0, 82.0])  # lr 5e-3


def test_duplicate_records_are_refused_naming_both_files(tmp_path, capsys):
    first = write_record(tmp_path, dev=80.0)
    second = write_record(tmp_path, dev=81.0)  # the same cell, lr and seed, another score
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(first) in err and str(second) in err


def test_a_run_and_its_copy_in_a_sweeps_records_count_once(tmp_path):
    run = write_record(tmp_path / "checkpoints", dev=80.0)
    copy = json.loads(run.read_text())
    copy.update(label="m-idpg-phm", budget="full")  # what fairseq_idpg/sweep.py adds
    records = tmp_path / "sweep" / "records" / "full" / "SST-2" / "m-idpg-phm"
    records.mkdir(parents=True)
    (records / f"{run.parent.name}.json").write_text(json.dumps(copy))
    assert len(read_records([tmp_path / "checkpoints", tmp_path / "sweep"])) == 1


def test_spec_keeps_its_cells_in_its_order_with_its_published_table(tmp_path, capsys):
    write_grid(tmp_path / "runs")
    write_grid(tmp_path / "runs", method="dpt", offset=-5)  # not in the spec
    write_grid(tmp_path / "runs", task="RTE", method="s-idpg-phm", offset=-10, label="S-IDPG")
    write_grid(tmp_path / "runs", task="RTE", offset=-9)
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: t\npublished: idpg-table1\ntasks: [RTE, SST-2]\nseeds: [1, 2, 3]\n"
        "methods:\n  - {label: S-IDPG, method: s-idpg-phm}\n  - m-idpg-phm\n"
    )
    assert main([str(tmp_path / "runs"), "--spec", str(spec)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[:4] == [
        "| method | RTE (accuracy) | SST-2 (accuracy) | average |",
        "| S-IDPG | 72.0 ± 2.0 (paper 89.2) | — | 72.0 (1 of 2 tasks) (paper 89.2) |",
        "| m-idpg-phm | 73.0 ± 2.0 (paper 83.5) | 82.0 ± 2.0 (paper 96.0) | 77.5 (paper 89.8) |",
        "| method | RTE | SST-2 |",
    ]


def test_a_spec_in_progress_shows_its_unrun_cells_as_missing(tmp_path, capsys):
    write_grid(tmp_path / "runs")
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: t\ntasks: [SST-2, CR]\nseeds: [1, 2, 3]\nmethods: [m-idpg-phm, {label: DPT, method: dpt}]\n")
    assert main([str(tmp_path / "runs"), "--spec", str(spec), "--out-dir", str(tmp_path / "out")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert rows[:3] == [
        "| method | SST-2 (accuracy) | CR | average |",
        "| m-idpg-phm | 82.0 ± 2.0 | — | 82.0 (1 of 2 tasks) |",
        "| DPT | — | — | — |",
    ]
    csv = pd.read_csv(tmp_path / "out" / "table.csv")
    assert len(csv[csv["task"] != "average"]) == 4 and csv["mean"].notna().sum() == 2  # one cell and its average


def test_a_folder_without_records_is_a_one_line_error():
    empty = REPO / "fairseq_idpg" / "published"  # data files, no record
    out = subprocess.run([sys.executable, "-m", "fairseq_idpg.results", str(empty)], capture_output=True, text=True)
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if "error" in line]
    assert errors == [f"results: error: {empty}: no run records (results.json, or *.json under a records folder)"]


# ---------------------------------------------------------------------------------------- transcriptions
@pytest.mark.parametrize("name", published.names())
def test_published_rows_average_to_the_papers_average_column(name):
    table = published.load(name)
    known = {(d["backbone"], d["row"]) for d in table.get("known_average_discrepancies", [])}
    for section in table["sections"]:
        for row in section["rows"]:
            assert row["method"] in METHODS or row["method"] == "efl", row  # efl: its record is being added
            values = row["mean"]
            assert len(values) == len(table["columns"]) and len(row.get("std") or values) == len(values)
            if row.get("average") is None or None in values:
                continue
            decimals = 1 if all(round(v, 1) == v for v in values + [row["average"]]) else 2
            off = abs(sum(values) / len(values) - row["average"]) > 10**-decimals + 1e-9
            assert off == ((section.get("backbone"), row["row"]) in known), (section, row["row"])


def test_published_numbers_checked_twice_against_the_papers():
    t1 = published.lookup("idpg-table1").set_index(["method", "task"])
    assert t1.loc[("m-idpg-phm", "SST-2"), ["mean", "std"]].tolist() == [96.0, 0.3]
    assert t1.loc[("prompt-tuning-134", "MPQA"), ["mean", "std"]].tolist() == [65.7, 19.0]
    assert t1.loc[("houlsby-adapter", "RTE"), "mean"] == 88.1 and t1.loc[("finetune", "QQP"), "mean"] == 91.0
    t3 = published.lookup("idpg-table3").set_index(["budget", "method", "task"])
    assert t3.loc[("K=500", "efl", "RTE"), "mean"] == 57.5 and t3.loc[("K=1000", "m-idpg-phm", "STS-B"), "mean"] == 87.8
    dpt = published.lookup("dpt-table1").set_index(["method", "task"])  # default: T5-Large
    assert dpt.loc[("dpt", "RTE"), ["mean", "std"]].tolist() == [90.25, 0.36]
    assert published.lookup("dpt-table1@t5-small").set_index(["method", "task"]).loc[("dpt", "RTE"), "mean"] == 70.51
    assert published.lookup("inducer-table2").empty  # its numbers were lost in the text extraction
    reft = published.lookup("reft-table4").set_index(["method", "task"])  # ReFT Table 4: LoReFT, LoRA
    assert reft.loc[("loreft", "RTE"), "mean"] == 87.5 and reft.loc[("lora", "CoLA"), "mean"] == 65.5
    vera = published.lookup("reft-table16").set_index(["method", "task"])  # ReFT Table 16: VeRA's protocol
    assert vera.loc[("vera", "MRPC"), "mean"] == 90.9 and vera.loc[("loreft", "RTE"), "mean"] == 87.8
    with pytest.raises(published.PublishedError, match="no backbone 't5-xl'"):
        published.lookup("dpt-table1@t5-xl")
