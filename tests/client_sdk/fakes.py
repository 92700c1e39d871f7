"""Test doubles for the SDK: fake time, stub randomness, scripted servers.

`FakeTime` is one clock for the engine and both sleeps: sleeping advances it,
so every wait and deadline is exact and no test waits for real. `Script` is an
`httpx.MockTransport` handler that plays a list of outcomes in order (a status
with headers, or an httpx exception class to raise) and records each request
it saw.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from client_sdk import wire


class FakeTime:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


class FixedRandom(random.Random):
    """`random()` always returns `value`: jitter becomes exact arithmetic."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def rejection_headers(reason: wire.Reason | str, retry_after_ms: int | None = None) -> dict[str, str]:
    """What the sidecar sends (proxy/core/wire.py rejection(); the contract test keeps them equal)."""
    headers = {"content-type": "application/json", wire.REASON: str(reason)}
    if retry_after_ms is not None:
        headers[wire.RETRY_AFTER] = str(max(1, -(-retry_after_ms // 1000)))
        headers[wire.RETRY_AFTER_MS] = str(retry_after_ms)
        headers[wire.RETRY_AFTER_MS_PLAIN] = str(retry_after_ms)
        headers[wire.SHOULD_RETRY] = "true"
    elif reason not in (wire.Reason.UPSTREAM_UNAVAILABLE, wire.Reason.UPSTREAM_TIMEOUT):
        headers[wire.SHOULD_RETRY] = "false"
    return headers


def rejected(reason: wire.Reason, retry_after_ms: int | None = None) -> Outcome:
    body = {
        "error": {
            "type": wire.ERROR_TYPE,
            "code": str(reason),
            "message": f"sidecar: {reason}",
            "retry_after_ms": retry_after_ms,
        }
    }
    return Outcome(wire.STATUS_FOR_REASON[reason], rejection_headers(reason, retry_after_ms), json=body)


@dataclass
class Outcome:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    json: object = None
    raises: type[Exception] | None = None
    advance_s: float = 0.0  # fake time the attempt takes

    def respond(self, request: httpx.Request) -> httpx.Response:
        if self.raises is not None:
            raise self.raises(f"scripted {self.raises.__name__}", request=request)
        return httpx.Response(self.status, headers=self.headers, json=self.json if self.json is not None else {})


def ok(**headers: str) -> Outcome:
    return Outcome(200, dict(headers), json={"ok": True})


def status(code: int, **headers: str) -> Outcome:
    return Outcome(code, {k.replace("_", "-"): v for k, v in headers.items()})


def fails(exc: type[Exception]) -> Outcome:
    return Outcome(raises=exc)


class Script:
    """Plays outcomes in order; the last one repeats. Records requests (headers copied)."""

    def __init__(self, *outcomes: Outcome, time: FakeTime | None = None) -> None:
        self.outcomes = list(outcomes)
        self.time = time
        self.requests: list[httpx.Request] = []
        self.headers: list[dict[str, str]] = []
        self.timeouts: list[dict[str, float | None]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.headers.append(dict(request.headers))
        self.timeouts.append(dict(request.extensions.get("timeout") or {}))
        index = min(len(self.requests), len(self.outcomes)) - 1
        outcome = self.outcomes[index]
        if self.time is not None:
            self.time.now += outcome.advance_s
        return outcome.respond(request)

    @property
    def attempts(self) -> int:
        return len(self.requests)

    def header(self, name: str) -> list[str | None]:
        return [h.get(name) for h in self.headers]


def counting_keys() -> Callable[[], str]:
    """An idempotency key factory yielding key-1, key-2, ..."""
    counter = iter(range(1, 1_000_000))
    return lambda: f"key-{next(counter)}"
