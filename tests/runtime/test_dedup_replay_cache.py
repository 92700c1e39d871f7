"""The replay cache in front of a shared store (trio autojump clock; a counting fake stands in for Redis).

Two engines on one `FakeRedis` are two replicas. What is checked: a repeat replay is
answered without a store call (after this replica's own leader completed, and after a
remote follower read the record), the TTL bounds every entry (read, sweep, and the
conservative start for a follower's copy), the byte cap evicts the least recently
used, a reused key is 422 from the cache too, and nothing that is not the store's
complete record is ever kept (failures, lost claims, unknown writes).
"""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
import pytest
import trio
import trio.lowlevel
from hypothesis import given, settings

from proxy.core import dedup as core
from proxy.core.wire import Reason
from proxy.metrics import Metrics
from proxy.policy.dedup import Dedup as DedupPolicy
from proxy.runtime.dedup import (
    Deduplicator,
    Follower,
    Leader,
    MemoryStore,
    Mismatch,
    Replay,
    StoreUnavailable,
    answer,
    events_of,
)
from proxy.runtime.dedup.replay_cache import CLOCK_MARGIN, ReplayCache, keep_until
from tests.runtime.test_dedup_engine import (
    KEY,
    REPLAYED,
    begin,
    body_of,
    collect,
    following,
    sample,
)


class FakeRedis:
    """RedisStore's contract on a MemoryStore: it suspends, it is not in process, it counts calls."""

    in_process = False

    def __init__(self) -> None:
        self.inner = MemoryStore(1 << 30)  # its own cap: the policy's max_memory_bytes is the cache's here
        self.calls: Counter[str] = Counter()
        self.drop_complete_reply = False  # the write lands, the answer is lost (a timeout after the fact)

    async def _call(self, op, *args):
        self.calls[op] += 1
        await trio.lowlevel.checkpoint()  # a network store suspends
        return await getattr(self.inner, op)(*args)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED):
        await self.inner.run(task_status=task_status)

    async def claim(self, *args):
        return await self._call("claim", *args)

    async def complete(self, *args):
        done = await self._call("complete", *args)
        if self.drop_complete_reply:
            raise StoreUnavailable("redis: connection reset")
        return done

    async def release(self, *args):
        return await self._call("release", *args)

    async def refresh(self, *args):
        return await self._call("refresh", *args)

    async def get(self, *args):
        return await self._call("get", *args)

    async def watch(self, *args):
        return await self._call("watch", *args)

    async def unwatch(self, *args):
        return await self._call("unwatch", *args)

    def statistics(self):
        return self.inner.statistics()


def replicas(**overrides):
    policy = DedupPolicy(store="redis", **overrides)
    store = FakeRedis()
    ma, mb = Metrics(), Metrics()
    return Deduplicator(policy, store, ma), Deduplicator(policy, store, mb), store, ma, mb


async def completed(dedup, body=b"{}", headers=KEY, answer=b"answer", status=200):
    leader = await begin(dedup, body=body, headers=headers)
    assert isinstance(leader, Leader)
    leader.handle.record_head(status, [(b"content-type", b"text/plain")])
    leader.handle.record_chunk(answer)
    return await leader.handle.finish(True)


def key(name):
    return [(b"idempotency-key", name.encode()), (b"authorization", b"Bearer sk-a")]


async def test_a_replay_after_this_replicas_leader_completed_does_not_call_the_store(autojump_clock):
    a, _, store, ma, _ = replicas()
    assert await completed(a) is core.Verdict.STORED
    before = sum(store.calls.values())
    for _ in range(3):
        replay = await begin(a)
        assert isinstance(replay, Replay)
        events = await collect(events_of(replay))
        assert events[0].headers[-1] == REPLAYED and body_of(events) == b"answer"
    assert sum(store.calls.values()) == before, "answered from the replica's memory"
    assert sample(ma, "dedup_replay_cache_hits_total") == 3
    assert sample(ma, "dedup_decisions_total", decision="replay") == 3  # still a replay for dashboards
    assert a.statistics()["replay_cache"]["entries"] == 1 and "entries=1" in repr(a)


async def test_a_remote_follower_keeps_what_it_read_from_the_store(autojump_clock):
    a, b, store, _, mb = replicas()
    leader = (await begin(a)).handle
    follower = await begin(b)
    assert isinstance(follower, Follower) and follower.remote
    async with following(follower, 1) as got:
        leader.record_head(200, [])
        leader.record_chunk(b"from a")
        await leader.finish(True)
    assert body_of(got) == b"from a"
    before = store.calls.copy()
    replay = await begin(b)
    assert isinstance(replay, Replay) and replay.stored.chunks == [b"from a"]
    assert store.calls == before and sample(mb, "dedup_replay_cache_hits_total") == 1


async def test_a_record_a_claim_finds_complete_is_not_kept_its_expiry_is_unknown(autojump_clock):
    a, b, store, _, mb = replicas()
    await completed(a)
    await trio.sleep(3000)  # written long ago, as far as b can tell: it may expire any moment
    for n in (1, 2):
        assert isinstance(await begin(b), Replay)
        assert store.calls["claim"] == 1 + n  # a's own claim, then one per replay on b
    assert sample(mb, "dedup_replay_cache_hits_total") == 0


