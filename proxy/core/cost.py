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

Routes by shape: OpenAI-compatible servers differ in their prefixes
(`/embeddings` against `/v1/embeddings`, `/embed`, `/completion`). A request
that no route names (the path falls to the catch-all "/" route of kind fixed,
or to none) but whose body is a JSON object with `messages`, `prompt` or
`input` is costed as chat, completions or embeddings, by the first `[[routes]]`
entry of that kind (its priors, its service-time model), or, when the policy has
none of that kind, by the catch-all's figures under the catch-all's model. Such
costs say `CostSource.SHAPE`. Which paths went unmatched is counted in a
Space-Saving table of `MAX_UNMATCHED_PATHS` (paths come from clients: the table
and each path are bounded; a path sent often enough is always in it, however many
one-off paths an attacker sends) for /admin/stats.

Depth: msgspec decodes (and skips unknown fields) recursively, bounded by the
interpreter's recursion limit; a body nested deeper than that (1,000 `[`, 2 KB)
raises RecursionError. That is caught here, cleanly (msgspec unwinds in C), and
flagged `TOO_DEEP`: the classifier answers it 400 (proxy/runtime/classify.py),
since no model server wants it either.

Pure, no I/O. Hand-written because the fields and fallbacks are ours; msgspec
does the parsing.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from collections.abc import Sequence

    from proxy.policy.admission import Route


class CostSource(enum.Enum):
    PARSED = "parsed"
    HINT = "hint"
    FIXED = "fixed"
    SIZE = "size"  # body above the parse cap
    INVALID_JSON = "invalid_json"
    UNEXPECTED_SHAPE = "unexpected_shape"
    SHAPE = "shape"  # no route named the path; costed by the body's shape (messages / prompt / input)
    TOO_DEEP = "too_deep"  # JSON nested deeper than the decoder's recursion bound: answered 400


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


SHAPE_KINDS = ("chat", "completions", "embeddings")
MAX_UNMATCHED_PATHS = 32  # distinct unmatched paths /admin/stats names (Space-Saving counters)
MAX_PATH_CHARS = 128  # longer paths are cut to this (and marked with "...") before counting
ROUTE_CACHE = 1024  # distinct paths whose route is remembered (CostEstimator.estimate)
ROUTE_CACHE_CHARS = 256  # longer paths are matched each time


class CostEstimator:
    """Estimates `Cost` for (path, body); built from the policy's routes."""

    __slots__ = (
        "_catch",
        "_catch_all",
        "_fallback",
        "_fixed",
        "_max_bytes",
        "_route_of",
        "_routes",
        "_shape_routes",
        "unmatched",
    )

    def __init__(self, routes: Sequence[Route], parse_max_bytes: int) -> None:
        # Longest prefix first, so the first match is the most specific route.
        self._routes = sorted(routes, key=lambda r: len(r.path_prefix), reverse=True)
        self._max_bytes = parse_max_bytes
        self._fallback = None if any(r.path_prefix == "/" for r in routes) else _FallbackRoute()
        catch = self._catch = self._fallback or next(r for r in routes if r.path_prefix == "/")
        # Only a catch-all that does not read bodies means "no route names this path".
        self._catch_all = catch if catch.kind == "fixed" and catch.by_shape else None
        self._shape_routes = {k: _first_of_kind(routes, k) or _ShapeRoute.of(catch, k) for k in SHAPE_KINDS}
        self.unmatched = UnmatchedPaths()
        # A fixed route's cost is the same value for every request: built once, not per request
        # (a frozen dataclass costs a few us to build). Keyed by id(): every route is held above.
        self._fixed: dict[int, Cost] = {}
        # path -> route_for(path), for the paths a client sends over and over; bounded (ROUTE_CACHE
        # paths of at most ROUTE_CACHE_CHARS): past that, paths are matched each time, as before.
        self._route_of: dict[str, Any] = {}

    def _fixed_cost(self, route: Any) -> Cost:
        cost = self._fixed.get(id(route))
        if cost is None:
            cost = self._fixed[id(route)] = Cost(
                route.fixed_tokens, 0, route.fixed_tokens, CostSource.FIXED, route.path_prefix
            )
        return cost

    def route_for(self, path: str) -> Any:
        if "?" in path:  # the request path passes Request.path: no query, no list built per request
            path = path.split("?", 1)[0]
        for route in self._routes:
            if path.startswith(route.path_prefix):
                return route
        # No "/" route, or a target that does not start with "/" (absolute form, "*", an empty
        # h2 :path: the wire layer's to reject or normalise): costed as unmatched, never a crash.
        return self._catch

    def estimate(self, path: str, body: bytes, hint: int | None = None) -> Cost:
        route = self._route_of.get(path)
        if route is None:
            route = self.route_for(path)
            if len(self._route_of) < ROUTE_CACHE and len(path) <= ROUTE_CACHE_CHARS:
                self._route_of[path] = route
        if route is self._catch_all:
            cost = self._by_shape(route, body)
            self.unmatched.record(path, cost)
        else:
            cost = self._from_body(route, body)
        if hint is None or cost.source is CostSource.TOO_DEEP:
            return cost
        total = cost.prompt_tokens + cost.output_tokens
        prompt = hint if total == 0 else round(hint * cost.prompt_tokens / total)
        return Cost(prompt, hint - prompt, hint, CostSource.HINT, cost.route)

    def statistics(self) -> dict[str, Any]:
        return self.unmatched.statistics()

    def _from_body(self, route: Any, body: bytes) -> Cost:
        if route.kind == "fixed":
            return self._fixed_cost(route)
        if len(body) > self._max_bytes:
            return self._by_size(route, body, CostSource.SIZE)
        parsed = self._decode(route, body)
        return parsed if isinstance(parsed, Cost) else _parsed_cost(route, parsed)

    def _by_shape(self, catch: Any, body: bytes) -> Cost:
        """An unmatched path: chat / completions / embeddings by the body's fields, else the catch-all."""
        fixed = self._fixed_cost(catch)
        if not body or len(body) > self._max_bytes or body.lstrip()[:1] != b"{":
            return fixed
        parsed = self._decode(catch, body)
        if isinstance(parsed, Cost):
            return parsed if parsed.source is CostSource.TOO_DEEP else fixed
        kind = _shape_of(parsed)
        if kind is None:
            return fixed
        cost = _parsed_cost(self._shape_routes[kind], parsed)
        return Cost(cost.prompt_tokens, cost.output_tokens, cost.units, CostSource.SHAPE, cost.route)

    def _decode(self, route: Any, body: bytes) -> _Body | Cost:
        try:
            return _decode(body)
        except msgspec.ValidationError:
            return self._by_size(route, body, CostSource.UNEXPECTED_SHAPE)
        except msgspec.DecodeError:
            return self._by_size(route, body, CostSource.INVALID_JSON)
        except RecursionError:  # nested past the recursion limit (see the module doc)
            return self._by_size(route, body, CostSource.TOO_DEEP)

    def _by_size(self, route: Any, body: bytes, source: CostSource) -> Cost:
        prompt = math.ceil(len(body) / route.chars_per_token)
        output = 0 if route.kind in ("embeddings", "fixed") else route.default_max_tokens
        return Cost(prompt, output, prompt + output, source, route.path_prefix)

    def __repr__(self) -> str:
        return f"<CostEstimator routes={[r.path_prefix for r in self._routes]} parse_max_bytes={self._max_bytes}>"


