"""The HTTP service (python -m fairseq_idpg.serve) over loopback with a real HTTP client (httpx; uvicorn in a
thread): mixed concurrent requests are answered as the Python API answers them (labels equal, probabilities
within 1e-5: other batches, float rounding), each bad request gets its 4xx and a clear message, never a 500.
The runs are built from tiny models (tests/multitask_support.py)."""

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from multitask_support import write_runs

from fairseq_idpg.hub import MultiTaskModel

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

TASKS = {
    "sst2": ("lora", "sst2"), "rte": ("lora", "rte"), "nli": ("m-idpg-phm", "mnli"),
    "rte-pt": ("prompt-tuning-5", "rte"), "stsb": ("lora", "stsb"),
}  # fmt: skip
SINGLES = ["a gripping , funny and moving film .", "the plot is thin .", "it 's fine .", "one of the year 's best ."]
PAIRS = [["A man is playing a guitar .", "Nobody plays ."], ["The cat sat .", "A cat sat on the mat ."]]
MAX_ROWS, MAX_BYTES = 8, 4096
pytestmark = pytest.mark.xdist_group("serve")


def sentences(task, n, offset=0):
    pool = SINGLES if task == "sst2" else PAIRS
    return [pool[(offset + i) % len(pool)] for i in range(n)]


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny4):
    """(base URL, the MultiTaskModel it serves, {task: run}) of uvicorn serving TASKS on a free loopback port."""
    from fairseq_idpg.serve.app import build_app
    from fairseq_idpg.serve.requests import Limits

    runs = write_runs(tmp_path_factory.mktemp("serve"), tiny4, TASKS)
    model = MultiTaskModel(tiny4.model_file, bpe="wordpiece", wordpiece_vocab=str(tiny4.folder / "vocab.txt"))
    for name, run in runs.items():
        model.attach(name, run)
    app = build_app(model, Limits(max_body_bytes=MAX_BYTES, max_rows=MAX_ROWS), max_wait=0.02)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(600):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", model, runs
    server.should_exit = True
    thread.join(10)


def expected(model, task, texts):
    return [
        {k: v for k, v in p.items() if k != "task"}
        for p in model.predict(task, [tuple(t) if isinstance(t, list) else t for t in texts])
    ]


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        if "score" in w:
            assert g["score"] == pytest.approx(w["score"], abs=1e-5)
        else:
            assert g["label"] == w["label"] and list(g["probabilities"]) == list(w["probabilities"])
            assert list(g["probabilities"].values()) == pytest.approx(list(w["probabilities"].values()), abs=1e-5)


def test_health_lists_the_tasks_and_their_passes(served):
    url, model, _ = served
    answer = httpx.get(f"{url}/health", timeout=30)
    assert answer.status_code == 200
    body = answer.json()
    assert body["status"] == "ok" and body["backbone"] == model.backbone
    assert {n: t["group"] for n, t in body["tasks"].items()} == {"sst2": 0, "rte": 0, "nli": 1, "rte-pt": 2, "stsb": 0}
    assert body["tasks"]["nli"]["labels"] == ["contradiction", "entailment", "neutral"] and body["tasks"]["nli"]["pair"]


def test_concurrent_mixed_clients_get_the_python_apis_answers(served):
    url, model, _ = served
    requests = []
    for i in range(12):
        single = [(task, sentences(task, 1 + (i + j) % 3, i)) for j, task in enumerate(TASKS) if (i + j) % 2]
        requests.append({"task": single[0][0], "sentences": single[0][1]} if i % 3 == 0 else
                        [{"task": t, "sentences": s} for t, s in single])  # fmt: skip

    def post(body):
        with httpx.Client(timeout=60) as client:
            return body, client.post(f"{url}/predict", json=body)

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(post, requests))
    for body, answer in answers:
        assert answer.status_code == 200, answer.text
        items, got = (body, answer.json()) if isinstance(body, list) else ([body], [answer.json()])
        for item, result in zip(items, got, strict=True):
            assert result["task"] == item["task"]
            assert_same(result["predictions"], expected(model, item["task"], item["sentences"]))
    assert httpx.get(f"{url}/health", timeout=30).json()["requests"] >= len(requests)


