"""scripts/gpu_proof.sh (the device script) in its CPU mode: every part's code path at a tiny size, the JSON's keys and
the ratios it holds computed from its own figures, the regenerated docs table equal to the JSON's, a part over its
budget marked cut, the file written when the overall limit runs out; the tables from a JSON alone; its refusals."""

import json
import math
import subprocess
from pathlib import Path

import pytest

from fairseq_idpg.gpu_proof import PARTS
from fairseq_idpg.gpu_proof.table import BEGIN, END, region, render

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_proof.sh"
HEADER = {"command", "date", "device", "torch", "cuda", "size", "layers", "dim", "heads", "ffn", "dictionary", "batch",
          "length", "dtype", "limit_seconds", "budgets", "parts", "finished", "interrupted", "wall_seconds",
          "setup_seconds", "backbone_seconds"}  # fmt: skip
PART = {"device", "budget_seconds", "seconds", "rows", "cut"}


def doc_with_markers(folder):
    doc = folder / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\nbefore\n\n{BEGIN}\nold tables\n{END}\n\nafter\n")
    return doc


def proof(tmp_path, *flags, timeout=900):
    out, doc = tmp_path / "proof.json", doc_with_markers(tmp_path)
    cmd = ["bash", str(SCRIPT), "--out", str(out), "--doc", str(doc), "--work", str(tmp_path / "work"), *flags]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    return run, out, doc


# the tests of cpu_run run on one pytest-xdist worker, so that it is built once (29 s)
SHARES_CPU_RUN = pytest.mark.xdist_group("gpu-proof-cpu-run")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """Every part once, at the CPU's tiny size: the fused part for one method (its groups at K = 3 and 2), the
    updates part's budget 1 s (its first measurement runs, the second is cut)."""
    tmp = tmp_path_factory.mktemp("gpu_proof")
    run, out, doc = proof(tmp, "--methods", "prompt-tuning-5", "--budget", "updates=1")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout, json.loads(out.read_text()), doc


@pytest.mark.slow
@SHARES_CPU_RUN
def test_every_part_runs_on_the_cpu_and_the_json_holds_it(cpu_run):
    text, data, _ = cpu_run
    assert "no CUDA device: every part runs on the CPU at a tiny size" in text
    assert "expected on a GPU: fused 240 + updates 1 + resume 40 + serving 60 + the start ~40 = 381 s" in text
    assert set(data) == HEADER
    assert data["device"] == "cpu" and data["cuda"] is None and data["finished"] and data["interrupted"] is None
    assert data["dictionary"] == 50265  # RoBERTa's, from the synthetic vocabulary
    assert (data["layers"], data["dim"], data["batch"], data["length"]) == (2, 32, 4, 16)
    assert list(data["parts"]) == list(PARTS)
    for name, part in data["parts"].items():
        assert PART <= set(part) and part["device"] == "cpu" and "error" not in part, (name, part)
        assert part["rows"], name

    fused = data["parts"]["fused"]
    assert [(r["method"], r["k"]) for r in fused["rows"]] == [("prompt-tuning-5", 3), ("prompt-tuning-5", 2)]
    for r in fused["rows"]:
        assert r["alone_runs_timed"] == 1 and r["alone_scaled_to_k"] and not r["cut"]
        assert r["lone_updates"] == r["fused_rounds"] == r["updates"] == 6
        # the ratios are the row's own figures' (computed in the run that measured them)
        assert math.isclose(r["speedup"], r["k"] * r["ms_per_update_alone"] / r["ms_per_round_fused"], rel_tol=1e-9)
        assert math.isclose(r["updates_per_s_fused"], 1e3 * r["k"] / r["ms_per_round_fused"], rel_tol=1e-9)
        assert math.isclose(r["seconds_ratio"], r["alone_seconds"] / r["fused_seconds"], rel_tol=1e-9)
        assert 0 < r["start_seconds"] < r["fused_seconds"] and r["peak_memory_bytes"] > 0

    updates = data["parts"]["updates"]
    (row,) = updates["rows"]
    assert (row["method"], row["peft"], row["precision"]) == ("lora", "lora", "bf16")
    assert all(row[k] > 0 for k in ("fairseq_update_ms", "peft_step_ms", "trainer_update_ms", "peft_step_flops"))
    assert math.isclose(row["update_over_peft"], row["fairseq_update_ms"] / row["peft_step_ms"], rel_tol=1e-9)
    assert math.isclose(row["update_over_trainer"], row["fairseq_update_ms"] / row["trainer_update_ms"], rel_tol=1e-9)
    assert math.isclose(row["peft_step_tflops"], row["peft_step_flops"] / row["peft_step_ms"] / 1e9, rel_tol=1e-9)
    # one model's maths on one batch: our update and PEFT's step count the same matmul and attention FLOPs
    assert row["fairseq_update_flops"] == row["peft_step_flops"]

    (resumed,) = data["parts"]["resume"]["rows"]
    assert resumed["resumed"] and resumed["equal"] and resumed["moved"] and resumed["dropout"] == 0.1
    assert resumed["largest_difference"] <= resumed["atol"] < resumed["least_moved_after_stop"]

    (served,) = data["parts"]["serving"]["rows"]
    assert served["tasks"] == served["asked"] == 4 and served["passes"] == 1 and served["models_timed"] == 2
    assert math.isclose(served["speedup"], served["one_by_one_ms"] / served["mixed_ms"], rel_tol=1e-9)


