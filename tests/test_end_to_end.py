"""End to end, as a user runs it: scripts/run.sh (prepare -> fairseq-train -> fairseq-validate)
on real data from ../shared/data with the offline stand-in (all-MiniLM-L6-v2 converted to
fairseq RoBERTa format: a 6-layer BERT standing in for roberta.large), and the launcher on
2 CPU workers against 1. Slow (minutes); CI runs them."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import STANDIN

from fairseq_idpg.logs import validate_scores, validations

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def work_dir(tmp_path_factory, shared_data, standin_model):
    return tmp_path_factory.mktemp("e2e")


def run(cmd, timeout):
    """subprocess.run, but a timeout also ends the grandchildren (fairseq-train under run.sh)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def run_main_job(task, work_dir, *args):
    """scripts/run.sh (fine-tuning); (its output, results.json, the run's folder)."""
    from fairseq_idpg.run import find_runs

    cmd = ["bash", str(REPO / "scripts" / "run.sh"), task, "--work-dir", str(work_dir), *args]
    out = run(cmd, timeout=1500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (folder,) = find_runs(work_dir, "standin", task, "finetune")
    return out.stdout, json.loads((folder / "results.json").read_text()), folder


def run_in_process(task, work_dir, capfd, *args):
    """run.sh's job (``fairseq_idpg.run.main``, what scripts/run.sh execs) in this process, as run_main_job:
    (what it printed, results.json, the run's folder). One interpreter start fewer than run.sh; the SST-2
    learning run above goes through scripts/run.sh itself."""
    from fairseq_idpg.run import find_runs, main

    capfd.readouterr()
    code = main([task, "--work-dir", str(work_dir), *args])
    out, err = capfd.readouterr()
    assert code == 0, out[-3000:] + err[-3000:]
    (folder,) = find_runs(work_dir, "standin", task, "finetune")
    return out, json.loads((folder / "results.json").read_text()), folder


def prepared(task, work_dir, glue_slices):
    """``task``'s slices of the real files (conftest's ``glue_slices``) prepared for the stand-in, made if missing
    (prepare_data.py's function, in this process: the script's own start is tests/test_prepare_data.py's)."""
    from fairseq_idpg.preprocessing import prepare

    data = work_dir / "prepared" / task
    if not (data / "task.json").exists():
        prepare(task, str(glue_slices / task), str(data), bpe="wordpiece", vocab=str(STANDIN / "vocab.txt"), workers=1)
    return data


def test_sst2_finetuned_standin_learns(work_dir, sst2_slice):
    # on the first 3,200 train rows and the whole dev set (872), validated once, at the end (each pass over
    # dev costs about 7 updates); 30 updates at twice the stand-in's fine-tuning lr (1e-4): measured 75.2 and
    # 75.0 (seeds 1 and 2; 77.2 after 60 updates at 5e-5, 80.6 after 100); majority class 50.9
    extra = ["--raw", str(sst2_slice), "--max-update", "30", "--lr", "1e-4", "--validate-interval-updates", "30"]
    stdout, results, folder = run_main_job("SST-2", work_dir, *extra)
    accuracy = results["results"]["valid"]["accuracy"]
    assert results["metric"] == "accuracy"  # and, as for each task's metric below, fairseq-validate's number:
    assert accuracy == validate_scores((folder / "validate.log").read_text(), ["valid"])["valid"]["accuracy"]
    assert accuracy == results["score"]
    print(f"SST-2 dev accuracy {accuracy} after 30 updates; times {results['timings']}")
    assert accuracy >= 72.0
    assert "valid: " in stdout and "accuracy" in stdout  # the metrics are printed for the user


# accuracy (RTE, SST-2...) takes the same path in the SST-2 learning run above and the block methods' main jobs
@pytest.mark.parametrize("task,metric", [("MRPC", "acc_and_f1"), ("STS-B", "pearson_and_spearman"), ("CoLA", "mcc")])
def test_each_task_runs_with_its_metric(work_dir, glue_slices, tmp_path, capfd, task, metric):
    # small slices of the real files (160 train, 48 dev rows): what is checked is the metric's plumbing.
    # The slice, prepared once per session (STS-B's also trains the 2-worker test), is copied where run.sh
    # prepares it: its task.json records the same files, so run.sh uses it as it is (no prepare_data.py start)
    from fairseq_idpg.layout import data_folder

    shutil.copytree(prepared(task, work_dir, glue_slices), data_folder(tmp_path, "standin", task))
    extra = ["--raw", str(glue_slices / task), "--max-update", "4", "--total-batch", "8"]
    stdout, results, folder = run_in_process(task, tmp_path, capfd, *extra, "--validate-interval-updates", "4")
    assert "prepare_data.py" not in stdout
    assert results["metric"] == metric
    value = results["results"]["valid"][metric]
    # the number fairseq-validate printed for checkpoint_best, stored as a number and shown to the user
    printed = validate_scores((folder / "validate.log").read_text(), ["valid"])["valid"][metric]
    assert isinstance(value, (int, float)) and value == printed == results["score"]
    assert f"{metric} {value}" in stdout
    # and the one fairseq-train's (only) validation printed: checkpoint_best is the model that was scored
    trained = [e.stats[metric] for e in validations((folder / "train.log").read_text())]
    assert trained == [value] and results["curve"] == [{"updates": 4, "split": "valid", **_shown(results)}]


def _shown(results):
    from fairseq_idpg.run.record import SHOWN_METRICS

    return {k: v for k, v in results["results"]["valid"].items() if k in SHOWN_METRICS}


def _train(data, model_dir, save_dir, nproc, batch_size, extra=(), init=None):
    from fairseq_idpg.run import model_dims

    dims = [str(x) for kv in model_dims(model_dir / "model.pt").items() for x in kv]
    info = json.loads((data / "task.json").read_text())
    target = (
        ["--regression-target", "--num-classes", "1"]
        if info["regression"]
        else ["--num-classes", str(info["num_classes"])]
    )
    cmd = [
        sys.executable,
        "-m",
        "fairseq_idpg.launch",
        "--nproc",
        str(nproc),
        "--total-batch",
        "16",
        "--batch-size",
        str(batch_size),
        "--cpu",
        "--",
        str(data),
        "--user-dir",
        str(REPO / "fairseq_idpg"),
        "--task",
        "peft_sentence_prediction",
        "--criterion",
        "sentence_prediction_metrics",
        *target,
        "--init-token",
        "0",
        "--separator-token",
        "2",
        "--arch",
        "roberta",
        *dims,
        *(
            init
            if init is not None
            else [
                "--restore-file",
                str(model_dir / "model.pt"),
                "--reset-optimizer",
                "--reset-dataloader",
                "--reset-meters",
            ]
        ),
        "--dropout",
        "0",
        "--attention-dropout",
        "0",
        "--optimizer",
        "adam",
        "--lr",
        "1e-3",
        "--max-update",
        "12",
        "--save-dir",
        str(save_dir),
        "--no-epoch-checkpoints",
        "--seed",
        "7",
        "--log-format",
        "simple",
        "--num-workers",
        "0",
        "--validate-interval-updates",
        "12",
        *extra,
    ]
    if nproc == 1:
        # the launcher would only exec this fairseq-train command (as run.sh runs it): one interpreter start fewer
        from fairseq_idpg.launch import resolve

        _, cmd = resolve(cmd[cmd.index("fairseq_idpg.launch") + 1 :])
    out = run(cmd, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    valid = [line for line in out.stdout.splitlines() + out.stderr.splitlines() if "valid on 'valid' subset" in line]
    return torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False), valid[-1]


def test_two_cpu_workers_match_one_with_same_effective_batch(work_dir, tmp_path, glue_slices):
    """torchrun + gloo, 2 workers x batch 8 vs 1 worker x batch 8 x update-freq 2 (no dropout:
    dropout masks are drawn per worker). STS-B, so validation gathers per-example predictions
    across workers for Pearson/Spearman."""
    from fairseq_idpg.conversion.tiny import write_tiny_roberta

    data = prepared("STS-B", work_dir, glue_slices)
    model = Path(write_tiny_roberta(tmp_path / "tiny", layers=2, dim=64, heads=4, ffn=128))
    one, valid_one = _train(data, model, tmp_path / "one", nproc=1, batch_size=8)
    two, valid_two = _train(data, model, tmp_path / "two", nproc=2, batch_size=8)
    assert one["optimizer_history"][-1]["num_updates"] == two["optimizer_history"][-1]["num_updates"] == 12
    max_diff = max((one["model"][k].float() - two["model"][k].float()).abs().max().item() for k in one["model"])
    print(f"max |param(1 worker) - param(2 workers)| after 12 updates: {max_diff:.2e}")
    assert max_diff < 1e-4  # float summation order only
    metrics = lambda line: {
        k: v for k, v in (f.strip().split(" ", 1) for f in line.split("|")[1:]) if k in ("pearson", "spearman", "loss")
    }
    m1, m2 = metrics(valid_one.split("subset", 1)[1]), metrics(valid_two.split("subset", 1)[1])
    assert m1.keys() >= {"pearson", "spearman"}
    for k in m1:
        assert abs(float(m1[k]) - float(m2[k])) <= 0.02, (k, m1, m2)


def test_checkpoints_reload_every_way(work_dir, tmp_path, glue_slices):
    """Under torch 2.13: resume from checkpoint_last.pt, --finetune-from-model, fairseq-validate
    (task and criterion from the checkpoint) and the hub all read what fairseq-train wrote. The fine-tuning
    step trains with --bf16 on the CPU (it used to imply --tpu, and a torch_xla import, in fairseq 0.12.2):
    the bf16 run is that step, where it was a run of its own."""
    from fairseq.models.roberta import RobertaModel

    from fairseq_idpg.conversion.tiny import write_tiny_roberta

    data = prepared("SST-2", work_dir, glue_slices)
    model = Path(write_tiny_roberta(tmp_path / "tiny"))
    save = tmp_path / "run"
    first, _ = _train(data, model, save, nproc=1, batch_size=16)
    assert first["optimizer_history"][-1]["num_updates"] == 12

    # resume: same command, more updates, picks up checkpoint_last.pt (no --reset-*)
    resumed, _ = _train(data, model, save, nproc=1, batch_size=16, extra=["--max-update", "14"], init=[])
    assert resumed["optimizer_history"][-1]["num_updates"] == 14

    # fine-tune from the trained model in a new directory, in bf16: weights in, counters reset
    tuned, tuned_valid = _train(
        data,
        model,
        tmp_path / "ft",
        nproc=1,
        batch_size=16,
        extra=["--max-update", "2", "--bf16"],
        init=["--finetune-from-model", str(save / "checkpoint_best.pt")],
    )
    assert tuned["optimizer_history"][-1]["num_updates"] == 2
    assert tuned["cfg"]["common"]["bf16"] and not tuned["cfg"]["common"]["tpu"]
    assert "accuracy" in tuned_valid

    out = run(
        [
            "fairseq-validate",
            str(data),
            "--user-dir",
            str(REPO / "fairseq_idpg"),
            "--path",
            str(save / "checkpoint_best.pt"),
            "--batch-size",
            "64",
            "--cpu",
            "--num-workers",
            "0",
        ],
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "valid on 'valid' subset" in out.stdout + out.stderr and "acc_and_f1" in out.stdout + out.stderr

    hub = RobertaModel.from_pretrained(
        str(save),
        "checkpoint_best.pt",
        data_name_or_path=str(data),
        user_dir=str(REPO / "fairseq_idpg"),
        bpe="wordpiece",
        wordpiece_vocab=str(model / "vocab.txt"),
    )
    tokens = hub.encode("a gripping, beautifully acted film")
    assert tokens[0].item() == 0 and tokens[-1].item() == 2
    assert hub.predict("sentence_classification_head", tokens).shape == (1, 2)
