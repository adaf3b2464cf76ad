"""How long a table takes (fairseq_idpg/sweep_estimate.py): a sweep's dry run prints device-hours per method
and in all, and the wall time at its parallel slots, from measured seconds per update, with each row's source.
Dry runs only (no training): exact hours of a 2-method spec, the source order (the check's file, its default
path, the committed table), the message of a model with no measurement, the linear scaling in tokens, bad
--timings files as one-line errors before anything runs, and IDPG Table 1's estimate."""

import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from fairseq_idpg import sweep
from fairseq_idpg import sweep_estimate as estimate
from fairseq_idpg.run_config import RunConfig

REPO = Path(__file__).resolve().parents[1]
TABLE_COLUMNS = (
    "device,model,method,precision,batch_size,tokens_per_sample,seconds_per_update_cpu,seconds_per_update_wall,"
    "peak_rss_mb,trained_params,all_params,checkpoint_mb,compact_mb,measured,command"
)
TWO_METHODS = """name: two
tasks: [RTE]
methods: [m-idpg-phm, lora]
lrs: [1.0e-3]
seeds: [1, 2, 3]
max_update: 1000
args: [--total-batch, 16]
"""


@pytest.fixture(autouse=True)
def no_default_sources(tmp_path, monkeypatch):
    """No GPU (the sweep plans CPU slots) and neither default source, unless a test writes one."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(estimate, "TIMINGS", tmp_path / "default" / "timings.json")
    monkeypatch.setattr(estimate, "TABLE", tmp_path / "default" / "seconds_per_update_cpu.csv")
    monkeypatch.setattr(estimate, "GPU_CHECKS", tmp_path / "default" / "gpu_check")


def entry(method, seconds, batch=16, tokens=128, precision="fp32"):
    return {"method": method, "precision": precision, "batch_size": batch, "tokens_per_sample": tokens,
            "seconds": seconds}  # fmt: skip


def write_timings(path, entries, device="cpu (fixture)", model="roberta.large"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": device, "model": model, "seconds_per_update": entries}))
    return path


def dry_run(tmp_path, capsys, spec, *flags):
    if isinstance(spec, str):
        (tmp_path / "spec.yaml").write_text(spec)
        spec = tmp_path / "spec.yaml"
    work = tmp_path / "work"
    code = sweep.main([str(spec), "--model", "roberta.large", "--work-dir", str(work), "--dry-run", *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def row(out, label):
    """The estimate's row of ``label`` (the plan's summary above has one too)."""
    return next(line for line in out.split("\nestimate (")[1].splitlines() if line.startswith(f"  {label} "))


def test_two_methods_give_exact_device_hours_and_wall_time(tmp_path, capsys):
    # m-idpg-phm measured at the runs' batch: 0.9 s; lora by its architecture (roberta_blocks: inducer) at batch
    # 32: 1.2 s, so 0.6 s at batch 16; 3 runs x 1,000 updates each
    # (the check's one-process loops against PEFT, step:NAME and peft:NAME, are no fairseq-train update)
    entries = [
        entry("m-idpg-phm", 0.9),
        entry("inducer", 1.2, batch=32),
        entry("step:lora", 0.1),
        entry("peft:lora", 0.1),
    ]
    timings = write_timings(tmp_path / "t.json", entries)
    out = dry_run(tmp_path, capsys, TWO_METHODS, "--timings", str(timings), "--jobs", "2")
    phm, lora = row(out, "m-idpg-phm"), row(out, "lora")
    assert re.search(r"\s3\s+3,000\s+0\.75\s+", phm), phm  # 3 x 1000 x 0.9 s = 0.75 h
    assert re.search(r"\s3\s+3,000\s+0\.50\s+", lora), lora  # 3 x 1000 x 0.6 s = 0.50 h
    assert re.search(r"total\s+6\s+6,000\s+1\.25$", out, re.M)
    assert f"{timings}: cpu (fixture), roberta.large, fp32, m-idpg-phm at batch 16 x 128 tokens = 0.9 s/update" in phm
    assert "inducer (arch roberta_blocks) at batch 32 x 128 tokens = 1.2 s/update" in lora
    # 1.25 h over 2 CPU slots; the longest run is 15m
    assert "wall time at 2 parallel slot(s) (local: 2 CPU run(s)" in out
    assert "0.62 h = 37m30s (device-hours / slots, at least the longest run's 15m00s; assumes full packing" in out
    assert "linearly with an update's tokens" in out and "6 runs' data is not prepared" in out


def fused_row(out, label):
    """The row of ``label`` in the estimate with --fuse."""
    return next(line for line in out.split("\nestimate with --fuse")[1].splitlines() if line.startswith(f"  {label} "))


def test_the_estimate_with_fuse_divides_each_group_by_its_measured_speed_up(tmp_path, capsys):
    """4 seeds of two methods with --fuse 4: a group each, its runs' time alone over the figure measured on the
    device of the per-update times, for the method at the largest measured group size not above the group's;
    on a device without a figure, unmeasured: no speed-up."""
    spec = TWO_METHODS.replace("seeds: [1, 2, 3]", "seeds: [1, 2, 3, 4]")
    h100 = write_timings(tmp_path / "h100.json", [entry("m-idpg-phm", 0.9), entry("lora", 0.6)],
                         device="NVIDIA H100 80GB HBM3")  # fmt: skip
    out = dry_run(tmp_path, capsys, spec, "--timings", str(h100), "--executor", "slurm", "--fuse", "4")
    assert "fused: 8 run(s) in 2 group(s) of up to 4 on one backbone each, 0 alone" in out
    assert re.search(r"total\s+8\s+8,000\s+1\.67$", out, re.M)  # alone: 4 x 1,000 x (0.9 + 0.6) s
    assert (
        "estimate with --fuse 4 (a group's time: its runs' time alone / the speed-up measured for such a group, "
        'docs/benchmarks.md, "Runs trained together on one backbone"; unmeasured: none assumed):' in out
    )
    step = "the training step only, NVIDIA H100, roberta.large's shape, bf16, batch 16 x 128"
    # 1.00 h / 1.99 and 0.67 h / 1.68
    assert (
        fused_row(out, "m-idpg-phm")
        == f"  m-idpg-phm                    4      1          0.50  1.99x (m-idpg-phm, K=4: {step}) for 1 group(s)"
    )
    assert (
        fused_row(out, "lora")
        == f"  lora                          4      1          0.40  1.68x (lora, K=4: {step}) for 1 group(s)"
    )
    assert re.search(r"^  total\s+8\s+2\s+0\.90$", out, re.M)
    assert "1 GPU(s) per run): 0.50 h = 30m09s (device-hours / slots, at least the longest run or group's 30m09s" in out

    cpu = write_timings(tmp_path / "cpu.json", [entry("m-idpg-phm", 0.9), entry("lora", 0.6)])
    out = dry_run(tmp_path, capsys, spec, "--timings", str(cpu), "--fuse", "3")  # 4 seeds: a group of 3, 1 alone
    # a group of 3 on a CPU: the figure of one run fused (K = 1), below 1: 0.50 h / 0.82 + 0.17 h alone
    wall = "updates per second of whole runs, stand-in's shape (6 x 384), fp32, batch 16 x 64, one CPU thread"
    assert (
        fused_row(out, "lora")
        == f"  lora                          4      1          0.78  0.82x (lora, K=1: {wall})"
        + " for 1 group(s); 1 run(s) alone"
    )


def test_the_fused_speed_up_is_the_largest_measured_group_not_above_the_groups_size():
    lora = estimate.fused_speedup("lora", 19, "NVIDIA H100 80GB HBM3")
    assert lora[0] == 1.68 and lora[1].startswith("1.68x (lora, K=4: ")
    assert estimate.fused_speedup("lora", 20, "NVIDIA H100 80GB HBM3")[0] == 3.03
    assert estimate.fused_speedup("lora", 3, "NVIDIA H100 80GB HBM3") == (
        1.0,
        "unmeasured (no speed-up assumed: none for lora in groups of 3 or fewer on NVIDIA H100 80GB HBM3)",
    )
    assert estimate.fused_speedup("lora", 20, "NVIDIA H200")[0] == 1.0  # measured on an H100 only
    # on any CPU: the stand-in's figures, for prompt tuning's architecture too
    long_prompt = estimate.fused_speedup("prompt-tuning-134", 20, "cpu (2 cores, shared)")
    cpu20 = next(
        f.factor for f in estimate.FUSED_SPEEDUPS if f.device == "cpu" and f.method == "prompt-tuning-5" and f.k == 20
    )
    assert long_prompt[0] == cpu20 and long_prompt[1].startswith(
        f"{cpu20:.2f}x (prompt-tuning-5 (arch roberta_prompt), K=20: "
    )
    assert estimate.fused_speedup("prompt-tuning-5", 19, "cpu")[0] == 0.86  # K = 4's


def test_wall_time_is_never_less_than_the_longest_run(tmp_path, capsys):
    timings = write_timings(tmp_path / "t.json", [entry("m-idpg-phm", 0.9), entry("lora", 0.6)])
    out = dry_run(tmp_path, capsys, TWO_METHODS, "--timings", str(timings), "--executor", "slurm")
    assert "wall time at 256 parallel slot(s) (slurm" in out  # 6 runs: the longest (15m) bounds it
    assert "0.25 h = 15m00s" in out and "(this sweep: cuda)" in row(out, "lora")


def test_a_model_without_a_measurement_gets_no_hours_and_the_check_to_run(tmp_path, capsys):
    timings = write_timings(tmp_path / "t.json", [entry("m-idpg-phm", 0.9)], model="roberta.base")
    out = dry_run(tmp_path, capsys, TWO_METHODS, "--timings", str(timings))
    message = (
        "no measurement for model roberta.large on this device (cpu): run scripts/check_gpu.sh --model roberta.large"
    )
    for label in ("m-idpg-phm", "lora"):
        assert re.search(r"\s3\s+3,000\s+-\s+" + re.escape(message), row(out, label))
    assert "(6 runs without a measurement: not counted)" in out
    assert re.search(r"^  total\s+6\s+6,000\s+-  \(6 runs without", out, re.M)
    assert "wall time: unknown (no run has a measurement)" in out


def test_source_order_the_checks_file_then_the_committed_table(tmp_path, capsys):
    """--timings first, else the default path; then the table's rows of the sweep's kind of device."""
    table = estimate.TABLE
    table.parent.mkdir(parents=True)
    rest = ",900,1,2,3,4,2026-11-25,cmd"  # the columns the estimate does not read
    table.write_text(TABLE_COLUMNS + "\n"
                     + f"cpu (table),roberta.large,lora,fp32,16,128,2.4,3.0{rest}\n"
                     + f"NVIDIA A100,roberta.large,lora,fp32,16,128,0.01,0.01{rest}\n"
                     + f"cpu (table),roberta.large,m-idpg-phm,fp32,16,128,3.6,4.0{rest}\n")  # fmt: skip
    out = dry_run(tmp_path, capsys, TWO_METHODS)  # the table alone (its CPU rows: the A100's is not this device)
    assert re.search(
        r"\s3,000\s+3\.00\s+\S*seconds_per_update_cpu.csv \(1 thread\): cpu \(table\)", row(out, "m-idpg-phm")
    )
    assert re.search(r"\s3,000\s+2\.00\s+", row(out, "lora"))
    write_timings(estimate.TIMINGS, [entry("m-idpg-phm", 0.9)])  # the check's default file: first
    out = dry_run(tmp_path, capsys, TWO_METHODS)
    assert re.search(r"\s0\.75\s+\S*default/timings.json: cpu \(fixture\)", row(out, "m-idpg-phm"))
    assert "seconds_per_update_cpu.csv" in row(out, "lora")  # nothing of its architecture in the file: the table
    given = write_timings(tmp_path / "given.json", [entry("m-idpg-phm", 1.8)])  # --timings replaces the default
    assert re.search(r"\s1\.50\s+\S*given.json", row(dry_run(tmp_path, capsys, TWO_METHODS, "--timings", str(given)),
                                                       "m-idpg-phm"))  # fmt: skip


def test_precision_falls_back_and_says_so():
    request = RunConfig("RTE", "m-idpg-phm", "roberta.large", fp16=True)
    assert estimate.precision(request) == "fp16"
    assert estimate.precision(request.with_flags(["--memory-efficient-fp16"])) == "memory-efficient-fp16"
    assert estimate.precision(RunConfig("RTE", "lora", bf16=True)) == "bf16"
    phm_bf16, dnn_fp16, prompt_fp32 = measured = [
        estimate.Measurement("gpu", "roberta.large", "m-idpg-phm", "bf16", 16, 128, 0.5, "f"),
        estimate.Measurement("gpu", "roberta.large", "m-idpg-dnn", "fp16", 16, 128, 0.4, "f"),
        estimate.Measurement("gpu", "roberta.large", "prompt-tuning-5", "fp32", 16, 128, 0.3, "f"),
    ]
    assert estimate.lookup(measured, "roberta.large", "m-idpg-phm", "bf16", 16) == (phm_bf16, "m-idpg-phm")
    # its architecture at the run's precision (memory-efficient fp16 is fp16) comes before the method at another
    by_arch = "m-idpg-dnn (arch roberta_idpg)"
    assert estimate.lookup(measured, "roberta.large", "m-idpg-phm", "fp16", 16) == (dnn_fp16, by_arch)
    assert estimate.lookup(measured, "roberta.large", "s-idpg-phm", "memory-efficient-fp16", 16) == (dnn_fp16, by_arch)
    assert estimate.lookup(measured, "roberta.large", "dpt", "fp16", 16) == (prompt_fp32, "prompt-tuning-5 (arch "
                                                                                         "roberta_prompt)")  # fmt: skip
    assert estimate.lookup(measured, "roberta.large", "lora", "fp16", 16) is None  # no roberta_blocks method
    assert estimate.lookup(measured, "roberta.base", "m-idpg-phm", "bf16", 16) is None  # another model


def test_seconds_scale_linearly_with_batch_times_tokens(tmp_path):
    """A prepared train set of 10- and 20-token inputs: 16 tokens a sample with <s>, against a measurement's 32."""
    import torch
    from fairseq.data import indexed_dataset

    data = tmp_path / "RTE"
    (data / "input0").mkdir(parents=True)
    builder = indexed_dataset.make_builder(str(data / "input0" / "train.bin"), impl="mmap", vocab_size=100)
    for n in (10, 20):
        builder.add_item(torch.arange(n))
    builder.finalize(str(data / "input0" / "train.idx"))
    assert estimate.tokens_per_sample(str(data)) == 16.0
    run = SimpleNamespace(label="m", method="m-idpg-phm", config=RunConfig("RTE", "m-idpg-phm"))
    plan = SimpleNamespace(config={"updates": 3600, "batch": 64}, data=data)
    measured = [[estimate.Measurement("cpu", "roberta.large", "m-idpg-phm", "fp32", 16, 32, 2.0, "f")]]
    (r,) = estimate.estimate([(run, plan)], "roberta.large", measured, "cpu")
    assert r.seconds == pytest.approx(3600 * 2.0 * (64 * 16) / (16 * 32)) and r.unprepared == 0


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot be read"),
        ("{not json", "not JSON"),
        ('{"device": "gpu", "seconds_per_update": []}', "needs device, model and a seconds_per_update list"),
        ('{"device": "g", "model": "m", "seconds_per_update": [{"method": "lora"}]}', "has no 'precision'"),
        (json.dumps({"device": "g", "model": "m", "seconds_per_update": [entry("lora", -1.0)]}), "positive numbers"),
    ],
)
def test_a_bad_timings_file_is_one_line_before_anything_runs(tmp_path, capsys, content, message):
    path = tmp_path / "timings.json"
    if content is not None:
        path.write_text(content)
    (tmp_path / "spec.yaml").write_text(TWO_METHODS)
    work = tmp_path / "work"
    assert sweep.main([str(tmp_path / "spec.yaml"), "--work-dir", str(work), "--timings", str(path)]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"sweep: error: --timings {path}") and message in err, err
    assert "valid: JSON written by scripts/check_gpu.sh" in err and err.count("\n") == 1
    assert out == "" and not work.exists()  # nothing planned, nothing run