@pytest.mark.slow
@SHARES_CPU_RUN
def test_a_part_over_its_budget_is_cut_and_says_so(cpu_run):
    text, data, _ = cpu_run
    updates = data["parts"]["updates"]
    cut = "prompt-tuning-5 bf16 not started: 0 s of the 1 s budget left, it would take about "
    assert updates["budget_seconds"] == 1 and updates["cut"].startswith(cut)
    # the estimate is the first measurement's time
    assert abs(float(updates["cut"][len(cut) :].split()[0]) - updates["rows"][0]["seconds"]) <= 1
    assert "[updates] cut: prompt-tuning-5 bf16 not started" in text
    assert all(data["parts"][name]["cut"] is None for name in ("fused", "resume", "serving"))


@pytest.mark.slow
@SHARES_CPU_RUN
def test_the_regenerated_tables_are_the_jsons(cpu_run):
    _, data, doc = cpu_run
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nbefore\n\n") and text.endswith("\nafter\n") and "old tables" not in text
    assert region(doc) == render(data)
    fused = data["parts"]["fused"]["rows"][0]
    line = next(x for x in region(doc).splitlines() if x.startswith("| prompt-tuning-5 | 3 |"))
    assert f"**{fused['speedup']:,.2f}**" in line and f"| {fused['ms_per_round_fused']:,.1f} |" in line
    assert "**cut**: prompt-tuning-5 bf16 not started" in region(doc)


def test_the_tables_come_from_a_json_alone(tmp_path, cpu_json):
    doc = doc_with_markers(tmp_path)
    source = tmp_path / "proof.json"
    source.write_text(json.dumps(cpu_json))
    run = subprocess.run(["bash", str(SCRIPT), "--render", str(source), "--doc", str(doc)], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert region(doc) == render(cpu_json)
    cpu_json["parts"]["fused"]["rows"][0]["speedup"] = 123.456
    assert "**123.46**" in render(cpu_json) and "**123.46**" not in region(doc)


@pytest.fixture
def cpu_json():
    """A JSON as the CPU mode writes it (fields only; figures made up): the table's input."""
    fused = {"method": "lora", "k": 3, "updates": 6, "alone_runs_timed": 1, "alone_scaled_to_k": True,
             "ms_per_update_alone": 10.0, "ms_per_round_fused": 15.0, "updates_per_s_alone": 100.0,
             "updates_per_s_fused": 200.0, "speedup": 2.0, "alone_seconds": 9.0, "fused_seconds": 6.0,
             "seconds_ratio": 1.5, "start_seconds": 2.0, "peak_memory_bytes": 2**30, "memory_measure": "x",
             "lone_updates": 6, "fused_rounds": 6, "cut": False}  # fmt: skip
    part = {"device": "cpu", "budget_seconds": 10, "seconds": 5.0, "rows": [fused], "cut": None}
    return {"command": "scripts/gpu_proof.sh", "date": "today", "device": "cpu", "torch": "2", "cuda": None,
            "size": "tiny", "layers": 2, "dim": 32, "heads": 4, "ffn": 64, "dictionary": 50265, "batch": 4,
            "length": 16, "dtype": "bf16", "parts": {"fused": part}, "finished": True, "wall_seconds": 9}  # fmt: skip


def test_the_overall_limit_writes_what_was_measured_and_ends(tmp_path):
    """A limit shorter than the start: the file is written (nothing measured, saying why) and the run ends, 124."""
    run, out, _ = proof(tmp_path, "--limit", "0.01", "--parts", "resume", timeout=300)
    assert run.returncode == 124, run.stdout[-2000:] + run.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["interrupted"] == "the overall limit of 0.01 s ran out" and not data["finished"]
    assert not list(tmp_path.glob(".proof.json.*")) and "out of time (0.01 s)" in run.stdout  # no write left half-done


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--budget", "fused"], "--budget fused: expected PART=SECONDS, e.g. fused=300"),
        (["--budget", "train=3"], "--budget train=3: PART is one of fused, updates, resume, serving and SECONDS >= 0"),
        (["--parts", "fused,gpu"], "--parts gpu: valid are fused, updates, resume, serving"),
        (["--methods", "lora,nope"], "--methods nope: unknown method record(s)"),
        (["--size", "huge"], "--size huge: valid are standin, base, large, tiny"),
        (["--limit", "0"], "--limit must be > 0 seconds, got 0"),
    ],
)
def test_bad_flags_are_refused_in_one_line(flags, said, capsys):
    from fairseq_idpg.gpu_proof.cli import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(flags)
    assert e.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [f"gpu_proof.sh: error: {said}"]


