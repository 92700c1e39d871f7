"""Cost of a request, estimated at arrival from its path and body.

Theory of operation: a route table (policy `[[routes]]`, longest path prefix
wins) says what shape the body has. For OpenAI-style bodies we decode only the
fields that matter with msgspec Structs that declare nothing else, so msgspec
skips every other field (images, tools, sampling knobs) without building them:

- chat: the text of `messages[].content` (a string, or parts with `text`);
- completions: `prompt` (a string, token ids, or a batch of either);
- embeddings: `input` (same shapes; no output tokens);
- fixed: `fixed_tokens`, the body is not read.

Text counts as ceil(chars / chars_per_token) tokens, token-id lists as their
length. Output tokens are `max_completion_tokens` or `max_tokens` (the route's
default when absent) times `n`, and times the number of prompts for a batched
completion. Bodies larger than `parse_max_bytes` are estimated from their size,
as is a body that is not JSON (flagged `INVALID_JSON`: the request path decides
whether that is a 400) or JSON of an unexpected shape (`UNEXPECTED_SHAPE`).

Unit: `Cost.units` is tokens = prompt + output, what a token limit counts (a
proxy for KV-cache use). An `x-cost-hint` replaces the total; the body's split
between prompt and output (when it parses) is kept so the service-time model
still sees the shape, scaled to the hint.

Pure, no I/O. Hand-written because the fields and fallbacks are ours; msgspec
does the parsing.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import msgspec


class CostSource(enum.Enum):
    PARSED = "parsed"
    HINT = "hint"
    FIXED = "fixed"
    SIZE = "size"  # body above the parse cap
    INVALID_JSON = "invalid_json"
    UNEXPECTED_SHAPE = "unexpected_shape"


@dataclass(frozen=True, slots=True)
class Cost:
    prompt_tokens: int
    output_tokens: int
    units: int  # tokens: prompt + output, or the x-cost-hint
    source: CostSource = CostSource.PARSED
    route: str = "/"  # path_prefix of the matched route (keys the service-time model)


class _Part(msgspec.Struct):
    text: str | None = None


class _Message(msgspec.Struct):
    content: str | list[_Part] | None = None


class _Body(msgspec.Struct):
    messages: list[_Message] | None = None
    prompt: str | list[Any] | None = None
    input: str | list[Any] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = None


_decode = msgspec.json.Decoder(_Body).decode


class CostEstimator:
    """Estimates `Cost` for (path, body); built from the policy's routes."""

    __slots__ = ("_fallback", "_max_bytes", "_routes")

    def __init__(self, routes, parse_max_bytes: int) -> None:
        # Longest prefix first, so the first match is the most specific route.
        self._routes = sorted(routes, key=lambda r: len(r.path_prefix), reverse=True)
        self._max_bytes = parse_max_bytes
        self._fallback = None if any(r.path_prefix == "/" for r in routes) else _FallbackRoute()

    def route_for(self, path: str):
        path = path.split("?", 1)[0]
        for route in self._routes:
            if path.startswith(route.path_prefix):
                return route
        return self._fallback

    def estimate(self, path: str, body: bytes, hint: int | None = None) -> Cost:
        route = self.route_for(path)
        cost = self._from_body(route, body)
        if hint is None:
            return cost
        total = cost.prompt_tokens + cost.output_tokens
        prompt = hint if total == 0 else round(hint * cost.prompt_tokens / total)
        return Cost(prompt, hint - prompt, hint, CostSource.HINT, route.path_prefix)

    def _from_body(self, route, body: bytes) -> Cost:
        if route.kind == "fixed":
            return Cost(route.fixed_tokens, 0, route.fixed_tokens, CostSource.FIXED, route.path_prefix)
        if len(body) > self._max_bytes:
            return self._by_size(route, body, CostSource.SIZE)
        try:
            parsed = _decode(body)
        except msgspec.ValidationError:
            return self._by_size(route, body, CostSource.UNEXPECTED_SHAPE)
        except msgspec.DecodeError:
            return self._by_size(route, body, CostSource.INVALID_JSON)
        return _parsed_cost(route, parsed)

    def _by_size(self, route, body: bytes, source: CostSource) -> Cost:
        prompt = math.ceil(len(body) / route.chars_per_token)
        output = 0 if route.kind == "embeddings" else route.default_max_tokens
        return Cost(prompt, output, prompt + output, source, route.path_prefix)

    def __repr__(self) -> str:
        return f"<CostEstimator routes={[r.path_prefix for r in self._routes]} parse_max_bytes={self._max_bytes}>"


def _parsed_cost(route, b: _Body) -> Cost:
    kind, cpt = route.kind, route.chars_per_token
    batch = 1
    if kind == "chat":
        prompt = _tokens(_message_chars(b.messages or ()), cpt)
    elif kind == "completions":
        prompt, batch = _prompt_tokens(b.prompt, cpt)
    else:
        prompt, _ = _prompt_tokens(b.input, cpt)
    if kind == "embeddings":
        output = 0
    else:
        requested = b.max_completion_tokens if b.max_completion_tokens is not None else b.max_tokens
        per_choice = route.default_max_tokens if requested is None else max(0, requested)
        output = per_choice * max(1, b.n or 1) * batch
    return Cost(prompt, output, prompt + output, CostSource.PARSED, route.path_prefix)


def _message_chars(messages) -> int:
    chars = 0
    for m in messages:
        content = m.content
        if isinstance(content, str):
            chars += len(content)
        elif content:
            chars += sum(len(p.text) for p in content if p.text)
    return chars


def _tokens(chars: int, chars_per_token: float) -> int:
    return math.ceil(chars / chars_per_token)


def _prompt_tokens(value, cpt: float) -> tuple[int, int]:
    """(tokens, batch size) of a prompt/input: a string, token ids, or a list of either."""
    if value is None:
        return 0, 1
    if isinstance(value, str):
        return _tokens(len(value), cpt), 1
    if value and all(isinstance(v, int) for v in value):
        return len(value), 1  # one prompt as token ids
    tokens = 0
    for item in value:
        if isinstance(item, str):
            tokens += _tokens(len(item), cpt)
        elif isinstance(item, list):
            tokens += len(item)
        elif isinstance(item, int):
            tokens += 1
    return tokens, max(1, len(value))


class _FallbackRoute:
    """Unmatched paths when the policy has no "/" route: one token, and service-time priors of a short call."""

    path_prefix = "/"
    kind = "fixed"
    fixed_tokens = 1
    chars_per_token = 4.0
    default_max_tokens = 0
    base_ms = 50.0
    ms_per_prompt_token = 0.0
    ms_per_output_token = 0.0
    output_fill_ratio = 1.0
