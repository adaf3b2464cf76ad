"""roberta_prompt (DPT's rank probe) through fairseq-train and fairseq-validate on a slice of the real RTE files
(../shared/data): the rank probe is logged at every validation, its plot is drawn from the log,
and the exported l x d prompt scores exactly like the trained factors. A tiny random backbone
(2 layers x 32, conftest) keeps it fast; the slow smoke test runs the main job on the offline stand-in
(all-MiniLM-L6-v2 converted to fairseq RoBERTa format, the project's stand-in for roberta.large)."""

import json
import subprocess
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
LENGTH = 8


@pytest.fixture(scope="module")
def rte_slice(shared_data, tmp_path_factory, tiny):
    """The first 48 train and 32 dev rows of RTE (pairs), prepared for the tiny backbone."""
    from fairseq_idpg.preprocessing import prepare

    root = tmp_path_factory.mktemp("dpt_train")
    raw = root / "raw"
    raw.mkdir()
    for name, rows in (("train.tsv", 48), ("dev.tsv", 32)):
        lines = (shared_data / "glue" / "RTE" / name).read_text().splitlines(keepends=True)
        (raw / name).write_text("".join(lines[: rows + 1]))  # header + rows
    data = root / "bin"
    # prepare_data.py's function in this process (the script's own start is tests/test_prepare_data.py's)
    prepare("RTE", str(raw), str(data), bpe="wordpiece", vocab=str(tiny.folder / "vocab.txt"), workers=1)
    return root, tiny, data


def run(cmd, timeout=300):
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


def script(name, argv, capsys):
    """scripts/``name``.py's main on ``argv`` in this process (no interpreter start): what it printed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    code = module.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code in (0, None), out[-3000:] + err[-3000:]
    return out + err


def valid_fields(log):
    """The 'valid' subset's statistics of each validation in a fairseq log (json or simple format)."""
    from fairseq_idpg.logs import read_log

    return [e.stats for e in read_log(log) if e.tag == "valid"]


def test_rank_probe_logged_each_validation_plot_and_export_scores_the_same(rte_slice, capsys):
    from fairseq_idpg.launch import resolve

    root, tiny, data = rte_slice
    save = root / "probe"
    train_args = [
        data,
        "--user-dir",
        REPO / "fairseq_idpg",
        "--task",
        "peft_sentence_prediction",
        "--criterion",
        "sentence_prediction_metrics",
        "--init-token",
        "0",
        "--separator-token",
        "2",
        "--arch",
        "roberta_prompt",
        "--prompt-preset",
        "dpt-rank-probe",
        "--prompt-length",
        LENGTH,
        "--encoder-layers",
        "2",
        "--encoder-embed-dim",
        "32",
        "--encoder-ffn-embed-dim",
        "64",
        "--encoder-attention-heads",
        "4",
        "--backbone",
        tiny.model_file,
        "--save-trainable-only",
        "--optimizer",
        "adam",
        "--lr",
        "0.3",
        "--max-update",
        "6",
        "--validate-interval-updates",
        "2",
        "--best-checkpoint-metric",
        "accuracy",
        "--maximize-best-checkpoint-metric",
        "--save-dir",
        save,
        "--no-epoch-checkpoints",
        "--log-format",
        "simple",
        "--num-workers",
        "0",
        "--cpu",
    ]
    # the launcher's fairseq-train command for 1 process (the launcher would only exec it): one start fewer
    _, train = resolve(["--nproc", "1", "--total-batch", "8", "--", *map(str, train_args)])
    log = run(train)
    (save / "train.log").write_text(log)

    valid = valid_fields(log)
    assert [int(v["num_updates"]) for v in valid] == [2, 4, 6]
    ranks = [int(v["prompt_rank"]) for v in valid]
    last = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert ranks[-1] == int((last["model"]["prompt.s"] > 0).sum())  # logged = counted in the weights
    assert all(0 <= b <= a <= LENGTH for a, b in zip([LENGTH] + ranks, ranks, strict=False))  # only falls from r = l
    assert not any(k.startswith("encoder.") for k in last["model"])  # compact checkpoint

    png = root / "probe.png"
    out = script("plot_rank_probe", [save / "train.log", "--out", png], capsys)
    assert f"positive entries {ranks[0]} -> {ranks[-1]} of r = {LENGTH}" in out
    assert png.read_bytes()[:4] == b"\x89PNG"

    out = script("export_dpt_prompt", [save / "checkpoint_last.pt", "--check"], capsys)
    assert f"P [{LENGTH}, 32]" in out
    diff = float(out.split("largest |logit difference| on random inputs: ")[1].split()[0])
    assert diff < 1e-5
    scores = []
    for name in ("checkpoint_last.pt", "checkpoint_last_exported.pt"):
        out = run(
            [
                "fairseq-validate",
                data,
                "--user-dir",
                REPO / "fairseq_idpg",
                "--path",
                save / name,
                "--cpu",
                "--batch-size",
                "16",
                "--num-workers",
                "0",
            ]
        )
        fields = valid_fields(out)[-1]
        scores.append((fields["loss"], fields["accuracy"], fields["f1"]))
    assert scores[0] == scores[1]
    assert scores[0][:2] == (valid[-1]["loss"], valid[-1]["accuracy"])  # fairseq-train's last validation


