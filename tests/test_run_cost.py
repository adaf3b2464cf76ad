"""What a run cost, in its record and in the results table: seconds per update from fairseq-train's log
(``logs.training_speed``), the trainer's peak memory (``run/execution.peak_memory``), and the results' cost table
(``results/table.cost_markdown``)."""

import subprocess
import sys

from records_support import write_record

from fairseq_idpg.logs import least_free_gb, training_speed
from fairseq_idpg.results.__main__ import main
from fairseq_idpg.run.execution import peak_memory
from fairseq_idpg.run.record import training_cost


def train_inner(updates, ups, gb_free=None):
    free = f', "gb_free": "{gb_free}"' if gb_free is not None else ""
    return (f'2026-01-01 00:00:00 | INFO | train_inner | {{"epoch": 1, "loss": "0.9", "ups": "{ups}", '
            f'"num_updates": "{updates}", "lr": "0.001", "wall": "0"{free}}}\n')  # fmt: skip


VALID = '2026-01-01 00:00:00 | INFO | valid | {"epoch": 1, "valid_loss": "0.7", "valid_num_updates": "2"}\n'


def test_seconds_per_update_are_the_median_of_fairseqs_update_rate():
    # the first interval holds the start-up, the third a validation: the median leaves them out
    log = train_inner(1, 0.05) + train_inner(2, 2.5) + VALID + train_inner(3, 0.2) + train_inner(4, 2.0)
    assert training_speed(log + train_inner(5, 2.0)) == 1 / 2.0
    assert training_speed(log) == 1 / ((0.2 + 2.0) / 2)  # an even count: the middle two rates' mean
    # a resumed run's first interval logs "ups": "0" (its start): not a rate
    assert training_speed(train_inner(5, 0) + train_inner(6, 4.0)) == 0.25
    assert training_speed(train_inner(1, 0)) is None and training_speed("") is None


def test_cuda_memory_is_the_least_free_memory_fairseq_logged():
    assert least_free_gb(train_inner(1, 1, 70.5) + train_inner(2, 2, 69.9) + train_inner(3, 3, 70.1)) == 69.9
    assert least_free_gb(train_inner(1, 1)) is None


def test_the_trainers_peak_memory_on_the_cpu_is_its_resident_set(tmp_path):
    """A child that held 300 MB is the peak this process reports after it ended (the trainer is such a child)."""
    code = "import numpy as np; a = np.ones(300 * 2**20 // 8); a += 1"
    subprocess.run([sys.executable, "-c", code], check=True)
    (tmp_path / "train.log").write_text(train_inner(1, 1) + train_inner(2, 2))
    memory = peak_memory(tmp_path / "train.log")
    assert memory["of"] == "host, peak resident" and memory["mb"] >= 300, memory
    cost = training_cost(train_inner(1, 2.0) + train_inner(2, 2.0), memory)
    assert cost == {"seconds_per_update": 0.5, "peak_memory_mb": memory["mb"], "memory": "host, peak resident"}
    assert training_cost("", None) == {"seconds_per_update": None, "peak_memory_mb": None, "memory": None}


def test_the_results_show_each_methods_cost_beside_the_scores(tmp_path, capsys):
    host = "host, peak resident"
    for seed, speed, mb in ((1, 0.2, 900.0), (2, 0.9, 950.0), (3, 0.3, None)):
        cost = {"seconds_per_update": speed, "peak_memory_mb": mb, "memory": host if mb else None}
        write_record(tmp_path, method="lora", seed=seed, cost=cost)
    for seed in (1, 2):  # recorded before costs were: none
        write_record(tmp_path, method="prompt-tuning-5", seed=seed)
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| standin | lora | 0.3 | 950 | 3 of 3 |" in out  # median of 0.2, 0.9, 0.3 (mean 0.47); the largest peak
    assert "| standin | prompt-tuning-5 | — | — | 0 of 2 |" in out
    assert "Peak memory: host, peak resident (the trainer's;" in out
    write_record(tmp_path / "old", method="lora")
    assert main([str(tmp_path / "old")]) == 0 and "Cost per method" not in capsys.readouterr().out
