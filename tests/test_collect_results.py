"""scripts/collect_results.py: the docs/results.md table from run.sh's results.json and train.log."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def write_run(root, task, method, accuracy, trained, lr=0.005, seed=1, run=None):
    """A run folder as run.sh writes it (``METHOD/lr<lr>.seed<seed>.<hash>``; ``run=""``: the older
    ``METHOD/results.json``)."""
    folder = root / "standin" / task / method / (f"lr{lr:g}.seed{seed}.0123abcd" if run is None else run)
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(
        json.dumps(
            {
                "task": task,
                "method": method,
                "metric": "accuracy",
                "select_on": "valid",
                "results": {"valid": {"accuracy": accuracy, "f1": 1.0}},
                "seed": seed,
                "updates": 100,
                "lr": lr,
                "total_batch": 32,
            }
        )
    )
    (folder / "train.log").write_text(
        f"2026-01-01 | INFO | fairseq_cli.train | num. shared model params: 22,915,148 (num. trained: {trained:,})\n"
    )


def collect(*args):
    return subprocess.run(
        [sys.executable, REPO / "scripts" / "collect_results.py", *args], capture_output=True, text=True
    )


def test_table_rows_cells_and_missing_runs(tmp_path):
    write_run(tmp_path, "SST-2", "m-idpg-phm", 73.2, 170642)
    write_run(tmp_path, "RTE", "m-idpg-phm", 54.5, 170642)
    write_run(tmp_path, "SST-2", "prompt-tuning", "66.3", 150530, run="")  # an older run: strings, no run folder
    out = collect("--checkpoints", str(tmp_path), "--methods", "prompt-tuning,m-idpg-phm,absent")
    assert out.returncode == 0, out.stderr
    rows = out.stdout.strip().splitlines()
    assert rows[0] == "| method | trained (incl. head) | SST-2 dev | RTE dev | lr | updates (batch) |"
    assert rows[2:] == [
        "| prompt-tuning | 150,530 | 66.3 (accuracy) | - | 0.005 | 100 (32) / - |",
        "| m-idpg-phm | 170,642 | 73.2 (accuracy) | 54.5 (accuracy) | 0.005 | 100 (32) / 100 (32) |",
    ]


def test_seeds_are_averaged_and_the_best_lr_is_shown(tmp_path):
    for seed, accuracy in ((1, 70.0), (2, 72.0), (3, 74.0)):
        write_run(tmp_path, "RTE", "dpt", accuracy, 38850, lr=5e-3, seed=seed)
    write_run(tmp_path, "RTE", "dpt", 71.0, 38850, lr=1e-3, seed=1)  # one seed below the 3-seed mean of 5e-3
    write_run(tmp_path, "RTE", "dpt", 50.0, 38850, lr=1e-4, seed=1)
    out = collect("--checkpoints", str(tmp_path), "--tasks", "RTE")
    assert out.returncode == 0, out.stderr
    assert (
        out.stdout.strip().splitlines()[2] == "| dpt | 38,850 | 72.00 ± 2.00 (accuracy, 3 seeds) | 0.005 | 100 (32) |"
    )


def test_missing_folder_is_a_one_line_error(tmp_path):
    out = collect("--checkpoints", str(tmp_path / "nothing"))
    assert out.returncode == 2
    assert "--checkpoints/--model: " in out.stderr and "does not exist (run scripts/run.sh first)" in out.stderr