BAD = [
    ("not json", 400, "request body is not JSON"),
    ('{"task": "nope", "sentences": ["x"]}', 404, "unknown task 'nope'; attached: sst2, rte, nli, rte-pt, stsb"),
    ('[{"task": "sst2", "sentences": ["x"]}, {"task": "nope", "sentences": ["x"]}]', 404, "request 1: unknown task"),
    ('{"task": "sst2", "sentences": []}', 422, "sentences: empty; give at least one sentence"),
    ("[]", 422, "an empty list of requests"),
    ('{"task": "sst2", "sentences": "one"}', 422, 'sentences: expected a list of sentences, got a string "one"'),
    ('{"task": "sst2", "sentences": [3]}', 422, "sentences[0]: expected a string or a pair [first, second] of strings, got a number 3"),  # noqa: E501
    ('{"task": 7, "sentences": ["x"]}', 422, "task: expected a task name (a string), got a number 7"),
    ('{"sentences": ["x"]}', 422, "task: expected a task name (a string), got null"),
    ('{"task": "sst2", "sentences": ["x"], "top": 2}', 422, "unknown field(s) top"),
    ('"sst2"', 422, 'expected an object {"task": ..., "sentences": [...]}, got a string "sst2"'),
    ('{"task": "rte", "sentences": ["only one"]}', 422, "sentences[0]: task rte: takes a pair of sentences per row"),
    ('{"task": "sst2", "sentences": [["a", "b"]]}', 422, "task sst2: takes one sentence per row, got 2"),
    (json.dumps({"task": "sst2", "sentences": ["x"] * 9}), 413, f"9 sentences in one request; at most {MAX_ROWS}"),
    (json.dumps({"task": "sst2", "sentences": ["word " * 600]}), 413, "input of 602 tokens, longer than the 512"),
    (json.dumps({"task": "sst2", "sentences": ["x" * MAX_BYTES]}), 413, f"bytes; at most {MAX_BYTES}"),
]  # fmt: skip


@pytest.mark.parametrize("body, status, message", BAD, ids=[f"{s}-{m[:30]}" for _, s, m in BAD])
def test_bad_requests_get_a_4xx_and_the_reason(served, body, status, message):
    url, _, _ = served
    answer = httpx.post(
        f"{url}/predict", content=body.encode(), headers={"content-type": "application/json"}, timeout=30
    )
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]


def test_wrong_route_or_method_is_a_4xx(served):
    url, _, _ = served
    assert httpx.get(f"{url}/predict", timeout=30).status_code == 405
    assert httpx.get(f"{url}/nothing", timeout=30).status_code == 404


def test_the_command_refuses_a_bad_task_in_one_line(served, tmp_path, capsys):
    """Through the command's ``main`` in this process (the same parser and checks; a process start costs ~5 s of
    imports): test_serve_faults.py starts the command for a start-up mistake, and test_the_command_serves to serve."""
    from fairseq_idpg.serve.__main__ import main

    _, model, runs = served
    command = ["--backbone", model.backbone, "--bpe", "wordpiece"]
    for task, error in (
        ("sst2", "--task sst2: expected NAME=PATH"),
        (f"x={tmp_path / 'gone'}", f"task x: {tmp_path / 'gone'}: no such run folder or checkpoint file"),
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            main(command + ["--task", task])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and err.strip().splitlines()[-1].endswith(f"error: {error}"), err


@pytest.mark.slow
def test_the_command_serves(served):
    """python -m fairseq_idpg.serve in its own process answers as the Python API does."""
    _, model, runs = served
    vocab = model.hub_options["wordpiece_vocab"]
    with subprocess.Popen(
        [sys.executable, "-m", "fairseq_idpg.serve", "--backbone", model.backbone, "--bpe", "wordpiece"]
        + ["--wordpiece-vocab", vocab, "--task", f"sst2={runs['sst2']}", "--task", f"nli={runs['nli']}", "--port", "0"],
        stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        try:
            lines = []  # read by a thread: a service that never starts fails the test instead of hanging it
            reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
            reader.start()
            port, deadline = None, time.monotonic() + 240
            while port is None and time.monotonic() < deadline and proc.poll() is None:
                port = next((int(x.rsplit(":", 1)[1]) for x in list(lines) if x.startswith("serving ")), None)
                time.sleep(0.1)
            assert port, "the service did not start"
            body = [{"task": "sst2", "sentences": SINGLES[:2]}, {"task": "nli", "sentences": PAIRS}]
            got = httpx.post(f"http://127.0.0.1:{port}/predict", json=body, timeout=60).json()
            assert_same(got[0]["predictions"], expected(model, "sst2", SINGLES[:2]))
            assert_same(got[1]["predictions"], expected(model, "nli", PAIRS))
        finally:
            proc.terminate()
