"""Request shapes and workload mixes: what each load-test request asks for.

Theory of operation: a `Shape` is one kind of request, fully rendered once (path,
JSON body bytes, the per-request headers it implies), so the hot path only picks
an index. Built-in shapes model OpenAI-style traffic (figures in tokens at ~4
characters a token, the simulated pod's and a common tokenizer's ratio):

    tiny               /v1/completions, 1 prompt token, max_tokens 1 (the generator's ceiling)
    short_chat         ~100 prompt tokens, max_tokens 32
    long_chat          ~1,500 prompt tokens, max_tokens 512
    short_chat_stream  short_chat with "stream": true (TTFT and TPOT recorded)
    long_chat_stream   long_chat with "stream": true
    embed_short        /v1/embeddings, ~32 tokens of input
    embed_long         /v1/embeddings, ~400 tokens of input

A `Mix` is shapes with weights, parsed from "NAME[@CLASS][=WEIGHT],..." (the
class goes out as `x-priority` and groups the figures). JSONL files of request
bodies become shapes too (`jsonl.py`). A shape's `deadline_ms` is sent as
`x-request-timeout-ms` and is that request's own SLA when goodput is counted.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import msgspec

from proxy.core.wire import COST_HINT, PRIORITY, REQUEST_TIMEOUT_MS

_encode = msgspec.json.Encoder().encode
_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do")
CHARS_PER_TOKEN = 4
ENDPOINTS = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "embedding": "/v1/embeddings"}


@dataclass(frozen=True)
class Shape:
    name: str
    path: str
    body: bytes
    stream: bool = False
    cls: str | None = None  # x-priority; figures per class
    deadline_ms: int | None = None  # x-request-timeout-ms; this request's own SLA
    cost_hint: int | None = None  # x-cost-hint
    weight: float = 1.0
    method: str = "POST"

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"shape {self.name!r}: weight must be > 0")
        if self.deadline_ms is not None and self.deadline_ms < 1:
            raise ValueError(f"shape {self.name!r}: deadline_ms must be >= 1")

    @property
    def label(self) -> str:
        """How figures name it: NAME or NAME@CLASS."""
        return self.name if self.cls is None else f"{self.name}@{self.cls}"

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The request headers this shape implies (besides host/framing/idempotency-key)."""
        out = [(b"content-type", b"application/json"), (b"user-agent", b"rampmeter-loadtest")]
        if self.cls is not None:
            out.append((PRIORITY.encode(), self.cls.encode()))
        if self.deadline_ms is not None:
            out.append((REQUEST_TIMEOUT_MS.encode(), b"%d" % self.deadline_ms))
        if self.cost_hint is not None:
            out.append((COST_HINT.encode(), b"%d" % self.cost_hint))
        return out

    def replace(self, **changes: Any) -> Shape:
        return dataclasses.replace(self, **changes)


def prompt_text(tokens: int) -> str:
    """Deterministic filler of about `tokens` tokens (CHARS_PER_TOKEN characters each)."""
    chars = max(1, tokens * CHARS_PER_TOKEN)
    words: list[str] = []
    n = 0
    while n <= chars:  # joined length is n - 1
        w = _WORDS[len(words) % len(_WORDS)]
        words.append(w)
        n += len(w) + 1
    return " ".join(words)[:chars]


def chat_body(prompt_tokens: int, max_tokens: int, *, stream: bool = False, model: str | None = None) -> bytes:
    body: dict = {"messages": [{"role": "user", "content": prompt_text(prompt_tokens)}], "max_tokens": max_tokens}
    if stream:
        body["stream"] = True
    return _encode(({"model": model} if model else {}) | body)


def _completion(prompt_tokens: int, max_tokens: int, model: str | None) -> bytes:
    body = {"prompt": prompt_text(prompt_tokens), "max_tokens": max_tokens}
    return _encode(({"model": model} if model else {}) | body)


def _embedding(tokens: int, model: str | None) -> bytes:
    return _encode(({"model": model} if model else {}) | {"input": prompt_text(tokens)})


def builtin(name: str, *, model: str | None = None) -> Shape:
    """A built-in shape by name (see the module doc); ValueError names the choices."""
    chat, completion, embedding = ENDPOINTS["chat"], ENDPOINTS["completion"], ENDPOINTS["embedding"]
    table = {
        "tiny": lambda: Shape("tiny", completion, _completion(1, 1, model)),
        "short_chat": lambda: Shape("short_chat", chat, chat_body(100, 32, model=model)),
        "long_chat": lambda: Shape("long_chat", chat, chat_body(1500, 512, model=model)),
        "short_chat_stream": lambda: Shape(
            "short_chat_stream", chat, chat_body(100, 32, stream=True, model=model), stream=True
        ),
        "long_chat_stream": lambda: Shape(
            "long_chat_stream", chat, chat_body(1500, 512, stream=True, model=model), stream=True
        ),
        "embed_short": lambda: Shape("embed_short", embedding, _embedding(32, model)),
        "embed_long": lambda: Shape("embed_long", embedding, _embedding(400, model)),
    }
    make = table.get(name)
    if make is None:
        raise ValueError(f"unknown shape {name!r}; built-in shapes: {', '.join(BUILTIN_NAMES)}")
    return make()


BUILTIN_NAMES = (
    "tiny",
    "short_chat",
    "long_chat",
    "short_chat_stream",
    "long_chat_stream",
    "embed_short",
    "embed_long",
)


@dataclass(frozen=True)
class Mix:
    """Shapes and their weights; the trace draws shape i with probability weight_i / total."""

    shapes: tuple[Shape, ...]

    def __post_init__(self) -> None:
        if not self.shapes:
            raise ValueError("a workload mix needs at least one shape")

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(s.weight for s in self.shapes)

    @classmethod
    def parse(cls, spec: str, *, model: str | None = None, class_deadlines_ms: dict[str, int] | None = None) -> Mix:
        """ "short_chat@interactive=3,long_chat@batch=1" -> Mix; ValueError on unknown shapes or bad weights."""
        shapes: list[Any] = []
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            name, _, weight = part.partition("=")
            name, _, cls_name = name.strip().partition("@")
            try:
                w = float(weight) if weight else 1.0
            except ValueError:
                raise ValueError(f"bad weight {weight!r} for shape {name!r} (want NAME[@CLASS][=WEIGHT])") from None
            shape = builtin(name.strip(), model=model).replace(weight=w, cls=cls_name.strip() or None)
            if any(s.label == shape.label for s in shapes):
                raise ValueError(f"shape {shape.label!r} is listed twice in the mix")
            shapes.append(shape)
        return cls(tuple(shapes)).with_class_deadlines(class_deadlines_ms or {})

    def with_class_deadlines(self, deadlines_ms: dict[str, int]) -> Mix:
        """Give shapes of a class that has no deadline of its own the class's deadline."""
        if not deadlines_ms:
            return self
        return Mix(
            tuple(
                s.replace(deadline_ms=deadlines_ms[s.cls]) if s.deadline_ms is None and s.cls in deadlines_ms else s
                for s in self.shapes
            )
        )

    def describe(self) -> list[dict]:
        total = sum(self.weights)
        return [
            {
                "name": s.name,
                "class": s.cls,
                "path": s.path,
                "stream": s.stream,
                "weight": s.weight,
                "share": s.weight / total,
                "deadline_ms": s.deadline_ms,
                "cost_hint": s.cost_hint,
                "body_bytes": len(s.body),
            }
            for s in self.shapes
        ]
