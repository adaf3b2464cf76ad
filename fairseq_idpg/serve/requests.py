"""A request body -> rows to predict, or a ``RequestError`` (an HTTP status and one clear line).

A body is ``{"task": NAME, "sentences": [...]}`` or a list of such objects (each answered in turn); a sentence
is a string, or a pair ``[first, second]`` for a task of sentence pairs.
"""

import json
from dataclasses import dataclass


class RequestError(Exception):
    """A bad request: answered with ``status`` and ``{"error": message}``."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20  # 1 MiB
    max_rows: int = 256  # sentences in one request, over all its objects


def parse(body: bytes, limits: Limits):
    """(is_list, [(task, [sentence or (first, second), ...]), ...]) of a request body."""
    if len(body) > limits.max_body_bytes:
        raise RequestError(413, f"request body of {len(body)} bytes; at most {limits.max_body_bytes}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(400, f"request body is not UTF-8 (byte {error.start}: 0x{body[error.start]:02x})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestError(400, f"request body is not JSON ({error})") from None
    except RecursionError:  # the parser's own limit (~1000 levels); a request needs 4
        raise RequestError(400, "request body nests lists or objects too deeply (a request needs 4 levels)") from None
    is_list = isinstance(value, list)
    items = value if is_list else [value]
    if not items:
        raise RequestError(422, 'an empty list of requests; give at least one {"task": ..., "sentences": [...]}')
    parsed = [_item(item, i if is_list else None) for i, item in enumerate(items)]
    rows = sum(len(sentences) for _, sentences in parsed)
    if rows > limits.max_rows:
        raise RequestError(413, f"{rows} sentences in one request; at most {limits.max_rows}: split it")
    return is_list, parsed


def _item(item, index):
    where = "" if index is None else f"request {index}: "
    if not isinstance(item, dict):
        raise RequestError(422, f'{where}expected an object {{"task": ..., "sentences": [...]}}, got {_kind(item)}')
    unknown = sorted(set(item) - {"task", "sentences"})
    if unknown:
        raise RequestError(422, f"{where}unknown field(s) {', '.join(unknown)}; give task and sentences")
    task, sentences = item.get("task"), item.get("sentences")
    if not isinstance(task, str) or not task:
        raise RequestError(422, f"{where}task: expected a task name (a string), got {_kind(task)}")
    if not isinstance(sentences, list):
        raise RequestError(422, f"{where}sentences: expected a list of sentences, got {_kind(sentences)}")
    if not sentences:
        raise RequestError(422, f"{where}sentences: empty; give at least one sentence")
    for j, s in enumerate(sentences):
        pair = isinstance(s, list) and len(s) == 2 and all(isinstance(x, str) for x in s)
        if not isinstance(s, str) and not pair:
            raise RequestError(
                422, f"{where}sentences[{j}]: expected a string or a pair [first, second] of strings, got {_kind(s)}"
            )
    return task, [s if isinstance(s, str) else tuple(s) for s in sentences]


def _kind(value):
    """What a JSON value is, for a message (its type, and the value when it is short)."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    name = names.get(type(value), "a number")
    try:
        text = json.dumps(value)
    except RecursionError:  # a value nested nearly as deep as the parser allows
        return name
    return name if len(text) > 40 or value is None else f"{name} {text}"
