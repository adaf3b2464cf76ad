"""scripts/check_gpu.sh on the CPU: the fp16/bf16 fairseq-train runs at a tiny size, the 1-vs-2-process
comparison over gloo, what it skips without a GPU, its JSON file and its exit status; the verdicts on
a run's log; the timing comparison with Hugging Face PEFT at a tiny size."""

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from fairseq_idpg.check_gpu.report import Check, Report, Timing
from fairseq_idpg.check_gpu.training import MIN_SANE_LOSS_SCALE, RunResult, compare_tensors, describe_error, judge

REPO = Path(__file__).resolve().parents[1]
KEYS = {"device", "torch", "cuda", "model", "checks", "seconds_per_update", "passed"}
TIMING_KEYS = {"method", "precision", "batch_size", "tokens_per_sample", "seconds"}


@pytest.mark.slow
def test_check_on_the_cpu_passes_and_says_what_it_skipped(tmp_path):
    """The command as a researcher types it (one family, to keep CI short): fp32 (the reference), fp16 and
    bf16 LoRA on a tiny random backbone, M-IDPG-PHM on 1 process (update-freq 2) against 2 gloo processes,
    timings skipped."""
    out = tmp_path / "gpu.json"
    run = subprocess.run(
        ["bash", str(REPO / "scripts" / "check_gpu.sh"), "--families", "lora", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    text = run.stdout
    assert "no CUDA device: the runs use --cpu at this size" in text
    assert "skip  timings against PEFT: no GPU: timings run on a GPU" in text
    assert text.rstrip().splitlines()[-1] == "GPU check PASSED on cpu (4 passed, 0 failed, 1 skipped)"

    report = json.loads(out.read_text())
    assert set(report) == KEYS
    assert report["device"] == "cpu" and report["cuda"] is None and report["torch"] == torch.__version__
    assert report["model"].startswith("tiny random RoBERTa") and report["passed"] is True
    checks = {c["name"]: c for c in report["checks"]}
    assert [c["status"] for c in report["checks"]] == ["pass", "pass", "pass", "pass", "skip"]
    fp16 = checks["fp16 lora (lora) on the CPU"]["detail"]
    assert fp16.startswith("loss ") and " in 3 updates (fp32: " in fp16 and "), loss scale 128, " in fp16
    dist = checks["1 vs 2 CPU processes (gloo, m-idpg-phm, fp32)"]["detail"]
    worst = float(dist.split("largest difference ")[1].split(" ")[0])
    assert worst <= 1e-6 and "tolerance 1e-06 + 0.0001 |x|" in dist
    timings = report["seconds_per_update"]
    assert all(set(t) == TIMING_KEYS for t in timings)
    assert [(t["method"], t["precision"], t["batch_size"], t["tokens_per_sample"]) for t in timings] == [
        ("lora", "fp32", 4, 16),
        ("lora", "fp16", 4, 16),
        ("lora", "bf16", 4, 16),
    ]
    assert all(t["seconds"] > 0 for t in timings)


def test_a_failing_run_gives_the_fail_line_and_exit_1(tmp_path, tiny, capsys):
    """An injected blow-up (lr 1e30: the first update makes the LoRA weights ~1e30, the next forward is
    not finite) fails its check; the JSON says so and the work folder is kept for its log."""
    from fairseq_idpg.check_gpu.cli import main

    out = tmp_path / "gpu.json"
    argv = ["--model", str(tiny.folder), "--families", "lora", "--precisions", "bf16", "--no-distributed"]
    code = main(argv + ["--train-args", "--lr 1e30", "--out", str(out), "--work-dir", str(tmp_path / "work")])
    text = capsys.readouterr().out
    assert code == 1
    assert (
        "GPU check FAILED on cpu (0 passed, 2 failed, 2 skipped): fp32 lora (lora) on the CPU, "
        "bf16 lora (lora) on the CPU"
    ) in text  # the fp32 reference blew up too
    report = json.loads(out.read_text())
    assert report["passed"] is False and report["seconds_per_update"] == []
    for failed in report["checks"][:2]:
        assert failed["status"] == "fail" and failed["detail"].startswith("FloatingPointError: gradients are Nan/Inf")
    assert (tmp_path / "work" / "logs" / "bf16 lora (lora).log").is_file()


def test_bad_flags_are_refused_in_one_line(capsys):
    from fairseq_idpg.check_gpu.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--families", "lora,nope"])
    assert e.value.code == 2
    assert "error: --families nope: valid are prompts, idpg, inducer, adapters, lora, bitfit, finetune" in (
        capsys.readouterr().err
    )


def test_a_missing_model_is_refused_in_one_line(tmp_path, capsys):
    from fairseq_idpg.check_gpu.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--model", str(tmp_path / "nope"), "--out", str(tmp_path / "gpu.json")])
    assert e.value.code == 2 and not (tmp_path / "gpu.json").exists()
    assert f"check_gpu.sh: error: --model {tmp_path / 'nope'}: {tmp_path / 'nope'}/model.pt and dict.txt not found" in (
        capsys.readouterr().err
    )


# ---------------------------------------------------------------------------------------- verdicts
def _run(losses, scales=None, error=None):
    """A RunResult whose log had these per-update losses (and fp16 loss scales)."""
    from fairseq_idpg.logs import Entry

    entries = [
        Entry("train_inner", {"loss": x, "num_updates": i + 1, "ups": 4.0, "loss_scale": (scales or [128] * 9)[i]})
        for i, x in enumerate(losses)
    ]
    return RunResult(["x"], Path("run.log"), entries, error)


def test_judge_passes_a_sane_run_and_fails_each_kind_of_insane_one():
    assert judge(_run([1.0, 0.9, 0.8]), "fp16", 3) == ("pass", "loss 1.000 -> 0.800 in 3 updates, loss scale 128")
    status, detail = judge(_run([1.0, math.nan, 0.8]), "bf16", 3)
    assert status == "fail" and detail.startswith("non-finite loss nan")
    status, detail = judge(_run([1.0, 9.0, 0.8]), "bf16", 3)
    assert status == "fail" and detail.startswith("loss 9 bits > 3")
    status, detail = judge(_run([1.0, 0.9, 0.8], scales=[2.0, 1.0, MIN_SANE_LOSS_SCALE / 2]), "fp16", 3)
    assert status == "fail" and detail.startswith("loss scale 0.5 < 1 after 3 updates")
    assert judge(_run([1.0, 0.9]), "fp16", 3)[1].startswith("2 of 3 updates logged")
    assert judge(_run([], error="exit status 1: boom"), "fp16", 3) == ("fail", "exit status 1: boom (log: run.log)")


def test_half_precision_is_judged_against_the_fp32_run():
    """The recipe's own spike (fp32 went to 10 bits too) passes; a spike well beyond fp32's fails; where
    fp32 stayed low, the 3-bit bound holds."""
    fp32 = [1.05, 10.4, 2.6]
    assert judge(_run(fp32), "fp32", 3) == ("pass", "loss 1.050 -> 2.600 in 3 updates (largest 10.4 bits: "
                                                    "the recipe's own first steps)")  # fmt: skip
    status, detail = judge(_run([1.051, 10.9, 2.5]), "bf16", 3, fp32)
    assert (status, detail) == ("pass", "loss 1.051 -> 2.500 in 3 updates (fp32: 1.050 -> 2.600, largest 10.4)")
    status, detail = judge(_run([1.051, 16.0, 2.5]), "fp16", 3, fp32)
    assert status == "fail" and detail.startswith("loss 16 bits > 15.6 (1.5 x fp32's largest;")
    status, detail = judge(_run([1.0, 4.0, 0.9]), "bf16", 3, [1.0, 0.9, 0.8])
    assert status == "fail" and detail.startswith("loss 4 bits > 3 (3;")


def test_a_failed_run_is_described_by_the_exception_that_started_it():
    """fairseq's NanDetector, run after a FloatingPointError, may end in an empty exception of its own."""
    try:
        try:
            raise FloatingPointError("gradients are Nan/Inf")
        except FloatingPointError:
            raise StopIteration  # noqa: B904
    except StopIteration as e:
        assert describe_error(e) == "FloatingPointError: gradients are Nan/Inf (then StopIteration)"
    assert describe_error(ValueError("bad")) == "ValueError: bad"


def test_compare_tensors_states_the_largest_difference():
    a = {"w": torch.tensor([1.0, 100.0]), "b": torch.tensor([0.0])}
    assert compare_tensors(a, {"w": torch.tensor([1.0, 100.005]), "b": torch.tensor([0.0])}, 1e-4, 1e-6)[:2] == (
        True,
        pytest.approx(0.005, rel=1e-3),
    )
    ok, worst, where = compare_tensors(a, {"w": torch.tensor([1.001, 100.0]), "b": torch.tensor([0.0])}, 1e-4, 1e-6)
    assert not ok and where == "w" and worst == pytest.approx(0.001, rel=1e-3)
    assert compare_tensors(a, {"w": a["w"]}, 1e-4, 1e-6)[0] is False


def test_report_json_has_exactly_the_sweep_keys(tmp_path):
    report = Report("cpu", "2.13.0", None, "tiny")
    report.checks += [Check("a", "pass", "ok"), Check("b", "skip", "no GPU")]
    report.seconds_per_update.append(Timing("lora", "bf16", 16, 128, 0.25))
    data = json.loads(report.write(tmp_path / "x" / "gpu.json").read_text())
    assert set(data) == KEYS and data["passed"] is True
    assert data["seconds_per_update"] == [
        {"method": "lora", "precision": "bf16", "batch_size": 16, "tokens_per_sample": 128, "seconds": 0.25}
    ]
    report.checks.append(Check("c", "fail", "bad"))
    assert report.verdict() == "GPU check FAILED on cpu (1 passed, 1 failed, 1 skipped): c"
    with pytest.raises(ValueError, match="check status must be one of pass, fail, skip"):
        Check("d", "ok")


# ---------------------------------------------------------------------------------------- timings
def test_same_weights_and_step_timings_against_peft_at_tiny_size(tiny):
    """The fairseq encoder and its transformers copy give the same logits; every pair is timed, and PEFT's
    prefix tuning, which fails on RoBERTa (transformers 5 and 4.57), is reported as skipped with PEFT's reason."""
    pytest.importorskip("peft")
    from fairseq_idpg.check_gpu.timing import SAME_WEIGHTS_ATOL, compare, load_backbone, ratios, same_weights_gap

    state, sizes, dictionary = load_backbone(tiny.folder)
    tokens = torch.randint(
        dictionary.nspecial, len(dictionary) - 1, (2, 12), generator=torch.Generator().manual_seed(0)
    )
    assert same_weights_gap(tiny.folder, state, sizes, dictionary, tokens) <= SAME_WEIGHTS_ATOL

    times, skipped = compare(
        tiny.folder, torch.device("cpu"), ["fp32"], 2, 8, steps=1, warmup=1, repeats=2, log=lambda *a, **k: None
    )
    names = [t.name for t in times]
    assert {"step:lora", "peft:lora", "step:prompt-tuning-5", "peft:prompt-tuning", "step:prefix-tuning"} <= set(names)
    assert "step:m-idpg-phm" in names and all(t.seconds > 0 and t.trained > 0 for t in times)
    if "peft:prefix-tuning" not in names:
        # transformers 5: PEFT refuses ("does not support past key values"); 4.57 (the [interop] pin): PEFT hands
        # the encoder's second output, the cache, to RoBERTa's classifier as a pooled output (docs/using.md)
        reason = skipped["peft:prefix-tuning"]
        assert "past key values" in reason or "'<' not supported between instances of 'tuple' and 'int'" in reason
    labels = [label for label, _, _ in ratios(times)]
    assert "fp32 lora: ours / PEFT" in labels and "fp32 m-idpg-phm / prompt-tuning-5" in labels
    # the encoders alone, every weight trained, on both sides (no goal)
    assert ("fp32 full fine-tuning: fairseq / transformers", None) in [(lbl, goal) for lbl, _, goal in ratios(times)]
    assert {"step:finetune", "hf:finetune"} <= set(names)
    # the same trained parameters on both sides of the LoRA pair (r 16 on q and v, and the 2-class head)
    trained = {t.name: t.trained for t in times}
    assert trained["step:lora"] == trained["peft:lora"]
    # and of LoRA's variants: DoRA (A, B and the magnitudes), PiSSA (A, B)
    assert trained["step:dora"] == trained["peft:dora"] > trained["step:pissa"] == trained["peft:pissa"]
    # and VeRA's d and b (A and B frozen, shared), PEFT's VeraConfig(r=256) on query and value
    assert trained["step:vera"] == trained["peft:vera"]