def test_a_doc_without_markers_is_refused_before_anything_runs(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("# no markers\n")
    run = subprocess.run(["bash", str(SCRIPT), "--doc", str(doc), "--out", str(tmp_path / "p.json")],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 2 and not (tmp_path / "p.json").exists()
    assert run.stderr.strip().splitlines() == [
        f"gpu_proof.sh: error: --doc {doc}: expected the lines {BEGIN!r} and {END!r} once each, in that order"
    ]


def test_a_failed_measurement_is_kept_and_the_part_goes_on(tmp_path):
    """A measurement that raises (out of memory, say) is the part's finding: its line in the record's errors, in the
    file at once, the run's status 1; the part's next measurement still starts, and the table says it failed."""
    from fairseq_idpg.gpu_proof.cli import Part, Proof

    proof = Proof(tmp_path / "p.json", None, {})
    part = Part(proof, "fused", 100, "cpu")
    done = []
    for what in ("first", "second"):
        assert part.fits(what)
        with part.measuring(what):
            if what == "first":
                raise RuntimeError("CUDA out of memory")
            part.add({"n": 2}, "second measured")
            done.append(what)
    assert done == ["second"] and proof.failed
    written = json.loads((tmp_path / "p.json").read_text())["parts"]["fused"]
    assert written["errors"] == ["first: RuntimeError: CUDA out of memory"] and written["rows"][0]["n"] == 2
    from fairseq_idpg.gpu_proof.table import _status

    assert "**failed**: first: RuntimeError: CUDA out of memory" in _status(written)


def test_a_part_cuts_what_its_time_left_does_not_cover(tmp_path):
    """A measurement starts only while the part's time left covers its last one (times the asked scale); else the
    part is cut, in the file, saying what and why."""
    from fairseq_idpg.gpu_proof.cli import Part, Proof

    proof = Proof(tmp_path / "p.json", None, {})
    part = Part(proof, "fused", 500, "cpu")
    assert part.fits("lora K=20")
    part.add({"k": 20}, "measured")
    part.last, part.start = 300.0, part.start - 300  # as if that group took 300 s: 200 s are left
    assert part.fits("lora K=4", scale=4 / 20) and part.record["cut"] is None  # about 60 s
    part.last = 300.0
    assert not part.fits("m-idpg-phm K=20")
    cut = json.loads((tmp_path / "p.json").read_text())["parts"]["fused"]["cut"]
    assert cut.startswith("m-idpg-phm K=20 not started: ")
    assert cut.endswith(" s of the 500 s budget left, it would take about 300 s")
    assert 195 <= float(cut.split(": ")[1].split()[0]) <= 200


def test_the_gpu_run_is_planned_within_eight_minutes():
    """The default budgets and the start fit the limit, the limit is 8 minutes, and the run prints so."""
    from fairseq_idpg.gpu_proof.cli import GPU_BUDGETS, LIMIT, START_ESTIMATE, estimate

    assert list(GPU_BUDGETS) == list(PARTS) and LIMIT == 480
    assert sum(GPU_BUDGETS.values()) + START_ESTIMATE <= LIMIT
    assert estimate(GPU_BUDGETS, LIMIT) == (
        "expected on a GPU: fused 240 + updates 90 + resume 40 + serving 60 + the start ~40 = 470 s, within the 480 s "
        "limit"
    )
    assert estimate({"fused": 500}, LIMIT).endswith("= 540 s, OVER the 480 s limit")
