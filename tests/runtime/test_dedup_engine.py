"""The dedup engine on one replica (memory store, trio autojump clock): coalescing,
replay, failure semantics, caps, cancellation, exactly-once finish."""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from proxy.core import dedup as core
from proxy.core.wire import HeaderError, Reason
from proxy.metrics import Metrics
from proxy.policy.dedup import Dedup as DedupPolicy
from proxy.runtime.dedup import (
    Deduplicator,
    Follower,
    InFlightConflict,
    Leader,
    MemoryStore,
    Mismatch,
    Replay,
    StoreUnavailable,
    answer,
    events_of,
    failure_answer,
)

KEY = [(b"idempotency-key", b"order-42"), (b"authorization", b"Bearer sk-a")]
REPLAYED = (b"idempotent-replayed", b"true")


def make(**overrides):
    policy = DedupPolicy(**overrides)
    metrics = Metrics()
    store = MemoryStore(policy.max_memory_bytes, metrics=metrics)
    return Deduplicator(policy, store, metrics), store, metrics


def sample(metrics, name, **labels):
    return metrics.registry.get_sample_value(f"rampmeter_{name}", labels) or 0


async def begin(dedup, body=b"{}", headers=KEY, target=b"/v1/chat/completions"):
    ident = dedup.identify(b"POST", target, headers, body)
    return await dedup.begin(ident.scope, ident.fingerprint)


async def collect(events):
    return [event async for event in events]


@asynccontextmanager
async def following(follower, settle_s: float = 0.2):
    """Collect `follower`'s events in a task while the body runs (after `settle_s`); the list is
    complete once the block has exited (the task's nursery waited for the end)."""
    got: list = []

    async def follow() -> None:
        got.extend(await collect(follower.events))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow)
        await trio.sleep(settle_s)
        yield got


def body_of(events):
    return b"".join(e.data for e in events if isinstance(e, core.Chunk))


async def test_follower_gets_the_leaders_response_and_a_retry_replays_it():
    dedup, _, metrics = make()
    leader = await begin(dedup)
    follower = await begin(dedup)
    assert isinstance(leader, Leader) and isinstance(follower, Follower) and not follower.remote
    leader.handle.record_head(200, [(b"content-type", b"application/json"), (b"connection", b"keep-alive")])
    leader.handle.record_chunk(b'{"answer": 42}')
    assert await leader.handle.finish(True) is core.Verdict.STORED
    got = await collect(follower.events)
    assert got[0] == core.Head(200, [(b"content-type", b"application/json"), REPLAYED])  # hop-by-hop dropped
    assert got[1:] == [core.Chunk(b'{"answer": 42}'), core.END]
    replay = await begin(dedup)
    assert isinstance(replay, Replay) and replay.stored.chunks == [b'{"answer": 42}']
    assert await collect(events_of(replay)) == got
    assert sample(metrics, "dedup_decisions_total", decision="lead") == 1
    assert sample(metrics, "dedup_decisions_total", decision="follow") == 1
    assert sample(metrics, "dedup_decisions_total", decision="replay") == 1
    assert sample(metrics, "dedup_finishes_total", verdict="stored") == 1