@pytest.mark.slow
def test_main_job_trains_dpt_on_the_standin(tmp_path, glue_slices, standin_model, capfd):
    """scripts/run.sh RTE --method dpt on slices of the real RTE files: prepare, fairseq-train (4 updates of 8,
    one validation), fairseq-validate of the compact checkpoint. The job's main (what run.sh execs) runs in this
    process, on the slice prepared in this process where run.sh prepares it: two interpreter starts fewer (run.sh
    itself and its preparation are run by tests/test_end_to_end.py's SST-2 learning run)."""
    from conftest import STANDIN

    from fairseq_idpg.layout import data_folder
    from fairseq_idpg.preprocessing import prepare
    from fairseq_idpg.run import main

    # prepared in this process where run.sh prepares it (the same files: run.sh uses it, no prepare_data.py start)
    data = data_folder(tmp_path, "standin", "RTE")
    prepare("RTE", str(glue_slices / "RTE"), str(data), bpe="wordpiece", vocab=str(STANDIN / "vocab.txt"), workers=1)
    capfd.readouterr()
    code = main(
        [
            "RTE",
            "--method",
            "dpt",
            "--raw",
            str(glue_slices / "RTE"),
            "--max-update",
            "4",
            "--total-batch",
            "8",
            "--validate-interval-updates",
            "4",
            "--work-dir",
            str(tmp_path),
        ]
    )
    out, err = capfd.readouterr()
    assert code == 0, out[-3000:] + err[-3000:]
    out += err
    assert "prepare_data.py" not in out
    assert "valid: loss" in out and "accuracy" in out
    from fairseq_idpg.run import find_runs

    (save,) = find_runs(tmp_path, "standin", "RTE", "dpt")
    results = json.loads((save / "results.json").read_text())
    # DPT's recipe on the stand-in's smoke budget: lr 5e-3, 10% warmup, clip 1.0, weight decay 1e-5
    config = results["config"]
    assert (config["lr"], config["warmup_updates"], config["clip_norm"], config["weight_decay"]) == (5e-3, 0, 1.0, 1e-5)
    assert config["dropout"] == 0.0 and "--dropout 0.0 --attention-dropout 0.0" in out  # the long-prompt recipe
    # the compact checkpoint, rebuilt on the frozen stand-in, scores what fairseq-train's validation printed
    assert results["score"] == float(valid_fields((save / "train.log").read_text())[-1]["accuracy"])
    state = torch.load(save / "checkpoint_best.pt", map_location="cpu", weights_only=False)
    assert state["model"]["prompt.A"].shape == (100, 10) and state["model"]["prompt.B"].shape == (10, 384)
    assert not any(k.startswith("encoder.") for k in state["model"])  # the method saves compact checkpoints
