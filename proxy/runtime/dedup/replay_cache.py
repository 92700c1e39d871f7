"""This replica's memory of completed idempotency records, in front of a shared store.

Theory of operation: with the Redis store every replay costs a claim round trip
(and coredis's per-command CPU). A completed record never changes until its TTL
ends, so the engine keeps each completed record it has seen here, keyed by
scope, and answers later requests for that scope (a replay, or 422 for another
payload: `core.decide` on the kept record) without calling the store. Entries
sit in an OrderedDict in least-recently-used order, bounded by the memory they
hold (`memory.held_bytes`, the same measure the memory store caps); a response
larger than the whole budget is not kept. Each entry carries
`expires_at` and is never returned at or after it (checked on every read); a
heap in expiry order lets `sweep()` (every SWEEP_INTERVAL_S in `run()`) free
expired entries in O(expired log n). The heap is rebuilt when stale items
(entries already dropped) outnumber live ones, so it stays O(entries).

Why a kept record is always the store's current record for its scope (the
invariant; the engine only calls `put` where it holds):
  1. Only records the store held as COMPLETE are kept: one read back as such,
     or this replica's own once `complete` confirmed the write (not when its
     claim had lapsed, nor when the answer was lost). A released record (a
     failure, a 5xx, a response too large) is never complete, so never kept.
  2. In the store a COMPLETE record is immutable until it expires: claim only
     sets an absent key (SET NX), complete and release only replace the exact
     in-flight value of their own claim, and the record table
     (`proxy.core.dedup.TRANSITIONS`) leaves COMPLETE only on EXPIRE or EVICT.
  3. `expires_at` is never later than the store copy's expiry: the copy was
     written at or after a moment `t` the engine observed (it started the
     `complete` call at `t`, or at `t` it saw the scope in flight, so the
     complete value it read later was written after `t`), and the store keeps
     it for ttl_s from its write (`keep_until`: whole milliseconds, as Redis's
     PX, less CLOCK_MARGIN in case the store's clock runs faster than ours).
Hence, until `expires_at`, the store holds exactly the kept record for the
scope: no other completed record can be current there.

One exception, on purpose: while the store is unreachable and on_store_error is
fail_open, a leader here runs without a claim, and its response is kept for ttl_s
from its completion (engine `_keep_local`) although the store holds nothing for
the scope. Retries that reach this replica during (and after) the outage replay
it instead of running again; another replica, or this one's key after an LRU
eviction, may still run it once more and keep its own response. That is the
bargain fail_open already makes (no cross-replica dedup while the store is away),
narrowed from "every retry runs" to "at most once per replica". A record a claim finds
already complete was written at an unknown time, so its expiry is unknown and
it is not kept (a store that reported the remaining TTL would allow it).
Assumed: replicas sharing key_prefix run one ttl_s (one policy), and Redis
does not drop keys early (a restart without persistence, FLUSHDB, maxmemory
eviction); if it does, the key may run again elsewhere, while this replica
keeps answering with the response the key produced, within its ttl_s.

Hand-written: cachetools.TLRUCache comes close (per-item expiry, getsizeof, an
injectable timer) but is not a dependency here, cannot change its maxsize on a
policy reload, and reports neither cause of eviction to metrics without
subclassing its internals; an OrderedDict and a heap are less code than that.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import trio

from proxy.core.dedup import Record, State
from proxy.metrics import Metrics
from proxy.runtime.dedup.memory import Kept, Swept, held_bytes

# Redis on another machine counts its TTL on its own clock: give up 0.1% of the TTL (3.6 s of
# an hour) rather than answer past the store copy's expiry if that clock runs fast.
CLOCK_MARGIN = 0.001


def keep_until(written_after: float, ttl_s: float) -> float:
    """When to stop answering for a record the store wrote at or after `written_after`, kept `ttl_s`."""
    return written_after + int(ttl_s * 1000) / 1000 * (1 - CLOCK_MARGIN)


class ReplayCache(Swept):
    def __init__(
        self, max_bytes: int, metrics: Metrics | None = None, clock: Callable[[], float] = trio.current_time
    ) -> None:
        metrics = metrics or Metrics()
        self._clock = clock
        self._entries: OrderedDict[str, Kept] = OrderedDict()  # least recently used first
        self._expiry: list[tuple[float, int, str, Kept]] = []  # heap; items of dropped entries are stale
        self._seq = itertools.count()  # ties in expires_at never compare entries
        self._bytes = 0
        self._hits = 0
        self._evicted = {"lru": 0, "ttl": 0}
        self._hit_counter = metrics.dedup_replay_cache_hits
        self._evict_counters = {cause: metrics.dedup_replay_cache_evictions.labels(cause) for cause in self._evicted}
        self._bytes_gauge = metrics.dedup_replay_cache_bytes
        self._max_bytes = max_bytes

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        """Policy reload: a smaller budget evicts at once; 0 keeps nothing."""
        self._max_bytes = value
        self._evict_over_cap()

    def get(self, scope: str) -> Record | None:
        """The kept complete record, while it is certainly still the store's; counts a hit."""
        entry = self._entries.get(scope)
        if entry is None:
            return None
        if entry.expires_at <= self._clock():
            self._drop(scope, "ttl")
            return None
        self._entries.move_to_end(scope)
        self._hits += 1
        self._hit_counter.inc()
        return entry.record

    def put(self, scope: str, record: Record, expires_at: float) -> bool:
        """Keep a record the store held as complete until `expires_at` (see the invariant above)."""
        if record.state is not State.COMPLETE or record.stored is None:
            raise ValueError("only complete records are kept for replay")
        if scope in self._entries:  # a newer sighting of the scope replaces the older one, kept or not
            self._drop(scope, None)
        size = held_bytes(scope, record)
        if size > self._max_bytes or expires_at <= self._clock():
            return False
        entry = self._entries[scope] = Kept(record, expires_at, size)
        heapq.heappush(self._expiry, (expires_at, next(self._seq), scope, entry))
        self._bytes += size
        self._evict_over_cap()
        self._bytes_gauge.set(self._bytes)
        if len(self._expiry) > 2 * len(self._entries) + 64:
            self._compact()
        return True

    def sweep(self) -> int:
        """Free the entries whose time is up, earliest first; returns how many."""
        now, dropped = self._clock(), 0
        while self._expiry and self._expiry[0][0] <= now:
            _, _, scope, entry = heapq.heappop(self._expiry)
            if self._entries.get(scope) is entry:
                self._drop(scope, "ttl")
                dropped += 1
        return dropped

    def _evict_over_cap(self) -> None:
        while self._bytes > self._max_bytes and self._entries:
            self._drop(next(iter(self._entries)), "lru")

    def _drop(self, scope: str, cause: str | None) -> None:
        entry = self._entries.pop(scope)
        self._bytes -= entry.size
        self._bytes_gauge.set(self._bytes)
        if cause is not None:
            self._evicted[cause] += 1
            self._evict_counters[cause].inc()

    def _compact(self) -> None:
        self._expiry = [item for item in self._expiry if self._entries.get(item[2]) is item[3]]
        heapq.heapify(self._expiry)

    def __len__(self) -> int:
        return len(self._entries)

    def statistics(self) -> dict[str, Any]:
        return {
            "entries": len(self._entries),
            "bytes": self._bytes,
            "max_bytes": self._max_bytes,
            "hits": self._hits,
            "evicted": dict(self._evicted),
        }

    def __repr__(self) -> str:
        return f"<ReplayCache entries={len(self._entries)} bytes={self._bytes}/{self._max_bytes} hits={self._hits}>"
