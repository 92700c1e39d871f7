"""What a dedup store does, and the signals followers wait on.

Theory of operation: a store keeps one `proxy.core.dedup.Record` per scope and
offers atomic steps on it: `claim` (absent -> in flight under a lease, or return
what is there), `complete` and `release` (only by the claim's owner token, which
also notify the scope's watchers), `refresh` (extend live leases) and `get`.
`MemoryStore` (one replica) and `RedisStore` (many) implement it; the Dedup
engine above never knows which.

Followers on another replica than the leader `watch(scope)`: a `Signal` whose
event fires when the record settles. The follower takes the current event
*before* re-reading the record, so a notification that lands between the read
and the wait still wakes it; notifications are hints, the record is the truth.

Stores raise `StoreUnavailable` for every failure to reach their backend;
callers bound each call with their own deadline (no `timeout=` here).
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

from proxy.core.dedup import Record, Stored
from proxy.errors import RampmeterError


class StoreUnavailable(RampmeterError):
    """The dedup store could not be reached or did not answer in time."""


class Signal:
    """Per-scope wake-up for watchers; `message` is the last notification's payload."""

    __slots__ = ("event", "message", "refs")

    def __init__(self) -> None:
        self.refs = 0
        self.event = trio.Event()
        self.message: bytes | None = None

    def fire(self, message: bytes | None) -> None:
        self.message = message
        self.event.set()
        self.event = trio.Event()  # the next wait is for the next notification

    def __repr__(self) -> str:
        return f"<Signal refs={self.refs} last={self.message!r}>"


class Signals:
    """The signals of the scopes someone watches; the last watcher out removes one."""

    def __init__(self) -> None:
        self.by_name: dict[str, Signal] = {}

    def join(self, name: str) -> tuple[Signal, bool]:
        """The signal, and whether this is its first watcher (subscribe now)."""
        signal = self.by_name.get(name)
        first = signal is None
        if signal is None:
            signal = self.by_name[name] = Signal()
        signal.refs += 1
        return signal, first

    def leave(self, name: str, signal: Signal) -> bool:
        """True when that was the last watcher (unsubscribe now)."""
        signal.refs -= 1
        if signal.refs == 0 and self.by_name.get(name) is signal:
            del self.by_name[name]
            return True
        return False

    def fire(self, name: str, message: bytes | None) -> None:
        signal = self.by_name.get(name)
        if signal is not None:
            signal.fire(message)

    def fire_all(self, message: bytes | None = None) -> None:
        """Wake everyone (a lost subscription may have dropped notifications)."""
        for signal in self.by_name.values():
            signal.fire(message)


class Store(Protocol):
    # True: operations never block or fail (no deadline, breaker or shield needed around them).
    in_process: bool

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Connections and notifications; `started()` once calls may be made."""
        ...

    async def claim(self, scope: str, fingerprint: str, token: str, lease_ms: int) -> Record | None:
        """None: claimed by `token` for `lease_ms`. Else the live record found."""
        ...

    async def complete(self, scope: str, token: str, fingerprint: str, stored: Stored, ttl_s: float) -> bool:
        """Store the response if `token` still owns the claim; notify watchers."""
        ...

    async def release(self, scope: str, token: str, fingerprint: str, reason: str) -> bool:
        """Drop the claim if `token` still owns it; notify watchers with `reason`."""
        ...

    async def refresh(self, claims: list[tuple[str, str, str]], lease_ms: int) -> int:
        """Extend the leases of (scope, token, fingerprint) still owned; count those lost."""
        ...

    async def get(self, scope: str) -> Record | None: ...

    async def watch(self, scope: str) -> Signal:
        """Start watching (subscribe); the returned `Signal` fires when the record settles."""
        ...

    async def unwatch(self, scope: str, signal: Signal) -> None:
        """Stop watching; the local bookkeeping happens before the first checkpoint."""
        ...

    def statistics(self) -> dict[str, Any]: ...
