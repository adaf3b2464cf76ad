"""The service under bad start-up flags, through the command users run (``python -m fairseq_idpg.serve`` in
its own process): a start-up mistake is one line and exit 2 before any model loads; the log is a line per task.
Tiny runs (tests/multitask_support.py)."""

import re
import socket
import subprocess
import sys
import threading
import time

import pytest
from multitask_support import write_runs

TASKS = {"sst2": ("lora", "sst2"), "mi": ("m-idpg-phm", "sst2"), "nli": ("prompt-tuning-5", "mnli")}
PROG = "python -m fairseq_idpg.serve"
pytestmark = pytest.mark.xdist_group("serve")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny4):
    return write_runs(tmp_path_factory.mktemp("serve-faults"), tiny4, TASKS)


def command(tiny4, runs):
    out = [sys.executable, "-m", "fairseq_idpg.serve", "--backbone", str(tiny4.model_file), "--bpe", "wordpiece"]
    out += ["--wordpiece-vocab", str(tiny4.folder / "vocab.txt")]
    return out + [x for name, run in runs.items() for x in ("--task", f"{name}={run}")]


@pytest.fixture(scope="module")
def service(tiny4, runs):
    """(base URL, the lines it wrote to stderr until ready) of the command serving TASKS on a free port."""
    with subprocess.Popen(command(tiny4, runs) + ["--port", "0"], stderr=subprocess.PIPE, text=True) as proc:
        lines = []  # read by a thread: a service that never starts fails the test instead of hanging it
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
        reader.start()
        deadline = time.monotonic() + 600  # loading and warming up three tasks: seconds, unless the machine is busy
        while not any(x.startswith("serving ") for x in list(lines)) and proc.poll() is None:
            assert time.monotonic() < deadline, f"the service did not start: {lines}"
            time.sleep(0.1)
        ready = list(lines)
        assert ready and ready[-1].startswith("serving "), ready
        try:
            yield f"http://127.0.0.1:{int(ready[-1].rsplit(':', 1)[1])}", ready
        finally:
            proc.terminate()
            proc.wait(60)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------- start-up


@pytest.fixture
def junk(tmp_path):
    """A backbone and a run whose checkpoint are not checkpoints: a command that loads either says so, so a
    refusal that names something else came before any load."""
    (tmp_path / "backbone.pt").write_bytes(b"not a checkpoint")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint_best.pt").write_bytes(b"not a checkpoint")
    return [sys.executable, "-m", "fairseq_idpg.serve", "--backbone", str(tmp_path / "backbone.pt")]


def refused(argv, tmp_path):
    """The command's one stderr line; it exits 2, writes nothing else and leaves its folder as it was."""
    before = sorted(tmp_path.rglob("*"))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out
    assert sorted(tmp_path.rglob("*")) == before
    return out.stderr.rstrip("\n")


def test_a_busy_port_is_one_line_before_any_model_loads(junk, tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        line = refused(junk + ["--task", f"a={tmp_path / 'run'}", "--port", str(port)], tmp_path)
    assert line == (
        f"{PROG}: error: --port {port}: 127.0.0.1:{port} is in use (another process listens there); "
        "--port 0: a free one"
    )


@pytest.mark.parametrize("port", ["-5", "65536", "http"])
def test_a_port_that_is_no_port_is_one_line(junk, tmp_path, port):
    line = refused(junk + ["--task", f"a={tmp_path / 'run'}", "--port", port], tmp_path)
    assert line == f"{PROG}: error: argument --port: {port}: expected a port number, 0 to 65535 (0: a free port)"


def test_a_missing_task_data_folder_is_named_in_one_line(junk, tmp_path):
    gone = tmp_path / "data" / "gone"
    line = refused(junk + ["--task", f"a={tmp_path / 'run'}", "--task-data", f"a={gone}", "--port", "0"], tmp_path)
    assert line == f"{PROG}: error: --task-data a={gone}: no such folder"


def test_start_up_mistakes_are_one_line_without_the_usage_block(junk, tmp_path):
    run = f"a={tmp_path / 'run'}"
    for argv, error in (
        ([], "the following arguments are required: --task"),
        (["--task", "a"], "--task a: expected NAME=PATH"),
        (["--task", run, "--task", run], f"--task {run}: task a given twice"),
        (["--task", run, "--task-data", "b=x"], "--task-data b=...: no --task b"),
        (["--task", f"a={tmp_path / 'gone'}"], f"task a: {tmp_path / 'gone'}: no such run folder or checkpoint file"),
        (["--task", run, "--max-batch-rows", "0"], "--max-wait-ms must be >= 0, --max-batch-rows and --max-request-rows >= 1"),  # noqa: E501
        (["--task", run, "--wordpiece-vocab", "nowhere.txt"], "--wordpiece-vocab nowhere.txt: no such file"),
    ):  # fmt: skip
        assert refused(junk + argv + ["--port", str(free_port())], tmp_path) == f"{PROG}: error: {error}"
    line = refused(junk[:-1] + ["gone.pt", "--task", run], tmp_path)
    assert line == f"{PROG}: error: --backbone gone.pt: no such file"


# ---------------------------------------------------------------------------------------------- serving


def test_the_log_is_a_line_per_task_and_says_it_warmed_up(service):
    """No fairseq configuration dump (~13 KB a task); every pass has run once before the service says it is
    ready, so that no client's request pays the process's first-batch costs."""
    _, lines = service
    assert len(lines) == len(TASKS) + 2, lines
    assert lines[: len(TASKS)] == [
        "task sst2: roberta_blocks, pass 0\n", "task mi: roberta_idpg, pass 1\n", "task nli: roberta_prompt, pass 2\n"
    ]  # fmt: skip
    assert re.fullmatch(r"warmed up in \d+\.\d s \(one row of every task\)\n", lines[-2]), lines[-2]
    assert re.fullmatch(r"serving 3 tasks on http://127\.0\.0\.1:\d+\n", lines[-1]), lines[-1]
