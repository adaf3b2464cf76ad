"""Sweeps on a real single-node Slurm (scripts/slurm_cluster.sh: munge, slurmctld, slurmd on 127.0.0.1), started
once for this file and stopped at its end when it started it; skipped, with the reason, where it cannot start.

Bad input: one line naming the flag, exit 2, nothing submitted. End to end (slow): one sweep of 2 methods x 2
seeds (and a third label, the same LoRA run as one of them) through sbatch, with the faults a cluster brings
while it runs: a pending array task cancelled, a running task requeued (preemption), a task signalled as
before its time limit, a task killed with kill -9, and the controller stopped while the sweep waits."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_idpg import sweep

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "scripts" / "slurm_cluster.sh"
STATE = Path(os.environ.get("SLURM_CLUSTER_DIR", "/tmp/fairseq-idpg-slurm"))
pytestmark = pytest.mark.xdist_group("slurm")  # one worker: one cluster, one sweep at a time on it


@pytest.fixture(scope="module")
def slurm():
    """The cluster's environment ({SLURM_CONF}); stopped at the end when this fixture started it."""
    was_running = subprocess.run(["bash", str(CLUSTER), "status"], capture_output=True).returncode == 0
    started = subprocess.run(["bash", str(CLUSTER), "start"], capture_output=True, text=True, timeout=600)
    if started.returncode:
        pytest.skip((started.stderr.strip().splitlines() or ["slurm_cluster.sh start failed"])[-1])
    conf = started.stdout.strip().split("=", 1)[1]
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield {"SLURM_CONF": conf}
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    if not was_running:
        subprocess.run(["bash", str(CLUSTER), "stop"], capture_output=True, timeout=60)


def jobs_known():
    return subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True).stdout.split()


def refused(capsys, argv):
    """sweep.main's exit status and its one stderr line."""
    code = sweep.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return code, err[0]


SPEC = "name: s\nmodel: standin\ntasks: [RTE]\nmethods: [lora]\nlrs: recipe\nseeds: [1]\nmax_update: {updates}\n"


# ---------------------------------------------------------------------------------------- bad input
def test_no_sbatch_on_path_is_one_line(tmp_path, monkeypatch, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(updates=4))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    code, line = refused(capsys, [str(spec), "--executor", "slurm", "--work-dir", str(tmp_path)])
    assert (code, line) == (2, "sweep: error: --executor slurm: sbatch and srun not found on PATH "
                                "(run it on a Slurm login node)")  # fmt: skip
    assert not (tmp_path / "sweeps").exists() and not (tmp_path / "data-bin").exists()


def test_what_the_cluster_lacks_is_one_line_naming_the_flag(slurm, tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(updates=4))
    base = [str(spec), "--executor", "slurm", "--work-dir", str(tmp_path)]
    cpus = os.cpu_count()
    before = jobs_known()
    cases = {
        ("--partition", "gpu", "--gpus-per-run", "0", "--cpus-per-run", "1"):
            "--partition gpu: no such partition on this cluster; valid: debug",
        ("--gpus-per-run", "1", "--cpus-per-run", "1"):
            "--gpus-per-run 1: partition debug's nodes have no GPUs (gres gpu); valid: 0 to 0",
        ("--gpus-per-run", "0"):  # the default --cpus-per-run 8
            f"--cpus-per-run 8: partition debug's nodes have {cpus} CPUs; valid: 1 to {cpus}",
        ("--gpus-per-run", "0", "--cpus-per-run", "1", "--mem", "100000"):
            "--mem 100000: partition debug's nodes have",
    }  # fmt: skip
    for flags, message in cases.items():
        code, line = refused(capsys, base + list(flags))
        assert code == 2 and line.startswith(f"sweep: error: {message}"), (flags, line)
    assert jobs_known() == before and not (tmp_path / "sweeps").exists()


def test_time_under_the_estimate_is_one_line(slurm, glue_slices, standin_model, tmp_path, monkeypatch, capsys):
    """600 updates at a measured 10 s each (scaled to the run's tokens): --time 1 is refused before any job."""
    monkeypatch.setenv("GLUE_DIR", str(glue_slices))
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(updates=600) + "args: [--total-batch, 8]\n")
    timings = tmp_path / "timings.json"
    entry = {"method": "lora", "precision": "fp32", "batch_size": 8, "tokens_per_sample": 128, "seconds": 10.0}
    timings.write_text(json.dumps({"device": "cpu", "model": "standin", "seconds_per_update": [entry]}))
    before = jobs_known()
    argv = [str(spec), "--executor", "slurm", "--work-dir", str(tmp_path), "--gpus-per-run", "0"]
    code = sweep.main(argv + ["--cpus-per-run", "1", "--time", "1", "--timings", str(timings)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err and not err[-1].startswith("warning:"), err  # warnings: the slices' sizes
    assert re.fullmatch(r"sweep: error: --time 1: the longest run \(RTE\.lora\.lr-recipe\.seed1\) needs about "
                        r"\S+ by the estimate \(.*timings\.json; sweep\.sh --dry-run shows it\); valid: --time \d+ "
                        r"or more", err[-1]), err[-1]  # fmt: skip
    assert jobs_known() == before and not (tmp_path / "sweeps" / "s" / "slurm").exists()
