"""The service under bad start-up flags and hostile requests, through the command users run
(``python -m fairseq_idpg.serve`` in its own process, real HTTP): a start-up mistake is one line and exit 2
before any model loads (the busy port in a process of its own, the other mistakes through the command's ``main``
in this process: the message is the point, and each process start costs ~5 s of imports); every error response
is ``{"error": ...}`` and a 4xx, never a 500; the body limit holds while the body is still arriving; the log is a
line per task. Tiny runs (tests/multitask_support.py)."""

import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
from multitask_support import PAIR, write_runs

httpx = pytest.importorskip("httpx")

TASKS = {"sst2": ("lora", "sst2"), "mi": ("m-idpg-phm", "sst2"), "nli": ("prompt-tuning-5", "mnli")}
PROG = "python -m fairseq_idpg.serve"
MAX_BODY = 1 << 20  # the service's body limit
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


def refused(argv, tmp_path, capsys=None):
    """The command's one stderr line; it exits 2, writes nothing else and leaves its folder as it was. With
    ``capsys``: the command's ``main`` in this process (the same parser and checks), in ``tmp_path`` as its cwd."""
    before = sorted(tmp_path.rglob("*"))
    if capsys is None:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    else:
        from fairseq_idpg.serve.__main__ import main

        assert argv[1:3] == ["-m", "fairseq_idpg.serve"], argv
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited, contextlib.chdir(tmp_path):
            main(argv[3:])
        said = capsys.readouterr()
        out = subprocess.CompletedProcess(argv, exited.value.code, said.out, said.err)
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
def test_a_port_that_is_no_port_is_one_line(junk, tmp_path, capsys, port):
    line = refused(junk + ["--task", f"a={tmp_path / 'run'}", "--port", port], tmp_path, capsys)
    assert line == f"{PROG}: error: argument --port: {port}: expected a port number, 0 to 65535 (0: a free port)"


def test_a_missing_task_data_folder_is_named_in_one_line(junk, tmp_path, capsys):
    gone = tmp_path / "data" / "gone"
    argv = junk + ["--task", f"a={tmp_path / 'run'}", "--task-data", f"a={gone}", "--port", "0"]
    line = refused(argv, tmp_path, capsys)
    assert line == f"{PROG}: error: --task-data a={gone}: no such folder"


def test_start_up_mistakes_are_one_line_without_the_usage_block(junk, tmp_path, capsys):
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
        assert refused(junk + argv + ["--port", str(free_port())], tmp_path, capsys) == f"{PROG}: error: {error}"
    line = refused(junk[:-1] + ["gone.pt", "--task", run], tmp_path, capsys)
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


def post(url, content, **headers):
    return httpx.post(f"{url}/predict", content=content, headers=headers, timeout=120)


@pytest.mark.parametrize(
    "method, path, status, error",
    [
        ("GET", "/predict", 405, "GET /predict: method not allowed; use POST"),
        ("PUT", "/health", 405, "PUT /health: method not allowed; use GET"),
        ("GET", "/nothing", 404, "GET /nothing: no such route; the routes are POST /predict and GET /health"),
        ("POST", "/", 404, "POST /: no such route; the routes are POST /predict and GET /health"),
    ],
)
def test_a_wrong_route_or_method_gets_the_error_form(service, method, path, status, error):
    url, _ = service
    answer = httpx.request(method, f"{url}{path}", timeout=120)
    assert (answer.status_code, answer.json()) == (status, {"error": error})


@pytest.mark.parametrize("depth", [100_000, 5000, 990, 900, 500])
def test_deeply_nested_brackets_are_a_4xx_never_a_500(service, depth):
    url, _ = service
    answer = post(url, "[" * depth + "]" * depth)
    assert answer.status_code in (400, 422) and list(answer.json()) == ["error"], (answer.status_code, answer.text)
    if depth >= 5000:
        assert answer.json() == {"error": "request body nests lists or objects too deeply (a request needs 4 levels)"}
    inside = post(url, '{"task": ' + "[" * depth + "]" * depth + ', "sentences": ["x"]}')
    assert inside.status_code in (400, 422) and list(inside.json()) == ["error"], (inside.status_code, inside.text)


def test_a_body_that_is_not_utf8_is_said_so(service):
    url, _ = service
    body = '{"task": "sst2", "sentences": ["caf\xe9"]}'.encode("latin-1")  # the e-acute is byte 35
    answer = post(url, body)
    assert (answer.status_code, answer.json()) == (400, {"error": "request body is not UTF-8 (byte 35: 0xe9)"})


def test_a_body_over_the_limit_is_refused_while_it_is_still_arriving(service):
    """No Content-Length (chunked), and the client stops sending after the limit without ending its body: a
    service that reads the whole body before it counts never answers."""
    url, _ = service
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=300) as s:
        s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        s.sendall(b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"[" * (64 << 10)
        for _ in range(MAX_BODY // len(chunk) + 2):
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            got = s.recv(65536)  # the socket's timeout is the deadline
            assert got, answer
            answer += got
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 413 "), head
    assert json.loads(body) == {"error": f"request body of more than {MAX_BODY} bytes; at most {MAX_BODY}"}
    assert httpx.get(f"{url}/health", timeout=120).status_code == 200


def test_a_body_over_the_limit_with_its_length_is_refused_unread(service):
    url, _ = service
    answer = post(url, b"[" * (MAX_BODY + 1))
    error = f"request body of {MAX_BODY + 1} bytes; at most {MAX_BODY}"
    assert (answer.status_code, answer.json()) == (413, {"error": error})


def own_model(tiny4, run, data):
    from fairseq.models.roberta import RobertaModel

    return RobertaModel.from_pretrained(
        str(run), "checkpoint_best.pt", data_name_or_path=str(data), user_dir="fairseq_idpg",
        backbone=str(tiny4.model_file), bpe="wordpiece", wordpiece_vocab=str(tiny4.folder / "vocab.txt"),
    ).eval()  # fmt: skip


@pytest.mark.parametrize("task", ["sst2", "mi", "nli"])  # LoRA, M-IDPG and prompt tuning: prompts counted once
def test_the_longest_input_is_the_one_the_tasks_own_model_takes(service, tiny4, runs, task):
    """A prompt's positions are counted once: the service takes every input the run's own hub model scores, with
    its probabilities, and refuses the first one it cannot."""
    import torch

    url, _ = service
    hub = own_model(tiny4, runs[task], runs[task].parents[1] / "data" / TASKS[task][1])
    longest = hub.model.max_positions()

    def text(tokens):  # a sentence, or a pair, of exactly ``tokens`` tokens: <s> a </s> (</s> b </s>)
        if PAIR[TASKS[task][1]]:
            return ["word " * (tokens - 5), "word"]
        return "word " * (tokens - 2)

    rows = [text(longest)] if isinstance(text(longest), str) else text(longest)
    assert len(hub.encode(*rows)) == longest
    with torch.no_grad():
        probabilities = hub.predict("sentence_classification_head", hub.encode(*rows))[0].exp().tolist()
    answer = post(url, json.dumps({"task": task, "sentences": [text(longest)]}))
    assert answer.status_code == 200, answer.text
    assert list(answer.json()["predictions"][0]["probabilities"].values()) == pytest.approx(probabilities, abs=1e-5)
    answer = post(url, json.dumps({"task": task, "sentences": [text(longest + 1)]}))
    error = f"sentences[0]: task {task}: input of {longest + 1} tokens, longer than the {longest} it takes"
    assert (answer.status_code, answer.json()) == (413, {"error": error})
