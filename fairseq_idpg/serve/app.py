"""The service's ASGI app (FastAPI) over a ``MultiTaskModel``: JSON in and out.

    POST /predict   {"task": "sst2", "sentences": ["a gripping film .", ...]}
                    -> {"task": "sst2", "predictions": [{"label": "1", "probabilities": {"0": 0.1, "1": 0.9}}, ...]}
                    a list of such objects (any tasks) -> the list of their answers, in order
    GET  /health    -> {"status": "ok", "backbone": ..., "tasks": {name: {arch, labels, pair, group}}, ...}

A regression task answers ``{"score": x}`` per sentence. A bad request gets a 4xx and ``{"error": "..."}``: 400
(not UTF-8, not JSON, nested too deeply), 404 (unknown task or route), 405 (a route's other method), 413 (body,
request or sentence too large; the body is read no further than its limit), 422 (wrong types, empty input, a
single sentence for a pair task); never a 500.
"""

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from fairseq_idpg.hub.multitask import InputTooLong

from .batcher import Batcher
from .requests import Limits, RequestError, parse


def build_app(model, limits=None, max_batch_rows=64, max_wait=0.005):
    """The app serving ``model`` (a MultiTaskModel with its tasks attached). ``max_wait``: seconds a request
    waits for others to share its batch; ``max_batch_rows``: a batch's rows beyond which it waits no longer."""
    limits = limits or Limits()
    batcher = Batcher(model, max_batch_rows, max_wait)

    @asynccontextmanager
    async def lifespan(app):
        await batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="fairseq-idpg: many tasks, one frozen backbone", lifespan=lifespan)
    app.state.batcher = batcher

    @app.exception_handler(RequestError)
    async def bad_request(request, error):
        return JSONResponse({"error": error.message}, status_code=error.status)

    @app.exception_handler(HTTPException)
    async def routing_error(request, error):
        """FastAPI's own errors (no route, another method) in the service's ``{"error": ...}`` form."""
        where = f"{request.method} {request.url.path}"
        if error.status_code == 404:
            message = f"{where}: no such route; the routes are POST /predict and GET /health"
        elif error.status_code == 405:
            message = f"{where}: method not allowed; use {(error.headers or {}).get('Allow', 'another')}"
        else:
            message = f"{where}: {error.detail}"
        return JSONResponse({"error": message}, status_code=error.status_code, headers=error.headers)

    @app.get("/health")
    async def health():
        return {
            "status": "ok",
            "backbone": model.backbone,
            "tasks": model.describe(),
            "batches": batcher.batches,
            "requests": batcher.requests,
        }

    @app.post("/predict")
    async def predict(request: Request):
        is_list, items = parse(await body(request, limits.max_body_bytes), limits)
        names, rows = [], []
        for i, (task, sentences) in enumerate(items):
            where = f"request {i}: " if is_list else ""
            if task not in model.tasks:
                raise RequestError(404, f"{where}unknown task {task!r}; attached: {', '.join(model.tasks)}")
            rows += [encoded(model, task, s, f"{where}sentences[{j}]: ") for j, s in enumerate(sentences)]
            names += [task] * len(sentences)
        predictions = model.predictions(names, await batcher.submit(names, rows))
        answers, start = [], 0
        for task, sentences in items:
            mine = predictions[start : start + len(sentences)]
            answers.append({"task": task, "predictions": [{k: v for k, v in p.items() if k != "task"} for p in mine]})
            start += len(sentences)
        return answers if is_list else answers[0]

    return app


async def body(request, limit):
    """The request's body, read no further than ``limit`` bytes: a larger one is a 413 as soon as it is seen
    (its Content-Length, or its bytes as they arrive when it sends none)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"request body of {declared} bytes; at most {limit}")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"request body of more than {limit} bytes; at most {limit}")
            chunks.append(chunk)
    except ClientDisconnect:
        raise RequestError(400, "the client went away before its request body ended") from None
    return b"".join(chunks)


def encoded(model, task, sentence, where):
    """The sentence's tokens, or the RequestError saying why not."""
    try:
        return model.encode(task, sentence)
    except InputTooLong as error:
        raise RequestError(413, f"{where}{error}") from None
    except (TypeError, ValueError) as error:
        raise RequestError(422, f"{where}{error}") from None
