"""The service's ASGI app (FastAPI) over a ``MultiTaskModel``: JSON in and out.

    POST /predict   {"task": "sst2", "sentences": ["a gripping film .", ...]}
                    -> {"task": "sst2", "predictions": [{"label": "1", "probabilities": {"0": 0.1, "1": 0.9}}, ...]}
                    a list of such objects (any tasks) -> the list of their answers, in order
    GET  /health    -> {"status": "ok", "backbone": ..., "tasks": {name: {arch, labels, pair, group}}, ...}

A regression task answers ``{"score": x}`` per sentence. A bad request gets a 4xx and ``{"error": "..."}``: 400
(not JSON), 404 (unknown task), 413 (body, request or sentence too large), 422 (wrong types, empty input, a
single sentence for a pair task); never a 500.
"""

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

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
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise RequestError(413, f"request body of {declared} bytes; at most {limits.max_body_bytes}")
        is_list, items = parse(await request.body(), limits)
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


def encoded(model, task, sentence, where):
    """The sentence's tokens, or the RequestError saying why not."""
    try:
        return model.encode(task, sentence)
    except InputTooLong as error:
        raise RequestError(413, f"{where}{error}") from None
    except (TypeError, ValueError) as error:
        raise RequestError(422, f"{where}{error}") from None