async def test_an_entry_ends_before_the_store_copy_it_stands_for(autojump_clock):
    a, _, store, _, _ = replicas(ttl_s=10)
    await completed(a)  # written at t = 0: the store keeps it until t = 10
    assert keep_until(0.0, 10) == pytest.approx(10 * (1 - CLOCK_MARGIN))
    await trio.sleep(9.985)
    claims = store.calls["claim"]
    assert isinstance(await begin(a), Replay) and store.calls["claim"] == claims
    await trio.sleep(0.01)  # t = 9.995: the cache has let go (at 9.99); the store has not yet
    assert isinstance(await begin(a), Replay) and store.calls["claim"] == claims + 1
    await trio.sleep(0.01)  # t = 10.005: gone everywhere, the key runs again
    assert isinstance(await begin(a), Leader)


async def test_a_followers_copy_counts_its_ttl_from_when_it_saw_the_flight(autojump_clock):
    a, b, store, _, _ = replicas(ttl_s=10)
    leader = (await begin(a)).handle
    follower = await begin(b)  # t = 0: b sees it in flight
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect, follower.events)
        await trio.sleep(5)
        leader.record_head(200, [])
        await leader.finish(True)  # t = 5: the store keeps it until 15
    await trio.sleep(4.98)  # t = 9.98: b cannot know it was written at 5, only after 0
    claims = store.calls["claim"]
    assert isinstance(await begin(b), Replay) and store.calls["claim"] == claims
    await trio.sleep(0.02)
    assert isinstance(await begin(b), Replay) and store.calls["claim"] == claims + 1  # from the store


async def test_the_sweep_frees_expired_entries_nobody_asks_for(autojump_clock):
    a, _, _, ma, _ = replicas(ttl_s=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await completed(a)
        assert a.statistics()["replay_cache"]["bytes"] > 0
        await trio.sleep(6.5)  # past the TTL and one sweep interval
        assert a.statistics()["replay_cache"] == {
            "entries": 0,
            "bytes": 0,
            "max_bytes": a.policy.max_memory_bytes,
            "hits": 0,
            "evicted": {"lru": 0, "ttl": 1},
        }
        assert sample(ma, "dedup_replay_cache_evictions_total", cause="ttl") == 1
        assert sample(ma, "dedup_replay_cache_bytes") == 0
        nursery.cancel_scope.cancel()


async def test_the_byte_cap_evicts_the_least_recently_used(autojump_clock):
    # The budget counts what an entry holds (held_bytes; all entries here hold the same): two fit.
    a, _, store, ma, _ = replicas()
    await completed(a, headers=key("k1"), answer=b"x" * 100)
    one = a.statistics()["replay_cache"]["bytes"]
    assert one > 122  # more than the response's 100 body + 22 header bytes
    a.policy = DedupPolicy(store="redis", max_memory_bytes=int(2.5 * one))
    await completed(a, headers=key("k2"), answer=b"x" * 100)
    assert isinstance(await begin(a, headers=key("k1")), Replay)  # k1 is now the most recently used
    await completed(a, headers=key("k3"), answer=b"x" * 100)  # pushes out k2
    claims = store.calls["claim"]
    for name in ("k1", "k3"):
        assert isinstance(await begin(a, headers=key(name)), Replay)
    assert store.calls["claim"] == claims
    assert isinstance(await begin(a, headers=key("k2")), Replay) and store.calls["claim"] == claims + 1
    assert sample(ma, "dedup_replay_cache_evictions_total", cause="lru") == 1
    assert a.statistics()["replay_cache"]["bytes"] == 2 * one
    await completed(a, headers=key("big"), answer=b"x" * 3 * one)  # larger than the budget: not kept at all
    assert isinstance(await begin(a, headers=key("big")), Replay) and store.calls["claim"] == claims + 3
    a.policy = DedupPolicy(store="redis", max_memory_bytes=0)  # a reload to 0 drops everything
    assert a.statistics()["replay_cache"]["entries"] == 0


async def test_a_reused_key_is_422_from_the_cache(autojump_clock):
    a, b, store, ma, _ = replicas()
    await completed(a, body=b'{"n": 1}')
    before = sum(store.calls.values())
    mismatch = await begin(a, body=b'{"n": 2}')
    assert isinstance(mismatch, Mismatch) and answer(mismatch)[0] == 422
    assert sum(store.calls.values()) == before and sample(ma, "dedup_replay_cache_hits_total") == 1
    assert sample(ma, "dedup_decisions_total", decision="mismatch") == 1
    assert isinstance(await begin(a, body=b'{"n": 1}'), Replay)  # the original payload still replays
    assert isinstance(await begin(b, body=b'{"n": 2}'), Mismatch)  # as the store itself says


@pytest.mark.parametrize(
    ("how", "verdict"),
    [("failed", core.Verdict.FAILED), ("5xx", core.Verdict.NOT_STORABLE), ("too_large", core.Verdict.TOO_LARGE)],
)
async def test_a_released_record_is_never_kept(autojump_clock, how, verdict):
    a, _, store, _, _ = replicas(max_entry_bytes=10)
    leader = (await begin(a)).handle
    if how == "failed":
        assert await leader.finish(False, Reason.UPSTREAM_TIMEOUT) is verdict
    else:
        leader.record_head(503 if how == "5xx" else 200, [])
        leader.record_chunk(b"x" * (20 if how == "too_large" else 1))
        assert await leader.finish(True) is verdict
    assert store.calls["release"] == 1 and a.statistics()["replay_cache"]["entries"] == 0
    assert isinstance(await begin(a), Leader), "the retry runs again"


async def test_a_write_that_lost_its_claim_is_not_kept(autojump_clock):
    a, b, _, _, _ = replicas(lease_ms=1000)
    leader = (await begin(a)).handle  # a stalls: no lease keeper runs
    await trio.sleep(1.5)
    assert isinstance(await begin(b), Leader)  # a's claim lapsed; b owns the key now
    leader.record_head(200, [])
    leader.record_chunk(b"a's late answer")
    assert await leader.finish(True) is core.Verdict.STORED  # complete() returned False: "lost"
    again = await begin(a)
    assert isinstance(again, Follower) and again.remote, "a follows b's flight, never replays its own answer"
    assert a.statistics()["replay_cache"]["entries"] == 0


async def test_a_write_whose_answer_was_lost_is_not_kept(autojump_clock):
    a, _, store, _, _ = replicas()
    store.drop_complete_reply = True  # it may or may not have landed: here it did
    await completed(a)
    store.drop_complete_reply = False
    await trio.sleep(1.5)  # past the breaker (store_retry_ms)
    assert a.statistics()["replay_cache"]["entries"] == 0
    assert isinstance(await begin(a), Replay) and isinstance(await begin(a), Replay)
    assert store.calls["claim"] == 3, "each replay asked the store"


async def test_the_memory_store_gets_no_cache():
    policy = DedupPolicy()
    dedup = Deduplicator(policy, MemoryStore(policy.max_memory_bytes))
    await completed(dedup)
    assert isinstance(await begin(dedup), Replay)
    assert dedup.statistics()["replay_cache"] is None and "cache=None" in repr(dedup)


# --- the cache alone: its invariants under any sequence of operations ---

METRICS = Metrics()  # one registry for every example: building one per example would dominate the run
SCOPES = ("s0", "s1", "s2", "s3")
ops = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(SCOPES), st.integers(0, 120), st.floats(0, 20)),
    st.tuples(st.just("get"), st.sampled_from(SCOPES)),
    st.tuples(st.just("advance"), st.floats(0, 8)),
    st.tuples(st.just("sweep")),
    st.tuples(st.just("resize"), st.integers(0, 300)),
)


