"""scripts/run.sh end to end on slices of the real SST-2 files and the stand-in, for the tests of the main
job and of what happens when its launcher dies. No tests here."""

import os
import signal
import subprocess
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
RUN_SH = REPO / "scripts" / "run.sh"


def write_slice(raw, source, rows):
    raw.mkdir(parents=True, exist_ok=True)
    for name, n in rows.items():
        lines = (source / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (raw / name).write_text("".join(lines[: n + 1]), encoding="utf-8")
    return raw


# 6 updates of 8 on 64 SST-2 sentences (one epoch = 8 updates), validated and saved at 3 and 6
SMALL = ["--method", "lora", "--max-update", "6", "--total-batch", "8", "--validate-interval-updates", "3"]


def start(work, raw, *args, log, env=None):
    """scripts/run.sh SST-2 in its own session (so kill -9 reaches fairseq-train), output to ``log``."""
    cmd = ["bash", str(RUN_SH), "SST-2", "--raw", str(raw), "--work-dir", str(work), *SMALL, *args]
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True, env=env)


def finish(proc, log, timeout=900):
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    text = Path(log).read_text()
    assert proc.returncode == 0, text[-3000:]
    return text


def trained(folder):
    """The LoRA tensors and the head of checkpoint_last.pt (a compact checkpoint: nothing else)."""
    state = torch.load(folder / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    return {k: v for k, v in state["model"].items() if not k.startswith("_")}, state


def children(pid):
    """The processes ``pid`` started (Linux: /proc/PID/task/*/children)."""
    return [int(c) for task in Path(f"/proc/{pid}/task").glob("*") for c in (task / "children").read_text().split()]


def alive(pid):
    """A process that still runs (a killed one whose parent is gone may stay a zombie until reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