async def test_streaming_fans_out_identical_bytes_to_every_follower_including_late_joiners(autojump_clock):
    dedup, _, _ = make()
    leader = (await begin(dedup)).handle
    own = leader.subscribe()  # the leader's own client reads like a follower, unmarked
    received = {}

    async def stream():
        leader.record_head(200, [(b"content-type", b"text/event-stream")], streamed=True)
        for i in range(6):
            await trio.sleep(1)
            leader.record_chunk(f"data: token{i}\n\n".encode())
        await leader.finish(True)

    async def follow(name, delay):
        await trio.sleep(delay)
        outcome = await begin(dedup)
        received[name] = (type(outcome).__name__, await collect(events_of(outcome)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream)
        for name, delay in [("early", 0.5), ("middle", 3.5), ("late", 5.5)]:
            nursery.start_soon(follow, name, delay)
        received["leader"] = ("Leader", await collect(own))
    expected = b"".join(f"data: token{i}\n\n".encode() for i in range(6))
    assert {name: kind for name, (kind, _) in received.items()} == {
        "leader": "Leader",
        "early": "Follower",
        "middle": "Follower",
        "late": "Follower",
    }
    for name, (_, events) in received.items():
        assert body_of(events) == expected, name
        assert events[-1] == core.END and events[0].streamed
        assert (REPLAYED in events[0].headers) == (name != "leader")


async def test_leader_cancellation_releases_the_key_and_fails_followers(autojump_clock):
    dedup, _, metrics = make()
    leader = (await begin(dedup)).handle
    follower = await begin(dedup)
    with trio.move_on_after(5):  # the request's deadline passes mid-stream
        async with leader:
            leader.record_head(200, [], streamed=True)
            leader.record_chunk(b"partial")
            await trio.sleep_forever()
    assert leader.finished
    events = await collect(follower.events)
    assert events[1:-1] == [core.Chunk(b"partial")]
    assert isinstance(events[-1], core.Failed) and "cancelled" in events[-1].message
    assert isinstance(await begin(dedup), Leader), "a retry after a failure must execute again"
    assert sample(metrics, "dedup_finishes_total", verdict="failed") == 1


@pytest.mark.parametrize(
    "status,ok,stored",
    [
        (200, True, True),
        (400, True, True),
        (404, True, True),
        (429, True, False),
        (500, True, False),
        (503, True, False),
        (200, False, False),
    ],
)
async def test_only_successes_and_deterministic_client_errors_are_replayed(status, ok, stored):
    dedup, _, _ = make()
    leader = (await begin(dedup)).handle
    follower = await begin(dedup)
    leader.record_head(status, [])
    leader.record_chunk(b"body")
    await leader.finish(ok, Reason.UPSTREAM_TIMEOUT, "upstream took too long")
    events = await collect(follower.events)
    assert events[0].status == status and body_of(events) == b"body"  # followers see what the leader saw
    if ok:
        assert events[-1] == core.END
    else:
        assert events[-1] == core.Failed(Reason.UPSTREAM_TIMEOUT, "upstream took too long")
        assert failure_answer(events[-1])[0] == 504
    again = await begin(dedup)
    assert isinstance(again, Replay if stored else Leader)


async def test_failure_before_any_byte_gives_followers_the_leaders_reason():
    dedup, _, _ = make()
    leader = (await begin(dedup)).handle
    follower = await begin(dedup)
    await leader.finish(False, Reason.UPSTREAM_UNAVAILABLE, "connect refused")
    [failed] = await collect(follower.events)
    status, headers, body = failure_answer(failed)
    assert status == 502 and (b"x-rampmeter-reason", b"upstream_unavailable") in headers and b"connect refused" in body


async def test_reused_key_with_another_body_is_422_and_conflict_mode_is_409():
    dedup, _, _ = make(on_in_flight="conflict")
    leader = (await begin(dedup)).handle
    mismatch = await begin(dedup, body=b'{"other": 1}')
    conflict = await begin(dedup)
    assert isinstance(mismatch, Mismatch) and isinstance(conflict, InFlightConflict)
    status, headers, _ = answer(mismatch)
    assert status == 422 and (b"x-rampmeter-reason", b"idempotency_key_reused") in headers
    status, headers, _ = answer(conflict)
    assert status == 409 and (b"retry-after", b"1") in headers
    leader.record_head(200, [])
    await leader.finish(True)
    assert isinstance(await begin(dedup, body=b'{"other": 1}'), Mismatch)  # also against the stored one


async def test_over_the_size_cap_responses_are_coalesced_but_not_replayed():
    dedup, _, metrics = make(max_entry_bytes=100)
    leader = (await begin(dedup)).handle
    early = await begin(dedup)
    leader.record_head(200, [])
    leader.record_chunk(b"a" * 60)
    middle = await begin(dedup)
    leader.record_chunk(b"b" * 60)  # now over the cap: the start is no longer kept
    late = await begin(dedup)
    await leader.finish(True)
    assert body_of(await collect(early.events)) == body_of(await collect(middle.events)) == b"a" * 60 + b"b" * 60
    assert isinstance(late, InFlightConflict)
    assert isinstance(await begin(dedup), Leader)
    assert sample(metrics, "dedup_finishes_total", verdict="too_large") == 1


async def test_leader_keeps_recording_when_its_own_client_is_gone(autojump_clock):
    dedup, _, _ = make()
    leader = (await begin(dedup)).handle
    own = leader.subscribe()
    own.close()  # the client disconnected; continue_on_disconnect keeps the exchange going
    leader.record_head(200, [])
    for i in range(3):
        await trio.sleep(1)
        leader.record_chunk(b"%d" % i)
    retry = await begin(dedup)  # the client's retry attaches to the running work
    leader.record_chunk(b"3")
    await leader.finish(True)
    assert body_of(await collect(events_of(retry))) == b"0123"
    assert await collect(own) == []


async def test_finish_is_exactly_once():
    dedup, _, _ = make()
    leader = (await begin(dedup)).handle
    async with leader:
        leader.record_head(200, [])
        await leader.finish(True)
    with pytest.raises(core.DedupStateError):
        await leader.finish(True)
    with pytest.raises(core.DedupStateError):
        leader.record_chunk(b"late")


class SlowStore(MemoryStore):
    """complete() takes virtual time, so a cancel can land in the middle of it."""

    in_process = False  # it suspends, like Redis

    async def complete(self, *args):
        await trio.sleep(0.1)
        return await super().complete(*args)


async def test_finish_writes_the_store_even_when_the_caller_is_cancelled(autojump_clock):
    policy = DedupPolicy()
    dedup = Deduplicator(policy, SlowStore(policy.max_memory_bytes))
    leader = (await begin(dedup)).handle
    leader.record_head(200, [])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(leader.finish, True)
        await trio.sleep(0.05)
        nursery.cancel_scope.cancel()  # lands in the middle of the store write
    assert trio.current_time() == pytest.approx(0.1)  # the shield let the write finish first
    assert isinstance(await begin(dedup), Replay)


async def test_identify_scopes_keys_by_tenant_and_validates_them():
    dedup, _, _ = make()
    assert dedup.identify(b"POST", b"/v1/x", [(b"authorization", b"Bearer a")], b"") is None
    with pytest.raises(HeaderError) as err:
        dedup.identify(b"POST", b"/v1/x", [(b"idempotency-key", b"\x01bad")], b"")
    assert err.value.header == "idempotency-key"
    a = dedup.identify(b"POST", b"/v1/x", [(b"idempotency-key", b"k"), (b"authorization", b"Bearer a")], b"")
    b = dedup.identify(b"POST", b"/v1/x", [(b"idempotency-key", b"k"), (b"authorization", b"Bearer b")], b"")
    spoof = dedup.identify(
        b"POST", b"/v1/x", [(b"idempotency-key", b"k"), (b"authorization", b"Bearer b"), (b"x-tenant", b"a")], b""
    )
    assert a.scope != b.scope and spoof.scope == b.scope  # x-tenant is not trusted by default
    other_path = dedup.identify(b"POST", b"/v1/y", [(b"idempotency-key", b"k"), (b"authorization", b"Bearer a")], b"")
    assert other_path.scope != a.scope
    trusting, _, _ = make(trust_tenant_header=True, fingerprint_headers=["x-model"])
    t1 = trusting.identify(
        b"POST", b"/v1/x", [(b"idempotency-key", b"k"), (b"x-tenant", b"acme"), (b"x-model", b"m1")], b""
    )
    t2 = trusting.identify(
        b"POST", b"/v1/x", [(b"idempotency-key", b"k"), (b"x-tenant", b"acme"), (b"x-model", b"m2")], b""
    )
    assert t1.scope == t2.scope and t1.fingerprint != t2.fingerprint
    off, _, _ = make(enabled=False)
    assert off.identify(b"POST", b"/v1/x", KEY, b"") is None


async def test_statistics_and_repr_describe_the_state():
    dedup, _, _ = make()
    leader = (await begin(dedup)).handle
    await begin(dedup)
    stats = dedup.statistics()
    assert stats["in_flight"] == 1 and stats["followers"] == 1 and stats["decisions"]["follow"] == 1
    assert "in_flight=1" in repr(dedup) and "live" in repr(leader)
    assert "order-42" not in repr(dedup) + repr(leader) + str(stats)  # raw keys never shown
    await leader.finish(False)


async def test_a_follower_whose_client_leaves_is_detached(autojump_clock):
    dedup, _, _ = make()
    leader = (await begin(dedup)).handle
    follower = await begin(dedup)
    leader.record_head(200, [], streamed=True)
    with trio.move_on_after(1):  # the follower's client disconnects while waiting
        with follower.events as events:
            async for _ in events:
                pass
    assert dedup.statistics()["followers"] == 0
    leader.record_chunk(b"more")  # nothing queues up for the departed reader
    await leader.finish(True)
    assert await collect(follower.events) == []


class DownStore(MemoryStore):
    """claim() waits, then finds its backend gone: duplicates sent together all see the outage."""

    in_process = False

    async def claim(self, *args):
        await trio.sleep(0.01)
        raise StoreUnavailable("redis: connection refused")


async def test_duplicates_arriving_together_coalesce_locally_while_the_store_is_down(autojump_clock):
    # Found end to end (tests/integration/test_dedup_e2e.py): every failed claim made its own
    # degraded leader, so under fail_open N duplicates sent together ran N times on one replica.
    policy = DedupPolicy(store="redis")
    dedup = Deduplicator(policy, DownStore(policy.max_memory_bytes))
    outcomes = []

    async def arrive():
        outcomes.append(await begin(dedup))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(arrive)
    leaders = [o for o in outcomes if isinstance(o, Leader)]
    followers = [o for o in outcomes if isinstance(o, Follower)]
    assert len(leaders) == 1 and leaders[0].handle.degraded
    assert len(followers) == 2 and not any(f.remote for f in followers)
    leaders[0].handle.record_head(200, [])
    leaders[0].handle.record_chunk(b"once")
    await leaders[0].handle.finish(True)
    for follower in followers:
        assert body_of(await collect(follower.events)) == b"once"