def stored_of(size: int, tag: str) -> core.Record:
    return core.Record(core.State.COMPLETE, tag, "", core.Stored(tag, 200, [], [b"x" * size]))


@settings(max_examples=150, deadline=None)
@given(st.lists(ops, max_size=60))
def test_the_cache_never_answers_past_expiry_or_holds_more_than_its_budget(steps):
    now = [0.0]
    cache = ReplayCache(200, METRICS, clock=lambda: now[0])
    model: dict[str, tuple[core.Record, float]] = {}  # what may be answered, and until when
    for i, step in enumerate(steps):
        if step[0] == "put":
            _, scope, size, ttl = step
            record = stored_of(size, f"fp{i}")
            if cache.put(scope, record, now[0] + ttl):
                model[scope] = (record, now[0] + ttl)
            else:
                model.pop(scope, None)  # not kept: an older copy for the scope must not linger either
        elif step[0] == "get":
            got = cache.get(step[1])
            if got is not None:
                record, until = model[step[1]]
                assert got is record and now[0] < until, "only the latest copy, and only before its expiry"
        elif step[0] == "advance":
            now[0] += step[1]
        elif step[0] == "sweep":
            cache.sweep()
            live = sum(until > now[0] for _, until in model.values())
            assert len(cache) <= live, "the sweep leaves no expired entry behind"
        else:
            cache.max_bytes = step[1]
        stats = cache.statistics()
        assert stats["bytes"] <= stats["max_bytes"] and stats["entries"] == len(cache)


def test_a_replaced_entry_keeps_its_own_expiry():
    now = [0.0]
    cache = ReplayCache(1000, METRICS, clock=lambda: now[0])
    first, second = stored_of(10, "a"), stored_of(10, "b")
    assert cache.put("s", first, 1.0) and cache.put("s", second, 10.0)
    now[0] = 2.0
    assert cache.sweep() == 0, "the first copy's expiry no longer applies"
    assert cache.get("s") is second
    now[0] = 10.0
    assert cache.get("s") is None and cache.statistics()["evicted"]["ttl"] == 1
    with pytest.raises(ValueError):
        cache.put("s", core.Record(core.State.IN_FLIGHT, "a", "token"), 20.0)