def test_a_bad_timings_file_through_sweep_sh_is_one_line(tmp_path):
    """What users run: scripts/sweep.sh runs the module as __main__, where the estimate's SweepError once
    escaped main's handler (a second class of the same name) as a traceback."""
    (tmp_path / "spec.yaml").write_text(TWO_METHODS)
    (tmp_path / "timings.json").write_text("{not json")
    cmd = [REPO / "scripts" / "sweep.sh", tmp_path / "spec.yaml", "--work-dir", tmp_path / "work"]
    proc = subprocess.run([*map(str, cmd), "--timings", str(tmp_path / "timings.json")], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "| INFO |" not in x]
    assert line.startswith(f"sweep: error: --timings {tmp_path / 'timings.json'}: not JSON")
    assert not (tmp_path / "work").exists()


def test_idpg_table1_dry_run_prints_its_estimate_and_sources(tmp_path, capsys):
    """The issue's example: 1,800 runs, 51.7M updates; a fixture of the check's file (GPU, fp16) for its
    four architectures; efl has fine-tuning's architecture, the adapters LoRA's (whose entry is bf16)."""
    timings = write_timings(tmp_path / "t.json", [entry("m-idpg-phm", 0.12, 32, precision="fp16"),
                                                  entry("prompt-tuning-5", 0.1, 32, precision="fp16"),
                                                  entry("lora", 0.09, 32, precision="bf16"),
                                                  entry("finetune", 0.3, 32, precision="fp16")],
                            device="NVIDIA H100 (made-up figures)")  # fmt: skip
    out = dry_run(tmp_path, capsys, REPO / "examples" / "idpg" / "table1.yaml", "--timings", str(timings))
    assert re.search(r"^  total\s+1,800\s+51,706,495\s+1,336\.81$", out, re.M)
    assert re.search(r"\s200\s+5,787,000\s+152\.28\s+", row(out, "m-idpg-phm"))
    assert "NVIDIA H100 (made-up figures), roberta.large, bf16 (run: fp16), lora (arch roberta_blocks)" in row(
        out, "compacter"
    )
    assert "wall time at 1 parallel slot(s) (local: 1 CPU run(s)" in out and "1,336.81 h = 55.7 days" in out


