"""MemoryStore: TTL expiry, LRU eviction under the memory cap, leases, owner-only settling."""

from __future__ import annotations

import trio

from proxy.core import dedup as core
from proxy.metrics import Metrics
from proxy.runtime.dedup import MemoryStore
from proxy.runtime.dedup.memory import held_bytes


def stored(fp: str, size: int) -> core.Stored:
    return core.Stored(fp, 200, [], [b"x" * size])


async def put(store: MemoryStore, scope: str, size: int, ttl_s: float = 60.0) -> None:
    assert await store.claim(scope, "fp", "tok-" + scope, 10_000) is None
    assert await store.complete(scope, "tok-" + scope, "fp", stored("fp", size), ttl_s)


def sample(metrics, name, **labels):
    return metrics.registry.get_sample_value(f"rampmeter_{name}", labels) or 0


async def test_completed_responses_expire_after_their_ttl(autojump_clock):
    metrics = Metrics()
    store = MemoryStore(10_000, metrics=metrics)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)  # the periodic sweep
        await put(store, "a", 100, ttl_s=10)
        await trio.sleep(9.5)
        assert (await store.get("a")).state is core.State.COMPLETE
        await trio.sleep(2)  # past the TTL and past a sweep
        assert store.statistics()["responses"] == 0 and store.statistics()["bytes"] == 0
        assert await store.get("a") is None
        assert await store.claim("a", "fp", "new", 1000) is None  # the key is free again
        nursery.cancel_scope.cancel()
    assert sample(metrics, "dedup_evictions_total", cause="ttl") == 1
    assert sample(metrics, "dedup_stored_bytes") == 0


async def test_memory_cap_evicts_the_least_recently_used(autojump_clock):
    # The cap counts what an entry holds (held_bytes), not its response bytes: two fit, three do not.
    one = held_bytes("a", core.Record(core.State.COMPLETE, "fp", "tok-a", stored("fp", 100)))
    metrics = Metrics()
    store = MemoryStore(int(2.5 * one), metrics=metrics)
    await put(store, "a", 100)
    await put(store, "b", 100)
    assert await store.get("a") is not None  # a replay makes "a" recently used
    await put(store, "c", 100)  # 3 entries > the cap: the least recently used ("b") goes
    assert await store.get("b") is None
    assert await store.get("a") is not None and await store.get("c") is not None
    assert store.statistics()["bytes"] == 2 * one
    assert sample(metrics, "dedup_evictions_total", cause="lru") == 1
    assert sample(metrics, "dedup_stored_bytes") == 2 * one


async def test_claims_lapse_without_refresh_and_only_the_owner_settles(autojump_clock):
    store = MemoryStore(10_000)
    assert await store.claim("k", "fp", "owner", 1000) is None
    found = await store.claim("k", "fp", "other", 1000)
    assert found == core.Record(core.State.IN_FLIGHT, "fp", "owner")
    assert not await store.release("k", "other", "fp", "x")
    assert not await store.complete("k", "other", "fp", stored("fp", 1), 60)
    await trio.sleep(0.8)
    assert await store.refresh([("k", "owner", "fp"), ("gone", "t", "fp")], 1000) == 1
    await trio.sleep(0.8)  # 1.6 s after the claim, but refreshed at 0.8 s
    assert (await store.get("k")).owner == "owner"
    await trio.sleep(0.5)  # the owner's replica stopped refreshing: the lease lapses
    assert await store.get("k") is None
    assert await store.claim("k", "fp", "other", 1000) is None
    assert not await store.complete("k", "owner", "fp", stored("fp", 1), 60)  # a lapsed owner cannot write


async def test_settling_wakes_watchers_with_the_outcome():
    store = MemoryStore(10_000)
    await store.claim("k", "fp", "owner", 1000)
    signal = await store.watch("k")
    event = signal.event
    assert await store.release("k", "owner", "fp", "upstream_timeout")
    assert event.is_set() and signal.message == b"Rupstream_timeout"
    await store.unwatch("k", signal)
    assert store.statistics()["watched"] == 0
    assert "claims=0" in repr(store)


async def test_a_lapsed_claim_nobody_asks_about_again_is_swept(autojump_clock):
    """A leader whose lease lapsed (its refreshes late past the lease) can neither complete nor release
    its claim, and the claim used to stay until a request with the same key came: with unique keys, for
    ever. The periodic sweep now drops lapsed claims too."""
    store = MemoryStore(10_000)
    assert await store.claim("k", "fp", "tok", 1_000) is None
    await trio.sleep(1.5)  # lapsed: no refresh
    assert not await store.complete("k", "tok", "fp", stored("fp", 10), 60.0)
    assert store.statistics()["claims"] == 1
    assert store.sweep() == 1  # what the periodic sweep runs
    assert store.statistics()["claims"] == 0
