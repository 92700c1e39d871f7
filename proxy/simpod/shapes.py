"""OpenAI-shaped response bodies of the simulated pod (bytes, built cheaply).

Theory of operation: non-streaming bodies are dicts encoded with msgspec. The
streaming path is hot (one SSE event per generated token, thousands a second), so
`ChunkWriter` encodes the per-request JSON prefix once and then only appends a
pre-encoded per-token tail: token texts come from a fixed table of JSON-safe
words, so no escaping is needed per token. The events parse with the OpenAI
Python SDK (`chat.completion.chunk` / `text_completion` objects, role in the
first delta, finish_reason on the last token's chunk, optional usage chunk).

Embedding vectors are small (profile.embedding_dim), deterministic per input
text (shake_256 of the text), unit length, as floats or base64 float32 (the
OpenAI SDK asks for base64 by default).
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct

import msgspec

from proxy.simpod.workload import CHAT, Job

_encode = msgspec.json.Encoder().encode

# JSON-safe token texts; token i of every answer is WORDS[i % len(WORDS)].
WORDS = (
    " lorem",
    " ipsum",
    " dolor",
    " sit",
    " amet",
    ",",
    " consectetur",
    " adipiscing",
    " elit",
    " sed",
    " do",
    " eiusmod",
    " tempor",
    " incididunt",
    " ut",
    " labore",
    " et",
    " dolore",
    ".",
)
DONE = b"data: [DONE]\n\n"
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
JSON_HEADERS = [(b"content-type", b"application/json")]


def answer_text(tokens: int) -> str:
    n = len(WORDS)
    return "".join(WORDS[i % n] for i in range(tokens))


def finish_reason(job: Job) -> str:
    return "length" if job.output_tokens >= job.max_tokens else "stop"


def usage(job: Job) -> dict:
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": job.output_tokens,
        "total_tokens": job.prompt_tokens + job.output_tokens,
    }


def completion_body(job: Job, rid: str, created: int) -> bytes:
    text = answer_text(job.output_tokens)
    reason = finish_reason(job)
    if job.kind == CHAT:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        obj = "text_completion"
    return _encode(
        {"id": rid, "object": obj, "created": created, "model": job.model, "choices": [choice], "usage": usage(job)}
    )


class ChunkWriter:
    """SSE events for one streamed answer: `tokens(start, stop)` -> bytes."""

    __slots__ = ("_chat", "_head", "_last", "job")

    def __init__(self, job: Job, rid: str, created: int) -> None:
        self.job = job
        self._chat = job.kind == CHAT
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        head = _encode({"id": rid, "object": obj, "created": created, "model": job.model})
        # '{"id":...,"model":"m"' + ',"choices":[{"index":0,'
        self._head = b"data: " + head[:-1] + b',"choices":[{"index":0,'
        self._last = job.output_tokens - 1

    def _one(self, i: int) -> bytes:
        word = WORDS[i % len(WORDS)]
        reason = b'"' + finish_reason(self.job).encode() + b'"' if i == self._last else b"null"
        if self._chat:
            role = b'"role":"assistant",' if i == 0 else b""
            body = b'"delta":{' + role + b'"content":"' + word.encode() + b'"}'
        else:
            body = b'"text":"' + word.encode() + b'"'
        return self._head + body + b',"logprobs":null,"finish_reason":' + reason + b"}]}\n\n"

    def tokens(self, start: int, stop: int) -> bytes:
        """Events for tokens start..stop-1 (one event each)."""
        return b"".join(self._one(i) for i in range(start, stop))

    def usage_event(self) -> bytes:
        head = self._head[: -len(b'{"index":0,')]
        return head + b'],"usage":' + _encode(usage(self.job)) + b"}\n\n"


def _vector(text: str, dim: int) -> list[float]:
    digest = hashlib.shake_256(text.encode()).digest(dim)
    raw = [b / 127.5 - 1.0 for b in digest]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [round(x / norm, 6) for x in raw]


def embeddings_body(job: Job, dim: int, encoding_format: str) -> bytes:
    data = []
    for i, text in enumerate(job.inputs):
        vec = _vector(text, dim)
        embedding: list[float] | str = vec
        if encoding_format == "base64":
            embedding = base64.b64encode(struct.pack(f"<{dim}f", *vec)).decode()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    return _encode(
        {
            "object": "list",
            "data": data,
            "model": job.model,
            "usage": {"prompt_tokens": job.prompt_tokens, "total_tokens": job.prompt_tokens},
        }
    )


def models_body(model: str, created: int) -> bytes:
    return _encode(
        {
            "object": "list",
            "data": [{"id": model, "object": "model", "created": created, "owned_by": "rampmeter-sim-pod"}],
        }
    )


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    return _encode({"error": {"message": message, "type": type_, "param": param, "code": code}})