COMMITTED_TABLE = REPO / "docs" / "data" / "seconds_per_update_cpu.csv"


@pytest.mark.skipif(
    not any(m.model == "roberta.large" for m in estimate.read_table(COMMITTED_TABLE)),
    reason="docs/data/seconds_per_update_cpu.csv has no roberta.large rows yet",
)
def test_idpg_table1_estimate_from_the_committed_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(estimate, "TABLE", COMMITTED_TABLE)
    spec = REPO / "examples" / "idpg" / "table1.yaml"
    out = dry_run(tmp_path, capsys, spec, "--tasks", "RTE", "--seeds", "1")
    assert "docs/data/seconds_per_update_cpu.csv (1 thread)" in row(out, "m-idpg-phm")
    assert re.search(r"^  total\s+36\s+[\d,]+\s+[\d,]+\.\d\d", out, re.M)


def test_a_gpu_sweep_reads_the_committed_gpu_check(tmp_path, capsys, monkeypatch):
    """docs/data/gpu_check/: the check's file from the H200 this project was lent (roberta.large size): a GPU
    sweep's estimate uses it, naming the file, the device and the measurement; a CPU sweep does not."""
    monkeypatch.setattr(estimate, "GPU_CHECKS", REPO / "docs" / "data" / "gpu_check")
    h200 = REPO / "docs" / "data" / "gpu_check" / "nvidia-h200.roberta.large.json"
    seconds = {(e["method"], e["precision"]): e["seconds"] for e in json.loads(h200.read_text())["seconds_per_update"]}
    spec = REPO / "examples" / "idpg" / "table1.yaml"
    out = dry_run(tmp_path, capsys, spec, "--tasks", "RTE", "--seeds", "1", "--executor", "slurm")
    measured = f"batch 16 x 128 tokens = {seconds['m-idpg-phm', 'fp16']:.4g} s/update"
    assert f"nvidia-h200.roberta.large.json: NVIDIA H200, roberta.large, fp16, m-idpg-phm at {measured}" in row(
        out, "m-idpg-phm"
    )
    assert any("gpu_check" in m.source for found in estimate.sources(None, "cuda") for m in found)
    assert not any("gpu_check" in m.source for found in estimate.sources(None, "cpu") for m in found)


