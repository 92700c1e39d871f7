"""The requests calibration sends: where each API may live, and the shapes that separate its costs.

Theory of operation: OpenAI-compatible servers put the same API under
different prefixes, so each kind has candidate paths, tried in order with a
one-token request (`probe_shape`); the first that answers 2xx is the route.
A route is then measured with shapes chosen so their latencies separate the
three service-time terms: a short request, the same with many output tokens,
the same with a long prompt (embeddings: a short and a long input). Requests
the user names (`--request PATH=BODY`: Triton's KServe v2 infer, LitServe's
/predict) are one fixed shape each. Shapes are `proxy.loadtest.Shape`s, so the
load generator sends them as it sends any other.

Pure: builds bytes, sends nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from proxy.loadtest.shapes import Shape, prompt_text

_encode = msgspec.json.Encoder().encode

ENDPOINTS: dict[str, tuple[str, ...]] = {
    "chat": ("/v1/chat/completions", "/chat/completions"),
    "completions": ("/v1/completions", "/completions"),
    "embeddings": ("/v1/embeddings", "/embeddings", "/embed"),
}
MODEL_PATHS = ("/v1/models", "/models")
SHORT_PROMPT, LONG_PROMPT = 16, 256  # tokens at 4 characters a token
SHORT_OUTPUT, LONG_OUTPUT = 16, 128
EMBED_SHORT, EMBED_LONG = 8, 256


@dataclass(frozen=True)
class Endpoint:
    kind: str  # chat | completions | embeddings | fixed
    path: str
    body: bytes = b""  # fixed: the user's request body
    method: str = "POST"


def body_for(kind: str, prompt_tokens: int, max_tokens: int, model: str | None, *, ignore_eos: bool = False) -> bytes:
    """A request body; generation is greedy (temperature 0), so a shape's output length repeats."""
    text = prompt_text(prompt_tokens)
    head = {"model": model} if model else {}
    if kind == "embeddings":
        return _encode(head | {"input": text})
    gen = {"max_tokens": max_tokens, "temperature": 0} | ({"ignore_eos": True} if ignore_eos else {})
    if kind == "chat":
        return _encode(head | {"messages": [{"role": "user", "content": text}]} | gen)
    return _encode(head | {"prompt": text} | gen)


def prompt_chars(prompt_tokens: int) -> int:
    return len(prompt_text(prompt_tokens))


def probe_shape(kind: str, path: str, model: str | None) -> Shape:
    """The cheapest request of `kind` at `path`: does the server serve it?"""
    return Shape(f"probe-{kind}", path, body_for(kind, 1, 1, model))


@dataclass(frozen=True)
class CalShape:
    """One calibration shape: what was asked (tokens at 4 characters a token) and the request."""

    shape: Shape
    kind: str
    prompt_tokens: int  # as asked; the server's usage, when reported, replaces it
    max_tokens: int

    @property
    def label(self) -> str:
        return self.shape.name


def shapes_for(endpoint: Endpoint, model: str | None) -> tuple[CalShape, ...]:
    """The shapes that separate `endpoint`'s costs; the first is its short shape (the sweep's)."""
    k, p = endpoint.kind, endpoint.path
    if k == "fixed":
        shape = Shape(f"fixed:{p}", p, endpoint.body, method=endpoint.method)
        return (CalShape(shape, k, 0, 0),)
    sizes: tuple[tuple[str, int, int], ...]
    if k == "embeddings":
        sizes = (("short", EMBED_SHORT, 0), ("long_input", EMBED_LONG, 0))
    else:
        sizes = (
            ("short", SHORT_PROMPT, SHORT_OUTPUT),
            ("long_output", SHORT_PROMPT, LONG_OUTPUT),
            ("long_prompt", LONG_PROMPT, SHORT_OUTPUT),
        )
    return tuple(
        CalShape(Shape(f"{k}:{name}", p, body_for(k, prompt, out, model)), k, prompt, out)
        for name, prompt, out in sizes
    )


def halved(s: CalShape, endpoint: Endpoint, model: str | None) -> CalShape | None:
    """`s` with its long part (prompt or output) halved, keeping its name; None at the short size."""
    prompt, out = s.prompt_tokens, s.max_tokens
    if prompt > SHORT_PROMPT * 2 or (s.kind == "embeddings" and prompt > EMBED_SHORT * 2):
        prompt //= 2
    elif out > SHORT_OUTPUT * 2:
        out //= 2
    else:
        return None
    body = body_for(s.kind, prompt, out, model)
    return CalShape(Shape(s.shape.name, endpoint.path, body), s.kind, prompt, out)


def long_shape(endpoint: Endpoint, model: str | None, max_tokens: int, *, ignore_eos: bool = False) -> CalShape:
    """A request that keeps the engine busy (the cancel test's): short prompt, `max_tokens` out
    (`ignore_eos`: vLLM's extension, for a model that would stop early)."""
    if endpoint.kind in ("chat", "completions"):
        body = body_for(endpoint.kind, SHORT_PROMPT, max_tokens, model, ignore_eos=ignore_eos)
        shape = Shape(f"{endpoint.kind}:cancel", endpoint.path, body)
        return CalShape(shape, endpoint.kind, SHORT_PROMPT, max_tokens)
    return shapes_for(endpoint, model)[-1]  # embeddings: the long input; fixed: the request itself


def parse_request(spec: str) -> Endpoint:
    """ "PATH=BODY" or "PATH=@FILE" is read by the CLI; here "PATH=BODY" -> a fixed Endpoint."""
    path, sep, body = spec.partition("=")
    if not sep or not path.startswith("/"):
        raise ValueError(f"bad --request {spec!r}: want PATH=JSON-BODY, e.g. /predict='{{\"x\": [1]}}'")
    return Endpoint("fixed", path, body.encode())
