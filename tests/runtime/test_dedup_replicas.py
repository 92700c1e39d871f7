"""Two engines on one store behave as two replicas; store failures under fail_open / fail_closed."""

from __future__ import annotations

import logging

import trio

from proxy.core import dedup as core
from proxy.core.wire import Reason
from proxy.metrics import Metrics
from proxy.policy.dedup import Dedup as DedupPolicy
from proxy.runtime.dedup import (
    Deduplicator,
    Follower,
    Leader,
    MemoryStore,
    Replay,
    StoreDown,
    StoreUnavailable,
    answer,
)
from tests.runtime.test_dedup_engine import KEY, REPLAYED, begin, body_of, collect, sample


def replicas(**overrides):
    policy = DedupPolicy(**overrides)
    store = MemoryStore(policy.max_memory_bytes)
    return Deduplicator(policy, store), Deduplicator(policy, store), store


async def test_a_follower_on_another_replica_is_woken_by_the_leaders_completion(autojump_clock):
    a, b, _ = replicas()
    leader = (await begin(a)).handle
    follower = await begin(b)
    assert isinstance(follower, Follower) and follower.remote
    done_at = {}

    async def follow():
        done_at["events"] = await collect(follower.events)
        done_at["t"] = trio.current_time()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow)
        await trio.sleep(1.25)  # well under the re-check interval (lease_ms / 2 = 5 s)
        leader.record_head(200, [(b"content-type", b"text/plain")])
        leader.record_chunk(b"once")
        await leader.finish(True)
    events = done_at["events"]
    assert done_at["t"] == 1.25, "woken by the notification, not by polling"
    assert events[0].headers[-1] == REPLAYED and body_of(events) == b"once" and events[-1] == core.END
    assert isinstance(await begin(b), Replay)


async def test_a_remote_follower_gets_the_leaders_failure_reason(autojump_clock):
    a, b, _ = replicas()
    leader = (await begin(a)).handle
    follower = await begin(b)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(leader.finish, False, Reason.UPSTREAM_TIMEOUT)
        [failed] = await collect(follower.events)
    assert failed.reason is Reason.UPSTREAM_TIMEOUT
    assert isinstance(await begin(b), Leader)


async def test_a_dead_leaders_claim_lapses_and_the_key_is_free_again(autojump_clock):
    a, b, _ = replicas(lease_ms=1000)
    await begin(a)  # replica a dies: it never finishes and runs no lease keeper
    follower = await begin(b)
    [failed] = await collect(follower.events)
    assert failed.reason is Reason.UPSTREAM_UNAVAILABLE
    assert 1.0 <= trio.current_time() <= 1.5  # the lease, plus at most one re-check interval
    assert isinstance(await begin(b), Leader)


async def test_a_live_leader_keeps_its_claim_past_the_lease(autojump_clock):
    a, b, _ = replicas(lease_ms=1000)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)  # refreshes every lease / 3
        leader = (await begin(a)).handle
        await trio.sleep(5)  # five leases long
        follower = await begin(b)
        assert isinstance(follower, Follower) and follower.remote
        leader.record_head(200, [])
        leader.record_chunk(b"slow")
        await leader.finish(True)
        assert body_of(await collect(follower.events)) == b"slow"
        nursery.cancel_scope.cancel()


class FlakyStore(MemoryStore):
    """A MemoryStore whose backend can be switched off, counting the calls that reach it."""

    in_process = False  # it fails, like Redis

    down = False
    calls = 0

    async def claim(self, *args):
        self.calls += 1
        if self.down:
            raise StoreUnavailable("connection refused")
        return await super().claim(*args)

    async def release(self, *args):
        if self.down:
            raise StoreUnavailable("connection refused")
        return await super().release(*args)


def flaky(**overrides):
    policy = DedupPolicy(**overrides)
    metrics = Metrics()
    store = FlakyStore(policy.max_memory_bytes)
    return Deduplicator(policy, store, metrics), store, metrics


async def test_fail_closed_answers_503_while_the_store_is_down(autojump_clock):
    dedup, store, metrics = flaky(on_store_error="fail_closed", store_retry_ms=1000)
    store.down = True
    down = await begin(dedup)
    assert isinstance(down, StoreDown)
    status, headers, _ = answer(down)
    assert status == 503 and (b"x-rampmeter-reason", b"idempotency_store_unavailable") in headers
    assert isinstance(await begin(dedup), StoreDown) and store.calls == 1  # the breaker spares the store
    store.down = False
    await trio.sleep(1.1)
    assert isinstance(await begin(dedup), Leader)
    assert sample(metrics, "dedup_store_errors_total", op="claim") == 1
    assert sample(metrics, "dedup_decisions_total", decision="store_down") == 2


async def test_fail_open_serves_and_still_coalesces_locally_and_logs_once(autojump_clock, caplog):
    caplog.set_level(logging.WARNING, logger="rampmeter.dedup")
    dedup, store, metrics = flaky(on_store_error="fail_open", store_retry_ms=100)
    store.down = True
    leader = await begin(dedup)
    assert isinstance(leader, Leader) and leader.handle.degraded
    follower = await begin(dedup)  # same replica: coalesced even without the store
    assert isinstance(follower, Follower)
    await trio.sleep(0.2)
    other = await begin(dedup, headers=[(b"idempotency-key", b"k2")])  # a second store error, same outage
    leader.handle.record_head(200, [])
    await leader.handle.finish(True)
    await other.handle.finish(False)
    assert body_of(await collect(follower.events)) == b""
    assert store.calls == 2 and sample(metrics, "dedup_store_errors_total", op="claim") == 2
    assert sample(metrics, "dedup_decisions_total", decision="fail_open") == 2
    outage_lines = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(outage_lines) == 1 and "order-42" not in caplog.text
    store.down = False
    await trio.sleep(0.2)
    # Nothing reached the store while degraded, but this replica kept the response: its retry replays.
    assert isinstance(await begin(dedup, headers=KEY), Replay)
    ident = dedup.identify(b"POST", b"/v1/chat/completions", KEY, b"{}")
    assert await store.get(ident.scope) is None
    assert isinstance(await begin(dedup, headers=[(b"idempotency-key", b"k3")]), Leader)  # the store again
    assert "reachable again" in caplog.text


class HandshakeStore(MemoryStore):
    """A claim that takes 50 ms, and turns its caller's cancellation into a store error, as
    coredis does when a cancel interrupts a new connection's handshake."""

    in_process = False

    async def claim(self, *args):
        try:
            await trio.sleep(0.05)
        except trio.Cancelled:
            raise StoreUnavailable("redis: Unable to establish a connection") from None
        return await super().claim(*args)


async def test_a_callers_own_cancellation_is_not_a_store_outage(autojump_clock):
    policy = DedupPolicy(store_retry_ms=1000)
    metrics = Metrics()
    dedup = Deduplicator(policy, HandshakeStore(policy.max_memory_bytes), metrics)
    with trio.move_on_after(0.01) as gone:  # the client left mid-claim
        await begin(dedup)
    assert gone.cancelled_caught  # the cancellation went on; no StoreUnavailable escaped
    assert not dedup.statistics()["guard"]["down"]
    assert sample(metrics, "dedup_store_errors_total", op="claim") == 0
    assert isinstance(await begin(dedup, headers=[(b"idempotency-key", b"k2")]), Leader)  # not fail_open
    assert sample(metrics, "dedup_decisions_total", decision="fail_open") == 0