def _shape_of(b: _Body) -> str | None:
    if b.messages is not None:
        return "chat"
    if b.prompt is not None:
        return "completions"
    if b.input is not None:
        return "embeddings"
    return None


def _first_of_kind(routes: Sequence[Route], kind: str) -> Route | None:
    return next((r for r in routes if r.kind == kind), None)


@dataclass(frozen=True, slots=True)
class _ShapeRoute:
    """A shape no route of the policy has: costed as `kind` with the catch-all's figures and model key."""

    path_prefix: str
    kind: str
    chars_per_token: float
    default_max_tokens: int

    @classmethod
    def of(cls, catch: Any, kind: str) -> _ShapeRoute:
        return cls(catch.path_prefix, kind, catch.chars_per_token, catch.default_max_tokens)


class UnmatchedPaths:
    """Which paths no route named, how often, and what their bodies were costed as.

    Space-Saving (Metwally et al., 2005) over `capacity` counters: a path not in a full
    table replaces the least counted one and inherits its count (+1), so any path with
    more than total/capacity requests is always listed, and `overcount` bounds how much
    a listed count may exceed the truth. O(1) for a listed path, O(capacity) otherwise.
    """

    __slots__ = ("_capacity", "_paths", "by_source", "total")

    def __init__(self, capacity: int = MAX_UNMATCHED_PATHS) -> None:
        self._capacity = capacity
        self._paths: dict[str, list[Any]] = {}  # path -> [count, overcount, costed_as]
        self.total = 0
        self.by_source: dict[str, int] = {}

    def record(self, path: str, cost: Cost) -> None:
        if "?" in path:
            path = path.split("?", 1)[0]
        if len(path) > MAX_PATH_CHARS:
            path = path[: MAX_PATH_CHARS - 3] + "..."
        # The member's _value_ (Enum's documented attribute behind .value): on 3.11 .value is a Python-level
        # property, and a dict keyed by members calls Enum.__hash__, also Python code; this runs per request.
        source = cost.source._value_
        costed_as = cost.route if cost.source is CostSource.SHAPE else source
        self.total += 1
        self.by_source[source] = self.by_source.get(source, 0) + 1
        entry = self._paths.get(path)
        if entry is not None:
            entry[0] += 1
            entry[2] = costed_as
        elif len(self._paths) < self._capacity:
            self._paths[path] = [1, 0, costed_as]
        else:
            victim = min(self._paths, key=lambda p: self._paths[p][0])
            count = self._paths.pop(victim)[0]
            self._paths[path] = [count + 1, count, costed_as]

    def statistics(self) -> dict[str, Any]:
        ranked = sorted(self._paths.items(), key=lambda kv: -kv[1][0])
        return {
            "unmatched_requests": self.total,
            "by_source": dict(self.by_source),
            "paths": [{"path": p, "requests": c, "overcount": o, "costed_as": k} for p, (c, o, k) in ranked],
            "paths_tracked_max": self._capacity,
        }


def _parsed_cost(route: Any, b: _Body) -> Cost:
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


def _message_chars(messages: Any) -> int:
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


def _prompt_tokens(value: Any, cpt: float) -> tuple[int, int]:
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
    default_max_tokens = 256  # for a body costed by its shape (chat, completions) under this route
    base_ms = 50.0
    ms_per_prompt_token = 0.0
    ms_per_output_token = 0.0
    output_fill_ratio = 1.0
    by_shape = True
