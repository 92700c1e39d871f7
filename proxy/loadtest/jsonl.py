"""A workload from a JSONL file: one request per line, replayed or sampled by the trace.

Theory of operation: each non-blank line is a JSON object, either a request body
as-is, or an envelope `{"body": {...}, ...}` with optional per-line settings:

    path         endpoint (default: inferred from the body: messages -> chat,
                 prompt -> completions, input -> embeddings)
    name         groups the figures (default: chat, completion or embedding,
                 with "_stream" when the body streams)
    class        sent as x-priority; figures per class
    deadline_ms  sent as x-request-timeout-ms; the request's own SLA for goodput
    cost_hint    sent as x-cost-hint
    weight       relative draw probability (default 1)

Every problem is a `JsonlError` naming the file and line, so a 10,000-line
capture with one bad line says exactly where.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from proxy.loadtest.shapes import ENDPOINTS, Mix, Shape

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_ENVELOPE_KEYS = {"body", "path", "name", "class", "deadline_ms", "cost_hint", "weight"}


class JsonlError(ValueError):
    """A JSONL workload line is malformed; the message starts with FILE:LINE."""


def _kind(body: dict) -> str | None:
    for key, kind in (("messages", "chat"), ("prompt", "completion"), ("input", "embedding")):
        if key in body:
            return kind
    return None


def _int_or_none(value: object, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key!r} must be a positive integer, got {value!r}")
    return value


def parse_line(obj: object, *, model: str | None = None) -> Shape:
    """One decoded line -> Shape; ValueError/TypeError say what is wrong (the caller adds FILE:LINE)."""
    if not isinstance(obj, dict):
        raise TypeError("each line must be a JSON object")
    envelope = obj if "body" in obj else {"body": obj}
    unknown = set(envelope) - _ENVELOPE_KEYS
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(_ENVELOPE_KEYS))}")
    body = envelope["body"]
    if not isinstance(body, dict):
        raise TypeError("'body' must be a JSON object")
    if model and "model" not in body:
        body = {"model": model} | body
    kind = _kind(body)
    path = envelope.get("path") or (ENDPOINTS[kind] if kind else None)
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError('cannot tell the endpoint: give "path" (e.g. "/v1/chat/completions")')
    stream = body.get("stream") is True
    name = envelope.get("name") or ((kind or "request") + ("_stream" if stream else ""))
    cls = envelope.get("class")
    if cls is not None and not isinstance(cls, str):
        raise ValueError("'class' must be a string")
    weight = envelope.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
        raise ValueError(f"'weight' must be a number > 0, got {weight!r}")
    return Shape(
        str(name),
        path,
        _encode(body),
        stream=stream,
        cls=cls,
        deadline_ms=_int_or_none(envelope.get("deadline_ms"), "deadline_ms"),
        cost_hint=_int_or_none(envelope.get("cost_hint"), "cost_hint"),
        weight=float(weight),
    )


def parse_lines(lines: list[str], source: str, *, model: str | None = None) -> Mix:
    shapes = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            shapes.append(parse_line(_decode(line), model=model))
        except msgspec.DecodeError as exc:
            raise JsonlError(f"{source}:{number}: invalid JSON: {exc}") from None
        except (ValueError, TypeError) as exc:
            raise JsonlError(f"{source}:{number}: {exc}") from None
    if not shapes:
        raise JsonlError(f"{source}: no requests in the file")
    return Mix(tuple(shapes))


def load(path: str | Path, *, model: str | None = None) -> Mix:
    """Read a JSONL workload file; JsonlError (FILE:LINE: why) or OSError."""
    text = Path(path).read_text(encoding="utf-8")
    return parse_lines(text.splitlines(), str(path), model=model)
