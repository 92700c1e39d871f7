"""What kind of request this is, as far as a timeout hint cares; and the per-host table of hints.

Theory of operation: the sidecar's `x-rampmeter-timeout-hint-ms` is 2.5 x the observed
p99 of requests of one *kind*: its latency windows are keyed by (route, power-of-two
cost bucket), and it names that key in `x-rampmeter-timeout-hint-key`. A hint learned
from three short chats says nothing about a 4,000-token generation, so the SDK keys
its hints by kind too, and applies one only to a request of the same kind.

The SDK must know the kind *before* it sends, so `request_kind` derives it from the
request the way the sidecar derives its cost (proxy/core/cost.py): `x-cost-hint` if
set (the sidecar then uses exactly that), else the body's prompt characters / 4 plus
the output tokens it asks for (`max_completion_tokens` or `max_tokens`, times `n`);
the bucket is the same bit length. The SDK does not know the sidecar's policy (its
routes, characters per token, default output length), so:

- a body that names no output length is its own kind ("~" before the bucket): the
  sidecar adds the same route default to every such request, so these never share
  a kind with requests that name a length;
- every hint is stored under the SDK's kind *and* the sidecar's key. When one SDK
  kind has met more than one sidecar key (the two derivations put a bucket boundary
  in different places), the SDK applies the largest of their hints: never the
  shorter kind's hint to the longer kind's request.

So the SDK's kinds are at least as fine as the sidecar's, or fall back to the most
generous hint. A kind with no hint yet gets none: the caller's own timeout applies.

Pure: no I/O, no clock. Bodies are parsed only when in memory, JSON, and at most
`MAX_PARSE_BYTES`; anything else is keyed by its size, as the sidecar does.
"""

from __future__ import annotations

import json
import math

import httpx

from client_sdk import wire

MAX_PARSE_BYTES = 256 * 1024  # larger bodies are keyed by size (the sidecar: parse_max_bytes)
CHARS_PER_TOKEN = 4.0  # the sidecar's default route setting
MAX_KINDS = 256  # per host; the least recently learned is dropped
MAX_KEYS_PER_KIND = 4  # sidecar keys remembered for one SDK kind; the smallest hint is dropped


def cost_bucket(tokens: int) -> int:
    """proxy/core/quantiles.py's bucket: 0 -> 0, 1 -> 1, 2..3 -> 2, 4..7 -> 3, ..., capped at 40."""
    return min(40, max(0, tokens).bit_length())


def _tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


def _prompt_tokens(value: object) -> tuple[int, int]:
    """(tokens, batch size) of a prompt/input: a string, token ids, or a list of either."""
    if isinstance(value, str):
        return _tokens(len(value)), 1
    if not isinstance(value, list):
        return 0, 1
    if value and all(isinstance(v, int) for v in value):
        return len(value), 1
    tokens = 0
    for item in value:
        if isinstance(item, str):
            tokens += _tokens(len(item))
        elif isinstance(item, list):
            tokens += len(item)
        elif isinstance(item, int):
            tokens += 1
    return tokens, max(1, len(value))


def _message_chars(messages: object) -> int:
    chars = 0
    for m in messages if isinstance(messages, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return chars


def _body_kind(body: bytes) -> str:
    """ "<bucket>" when the body names its output length, "~<bucket of the prompt>" when not."""
    if len(body) > MAX_PARSE_BYTES:
        return f"size{cost_bucket(_tokens(len(body)))}"
    try:
        parsed = json.loads(body)
    except ValueError:
        return f"size{cost_bucket(_tokens(len(body)))}"
    if not isinstance(parsed, dict):
        return f"size{cost_bucket(_tokens(len(body)))}"
    batch = 1
    if "messages" in parsed:
        prompt = _tokens(_message_chars(parsed["messages"]))
    elif "prompt" in parsed:
        prompt, batch = _prompt_tokens(parsed["prompt"])
    else:
        prompt, _ = _prompt_tokens(parsed.get("input"))
    requested = parsed.get("max_completion_tokens")
    if requested is None:
        requested = parsed.get("max_tokens")
    n = parsed.get("n")
    choices = n if isinstance(n, int) and n > 1 else 1
    if not isinstance(requested, int) or isinstance(requested, bool):
        return f"~{cost_bucket(prompt)}x{choices * batch}"
    return str(cost_bucket(prompt + max(0, requested) * choices * batch))


def request_kind(request: httpx.Request) -> str:
    """ "METHOD path#bucket": requests of one kind share a timeout hint."""
    where = f"{request.method} {request.url.path}"
    hint = request.headers.get(wire.COST_HINT)
    if hint is not None and hint.strip().isdigit():
        return f"{where}#{cost_bucket(int(hint.strip()))}"
    if not isinstance(request.stream, httpx.ByteStream):
        return f"{where}#stream"  # an upload we cannot look at: its own kind
    body = request.content
    if not body:
        return f"{where}#0"
    return f"{where}#{_body_kind(body)}"


class HintTable:
    """SDK kind -> {sidecar key -> hint seconds}, bounded; not thread-safe (the engine locks)."""

    __slots__ = ("_kinds",)

    def __init__(self) -> None:
        self._kinds: dict[str, dict[str, float]] = {}

    def get(self, kind: str) -> float | None:
        """The hint for `kind`: the largest its sidecar keys gave, None when none is known."""
        hints = self._kinds.get(kind)
        return max(hints.values()) if hints else None

    def learn(self, kind: str, server_key: str, hint_s: float) -> None:
        """A response to a `kind` request said: for `server_key`, time out after `hint_s`."""
        hints = self._kinds.pop(kind, None) or {}
        hints[server_key] = hint_s  # a fresh hint replaces that key's old one, up or down
        if len(hints) > MAX_KEYS_PER_KIND:
            del hints[min(hints, key=hints.__getitem__)]  # dropping the smallest keeps the max
        self._kinds[kind] = hints  # most recently learned last
        if len(self._kinds) > MAX_KINDS:
            del self._kinds[next(iter(self._kinds))]

    def back_off(self, kind: str, cut_at_s: float) -> None:
        """An attempt of `kind` was cut at `cut_at_s` and had not answered: the hint was stale.

        Doubles it, as TCP doubles its retransmission timer (RFC 6298 5.5). Concurrent
        attempts cut at the same hint double it once, not once each.
        """
        hints = self._kinds.get(kind)
        if hints:
            for key, value in hints.items():
                hints[key] = max(value, 2.0 * cut_at_s)

    def snapshot(self) -> dict[str, float]:
        return {kind: max(hints.values()) for kind, hints in self._kinds.items() if hints}

    def __len__(self) -> int:
        return len(self._kinds)
