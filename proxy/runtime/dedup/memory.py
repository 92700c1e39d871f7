"""The in-memory dedup store: one replica's claims and completed responses.

Theory of operation: claims (in flight, no bytes) and completed responses live in
two tables. `_done` is an OrderedDict in least-recently-used order: a replay
moves its entry to the end, and while the kept bytes exceed `max_memory_bytes`
the front is evicted. `_expiry` holds the same scopes in completion order, which
is expiry order as long as the TTL does not change, so the periodic sweep in
`run()` pops only expired entries from its front (O(expired)); every read also
checks expiry itself, so a TTL change only delays freeing, never a wrong replay.

Claims have leases like Redis's, so two engines sharing one MemoryStore behave
like two replicas sharing Redis (the runtime tests rely on it). Settling notifies
in-process watchers. Time comes from the injected clock (trio's by default).

What `max_memory_bytes` counts (here and in the replay cache): the memory an entry
really holds (`held_bytes`), not the bytes of its response. A kept response is a
tree of Python objects (the scope and fingerprint strings, a record, a list of
chunks each a `bytes` with 33 bytes of header, header tuples), plus its slots in
the tables; counting response bytes alone undercounted real memory 2x for a
streamed answer (one small `bytes` per SSE event) and ~4x for a 400-byte JSON one.
`tests/security/test_dedup_memory.py` checks the count against tracemalloc.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from sys import getsizeof
from typing import Any

import trio

from proxy.core.dedup import Record, State, Step, Stored, advance
from proxy.metrics import Metrics
from proxy.runtime.dedup.store import Signal, Signals

SWEEP_INTERVAL_S = 1.0
# Per entry beyond its own objects: its hash-table entries and order links in the store's
# two ordered dicts (or the cache's dict and heap item), the expiry float. Measured with
# tracemalloc at 270-290 bytes on CPython 3.11; rounded up for the slack of a growing dict.
ENTRY_OVERHEAD_BYTES = 320


def held_bytes(scope: str, record: Record) -> int:
    """What keeping `record` under `scope` holds in this process: CPython object sizes, plus the table slots."""
    stored = record.stored
    assert stored is not None
    size = ENTRY_OVERHEAD_BYTES + getsizeof(scope) + getsizeof(record) + getsizeof(stored)
    size += getsizeof(stored.fingerprint) + (
        0 if record.fingerprint is stored.fingerprint else getsizeof(record.fingerprint)
    )
    size += getsizeof(record.owner) if record.owner else 0
    size += getsizeof(stored.headers) + sum(getsizeof(h) + getsizeof(h[0]) + getsizeof(h[1]) for h in stored.headers)
    return size + getsizeof(stored.chunks) + sum(map(getsizeof, stored.chunks))


class _Claim:
    __slots__ = ("expires_at", "record")

    def __init__(self, record: Record, expires_at: float) -> None:
        self.record = record
        self.expires_at = expires_at


class Kept:
    """A complete record kept in memory until `expires_at`, and what it holds (`held_bytes`; also replay_cache.py's entry)."""

    __slots__ = ("expires_at", "record", "size")

    def __init__(self, record: Record, expires_at: float, size: int) -> None:
        self.record = record
        self.expires_at = expires_at
        self.size = size


class Swept(ABC):
    """`run()` frees expired entries: `sweep()` every SWEEP_INTERVAL_S (MemoryStore, ReplayCache)."""

    @abstractmethod
    def sweep(self) -> int:
        """Free what has expired; how many entries went."""

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(SWEEP_INTERVAL_S)
            self.sweep()


class MemoryStore(Swept):
    in_process = True  # no await inside actually suspends: callers need no deadline or shield

    def __init__(
        self, max_memory_bytes: int, *, metrics: Metrics | None = None, clock: Callable[[], float] = trio.current_time
    ) -> None:
        self.max_memory_bytes = max_memory_bytes
        self._clock = clock
        self._claims: dict[str, _Claim] = {}
        self._done: OrderedDict[str, Kept] = OrderedDict()
        self._expiry: OrderedDict[str, float] = OrderedDict()
        self._bytes = 0
        self._signals = Signals()
        metrics = metrics or Metrics()
        self._evicted_lru = metrics.dedup_evictions.labels("lru")
        self._evicted_ttl = metrics.dedup_evictions.labels("ttl")
        self._bytes_gauge = metrics.dedup_stored_bytes

    async def claim(self, scope: str, fingerprint: str, token: str, lease_ms: int) -> Record | None:
        now = self._clock()
        found = self._live(scope, now)
        if found is not None:
            return found
        state = advance(State.ABSENT, Step.CLAIM)
        self._claims[scope] = _Claim(Record(state, fingerprint, token), now + lease_ms / 1000)
        return None

    async def complete(self, scope: str, token: str, fingerprint: str, stored: Stored, ttl_s: float) -> bool:
        claim = self._owned(scope, token)
        if claim is None:
            return False
        del self._claims[scope]
        now = self._clock()
        record = Record(advance(State.IN_FLIGHT, Step.STORE), fingerprint, token, stored)
        size = held_bytes(scope, record)
        if scope in self._done:  # unreachable while claims are exclusive; keeps the byte count honest
            self._drop(scope, Step.EVICT)
        self._done[scope] = Kept(record, now + ttl_s, size)
        self._expiry[scope] = now + ttl_s
        self._bytes += size
        self._evict_over_cap()
        self._bytes_gauge.set(self._bytes)
        self._signals.fire(scope, b"C")
        return True

    async def release(self, scope: str, token: str, fingerprint: str, reason: str) -> bool:
        if self._owned(scope, token) is None:
            return False
        advance(State.IN_FLIGHT, Step.RELEASE)
        del self._claims[scope]
        self._signals.fire(scope, b"R" + reason.encode())
        return True

    async def refresh(self, claims: list[tuple[str, str, str]], lease_ms: int) -> int:
        lost, until = 0, self._clock() + lease_ms / 1000
        for scope, token, _fp in claims:
            claim = self._owned(scope, token)
            if claim is None:
                lost += 1
            else:
                claim.expires_at = until
        return lost

    async def get(self, scope: str) -> Record | None:
        return self._live(scope, self._clock())

    async def watch(self, scope: str) -> Signal:
        return self._signals.join(scope)[0]

    async def unwatch(self, scope: str, signal: Signal) -> None:
        self._signals.leave(scope, signal)

    def sweep(self) -> int:
        """Drop expired responses from the front of the completion order, and lapsed claims.

        A claim whose lease lapsed is otherwise dropped only by the next lookup of its key (`_live`):
        its leader can neither complete nor release it, so with unique keys it stayed for ever. The
        claims are the requests in flight with a key, so the scan is short."""
        now, dropped = self._clock(), 0
        lapsed = [scope for scope, claim in self._claims.items() if claim.expires_at <= now]
        for scope in lapsed:
            self._lapse(scope)
        dropped += len(lapsed)
        while self._expiry:
            scope, expires_at = next(iter(self._expiry.items()))
            if expires_at > now:
                break
            self._drop(scope, Step.EXPIRE)
            dropped += 1
        return dropped

    def _live(self, scope: str, now: float) -> Record | None:
        claim = self._claims.get(scope)
        if claim is not None:
            if claim.expires_at > now:
                return claim.record
            self._lapse(scope)  # its replica stopped refreshing: free the key
        done = self._done.get(scope)
        if done is None:
            return None
        if done.expires_at <= now:
            self._drop(scope, Step.EXPIRE)
            return None
        self._done.move_to_end(scope)
        return done.record

    def _lapse(self, scope: str) -> None:
        advance(State.IN_FLIGHT, Step.LAPSE)
        del self._claims[scope]

    def _owned(self, scope: str, token: str) -> _Claim | None:
        claim = self._claims.get(scope)
        if claim is None or claim.record.owner != token or claim.expires_at <= self._clock():
            return None
        return claim

    def _evict_over_cap(self) -> None:
        while self._bytes > self.max_memory_bytes and self._done:
            self._drop(next(iter(self._done)), Step.EVICT)

    def _drop(self, scope: str, step: Step) -> None:
        done = self._done.pop(scope)
        advance(done.record.state, step)
        self._expiry.pop(scope, None)
        self._bytes -= done.size
        self._bytes_gauge.set(self._bytes)
        (self._evicted_lru if step is Step.EVICT else self._evicted_ttl).inc()

    def statistics(self) -> dict[str, Any]:
        return {
            "store": "memory",
            "claims": len(self._claims),
            "responses": len(self._done),
            "bytes": self._bytes,
            "max_memory_bytes": self.max_memory_bytes,
            "watched": len(self._signals.by_name),
        }

    def __repr__(self) -> str:
        return (
            f"<MemoryStore claims={len(self._claims)} responses={len(self._done)} "
            f"bytes={self._bytes}/{self.max_memory_bytes}>"
        )
