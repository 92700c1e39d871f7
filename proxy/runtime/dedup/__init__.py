"""Idempotent dedup at runtime: one GPU execution per idempotency key.

The request path's view (see engine.py for the theory of operation):

    dedup = Deduplicator(policy.dedup, build_store(policy.dedup, metrics), metrics)
    await nursery.start(dedup.run)                 # store connections, lease refresh
    ident = dedup.identify(method, target, headers, body)   # None | Identity; HeaderError -> 400
    outcome = await dedup.begin(ident.scope, ident.fingerprint)
      Leader(handle)     record_head / record_chunk, then `await handle.finish(ok)` exactly once
                         (or `async with handle:`); handle.subscribe() for the leader's own client
      Follower(events)   `with outcome.events as events: async for event in events:` Head, Chunk...,
                         then End or Failed (failure_answer(event)); leaving `with` detaches a reader
                         whose client went away
      Replay(stored)     stored.status/headers/chunks, or events_of(outcome) (the same events a follower reads)
      Mismatch / InFlightConflict / StoreDown   -> answer(outcome) (status, headers, body)

Replay, Mismatch and InFlightConflict are proxy.core.dedup's own decision values.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from proxy.core.dedup import InFlightConflict, Mismatch, Replay
from proxy.metrics import Metrics
from proxy.policy.dedup import Dedup as DedupPolicy
from proxy.runtime.dedup.engine import Deduplicator
from proxy.runtime.dedup.memory import MemoryStore
from proxy.runtime.dedup.outcomes import (
    DedupOutcome,
    Follower,
    Identity,
    Leader,
    LeaderHandle,
    StoreDown,
    answer,
    events_of,
    failure_answer,
)
from proxy.runtime.dedup.store import Store, StoreUnavailable

__all__ = [
    "DedupOutcome",
    "Deduplicator",
    "Follower",
    "Identity",
    "InFlightConflict",
    "Leader",
    "LeaderHandle",
    "MemoryStore",
    "Mismatch",
    "RedisStore",
    "Replay",
    "Store",
    "StoreDown",
    "StoreUnavailable",
    "answer",
    "build_store",
    "events_of",
    "failure_answer",
]


def __getattr__(name: str):
    # RedisStore needs coredis, the `redis` extra: imported only when a policy asks for Redis.
    if name == "RedisStore":
        from proxy.runtime.dedup.redis import RedisStore

        return RedisStore
    raise AttributeError(name)


def build_store(
    policy: DedupPolicy, metrics: Metrics | None = None, clock: Callable[[], float] = trio.current_time
) -> Store:
    if policy.store == "redis":
        try:
            from proxy.runtime.dedup.redis import RedisStore
        except ModuleNotFoundError as exc:
            raise RuntimeError(
                f"dedup.store = 'redis' needs {exc.name}: pip install 'rampmeter[sidecar,redis]'"
            ) from exc
        return RedisStore(policy.redis_url, policy.key_prefix)
    return MemoryStore(policy.max_memory_bytes, metrics=metrics, clock=clock)
