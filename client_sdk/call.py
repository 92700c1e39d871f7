"""One logical call's state, and what it stamps on the request.

Theory of operation: a `Call` lives for one request through all its attempts
and is never shared between calls, so it needs no lock. It fixes, once, what
must be the same on every attempt (the idempotency key, the absolute deadline,
whether the body can be replayed, the caller's own timeouts) and carries what
the last attempt taught (its `Signal`, the server's requested wait) from the
engine's `after_attempt` to tenacity's `retry` / `wait` / `stop` hooks.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from client_sdk import wire
from client_sdk.config import CallOptions
from client_sdk.events import Stop
from client_sdk.kinds import request_kind
from client_sdk.rules import is_idempotent
from client_sdk.signals import Signal

_TIMEOUT_KINDS = ("connect", "read", "write", "pool")


class Call:
    """Mutable state of one logical call (one per request; not shared)."""

    __slots__ = (
        "attempts",
        "base_timeout",
        "deadline",
        "floor_s",
        "hint_s",
        "host",
        "id",
        "_kind",
        "_request",
        "keyed",
        "method",
        "replayable",
        "reserved",
        "signal",
        "started",
        "stop",
    )

    def __init__(
        self,
        call_id: int,
        host: str,
        request: httpx.Request,
        deadline: float | None,
        keyed: bool,
        started: float,
    ) -> None:
        self.id = call_id
        self.host = host
        self.method = request.method
        self.deadline = deadline  # absolute, on the engine's clock; None: no deadline
        self.keyed = keyed
        # Only an in-memory body can be sent twice; a generator upload cannot.
        self.replayable = isinstance(request.stream, httpx.ByteStream)
        self.base_timeout = dict(request.extensions.get("timeout") or {})
        self.started = started
        self.attempts = 0
        self.signal = Signal.LOCAL_FAILURE
        self.floor_s = 0.0  # the server's requested wait after the last attempt
        self._request = request
        self._kind: str | None = None
        self.hint_s: float | None = None  # the hint that bounded this attempt (no deadline set)
        self.reserved = False  # a retry token taken before an attempt the hint may cut
        self.stop: Stop | None = None

    @property
    def kind(self) -> str:
        """What kind of request this is, for timeout hints (client_sdk.kinds); worked out on first use.

        Only calls to a server that sends hints need it, so others never parse their body.
        """
        if self._kind is None:
            self._kind = request_kind(self._request)
        return self._kind

    def __repr__(self) -> str:
        return f"<Call #{self.id} {self.method} {self.host} attempts={self.attempts} signal={self.signal.value}>"

    def attempt_timeouts(self, timeout_s: float) -> dict[str, float]:
        """httpx's per-phase timeouts for one attempt: the caller's, capped at `timeout_s`."""
        return {
            kind: timeout_s if self.base_timeout.get(kind) is None else min(timeout_s, self.base_timeout[kind])
            for kind in _TIMEOUT_KINDS
        }


def ensure_idempotency_key(
    request: httpx.Request, opts: CallOptions, auto: bool, key_factory: Callable[[], str]
) -> bool:
    """Set the key once per call, so every attempt carries the same one; True when keyed.

    A key already on the request wins; `opts.idempotency_key` False opts out, a
    string is used as is, True forces a fresh key; otherwise non-idempotent
    methods get a fresh key when `auto` is on.
    """
    if wire.IDEMPOTENCY_KEY in request.headers:
        return True
    key = opts.idempotency_key
    if key is False:
        return False
    if isinstance(key, str):
        request.headers[wire.IDEMPOTENCY_KEY] = key
        return True
    if key is True or (auto and not is_idempotent(request.method)):
        request.headers[wire.IDEMPOTENCY_KEY] = key_factory()
        return True
    return False