def test_parallel_slots_of_each_executor():
    opts = SimpleNamespace(executor="local", jobs=None, runs_per_gpu=2, threads=None)
    slots, device, where = estimate.parallelism(opts, sweep.local_slots(runs_per_gpu=2, gpus=["0", "3"]))
    assert (slots, estimate.device_kind(device), where) == (4, "cuda", "local: 2 GPU(s) x 2 run(s) each")
    assert estimate.parallelism(opts, sweep.local_slots(jobs=3, threads=1, gpus=[])) == (
        3, "cpu", "local: 3 CPU run(s), 1 thread(s) each")  # fmt: skip
    slurm = SimpleNamespace(executor="slurm", gpus_per_run=0, array_parallelism=64)
    assert estimate.parallelism(slurm)[:2] == (64, "cpu")


def test_runs_with_compiled_layers_train_alone_under_fuse(tmp_path, capsys):
    """A group runs its members under vmap, where compiled layers do not apply: such runs stay alone."""
    spec = TWO_METHODS.replace(
        "methods: [m-idpg-phm, lora]", "methods: [m-idpg-phm, {method: lora, args: [--compile-layers]}]"
    )
    out = dry_run(tmp_path, capsys, spec, "--fuse", "4")
    assert "fused: 3 run(s) in 1 group(s) of up to 3 on one backbone each, 3 alone" in out
