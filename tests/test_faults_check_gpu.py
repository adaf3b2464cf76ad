"""scripts/check_gpu.sh's refusals: a wrong --out before any work, a --train-args that fairseq-train refuses
named as the arguments' fault (not the device's); one line, exit status 2, no report, no temporary folder."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def check_gpu(tmp_path, *argv):
    """The command as a user runs it, its temporary folders in tmp_path/tmp (to see what it leaves)."""
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(temp), "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(REPO / "scripts" / "check_gpu.sh"), *argv], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)  # fmt: skip
    return run, sorted(p.name for p in temp.iterdir())


def said(run):
    """stderr less the warnings of torch and fairseq's imports."""
    lines = run.stderr.strip().splitlines()
    return [line for i, line in enumerate(lines) if "Warning: " not in line and "Warning: " not in lines[i - 1]]


def test_an_existing_folder_as_out_is_refused_before_any_work(tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    run, left = check_gpu(tmp_path, "--families", "lora", "--out", str(folder))
    assert run.returncode == 2 and run.stdout == ""  # before the check began
    assert said(run) == [
        f"check_gpu.sh: error: --out {folder}: is a folder; give the JSON file to write, e.g. {folder}/gpu_check.json"
    ]
    assert left == [] and list(folder.iterdir()) == []


def test_out_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    run, left = check_gpu(tmp_path, "--out", str(tmp_path / "file" / "gpu.json"))
    assert run.returncode == 2 and left == []
    assert said(run) == [f"check_gpu.sh: error: --out {tmp_path / 'file' / 'gpu.json'}: {tmp_path / 'file'} is a "
                         f"file, not a folder"]  # fmt: skip


def test_an_unknown_train_flag_is_the_arguments_fault_not_the_devices(tmp_path, tiny):
    out = tmp_path / "gpu.json"
    argv = ["--model", str(tiny.folder), "--families", "lora", "--precisions", "bf16", "--no-distributed"]
    run, left = check_gpu(tmp_path, *argv, "--train-args", "--lrr 1e-3 --seed 2", "--out", str(out))
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert "GPU check FAILED" not in run.stdout and "Traceback" not in run.stderr
    assert said(run) == [
        "check_gpu.sh: error: --train-args '--lrr 1e-3 --seed 2': fairseq-train refused its arguments "
        "(unrecognized arguments: --lrr 1e-3); give flags fairseq-train knows (fairseq-train --help), or none"
    ]
    assert not out.exists() and left == []
