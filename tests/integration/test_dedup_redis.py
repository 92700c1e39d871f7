"""Deduplicator across replicas on a real redis-server (loopback): two engines = two replicas.

The `redis_server` fixture is in tests/integration/conftest.py (shared with test_dedup_e2e.py).
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio

from proxy.core import dedup as core
from proxy.core.wire import Reason
from proxy.metrics import Metrics
from proxy.policy.dedup import Dedup as DedupPolicy
from proxy.runtime.dedup import Deduplicator, Follower, Leader, Replay, StoreDown, answer, build_store
from tests.runtime.test_dedup_engine import following

pytestmark = pytest.mark.integration

AUTH_A = [(b"idempotency-key", b"job-7"), (b"authorization", b"Bearer tenant-a")]
AUTH_B = [(b"idempotency-key", b"job-7"), (b"authorization", b"Bearer tenant-b")]


@asynccontextmanager
async def replica(url: str, **overrides):
    # A claim slower than store_timeout_ms fails open (the replica leads locally): 200 ms let a
    # loaded CI runner's stall turn the remote follower into a second leader (seen once in CI).
    # As long as the lease allows (lease_ms >= 4 x store_timeout_ms, the policy's own rule).
    lease_ms = overrides.get("lease_ms", 10_000)
    policy = DedupPolicy(store="redis", redis_url=url, store_timeout_ms=min(2000, lease_ms // 4), **overrides)
    metrics = Metrics()
    dedup = Deduplicator(policy, build_store(policy, metrics), metrics)
    async with trio.open_nursery() as nursery:
        await nursery.start(dedup.run)
        yield dedup, metrics, nursery.cancel_scope
        nursery.cancel_scope.cancel()


async def begin(dedup, headers=AUTH_A, body=b'{"prompt": "hi"}'):
    ident = dedup.identify(b"POST", b"/v1/completions", headers, body)
    return await dedup.begin(ident.scope, ident.fingerprint)


async def collect(events):
    return [e async for e in events]


def sample(metrics, name, **labels):
    return metrics.registry.get_sample_value(f"rampmeter_{name}", labels) or 0


async def test_one_leader_the_other_replica_follows_and_gets_the_stream(redis_server):
    with trio.fail_after(15):
        async with replica(redis_server.url) as (a, _, _), replica(redis_server.url) as (b, mb, _):
            leader = await begin(a)
            follower = await begin(b)
            assert isinstance(leader, Leader) and isinstance(follower, Follower) and follower.remote
            async with following(follower) as got:
                leader.handle.record_head(200, [(b"content-type", b"text/event-stream")], streamed=True)
                for token in (b"data: a\n\n", b"data: b\n\n", b"data: [DONE]\n\n"):
                    leader.handle.record_chunk(token)
                assert await leader.handle.finish(True) is core.Verdict.STORED
            # Across replicas the chunk sequence arrives after completion, framing intact.
            assert got[0].streamed and (b"idempotent-replayed", b"true") in got[0].headers
            assert [e.data for e in got[1:-1]] == [b"data: a\n\n", b"data: b\n\n", b"data: [DONE]\n\n"]
            assert got[-1] == core.END
            for dedup in (a, b):
                assert isinstance(await begin(dedup), Replay)
            assert sample(mb, "dedup_decisions_total", decision="follow_remote") == 1
            # b remembered the record its follow read: its replay needed no second claim.
            assert sample(mb, "dedup_store_duration_seconds_count", op="claim") == 1
            assert sample(mb, "dedup_replay_cache_hits_total") == 1
            assert b.statistics()["store"]["watched"] == 0  # the follower unsubscribed


async def test_a_remote_follower_gets_the_leaders_failure_and_the_key_is_released(redis_server):
    with trio.fail_after(15):
        async with replica(redis_server.url) as (a, _, _), replica(redis_server.url) as (b, _, _):
            leader = await begin(a)
            follower = await begin(b)
            async with following(follower) as got:
                await leader.handle.finish(False, Reason.UPSTREAM_TIMEOUT)
            assert [type(e) for e in got] == [core.Failed] and got[0].reason is Reason.UPSTREAM_TIMEOUT
            assert isinstance(await begin(b), Leader)


async def test_a_crashed_replicas_claim_lapses_after_its_lease(redis_server):
    with trio.fail_after(15):
        async with replica(redis_server.url, lease_ms=800) as (b, _, _):
            async with replica(redis_server.url, lease_ms=800) as (a, _, crash):
                assert isinstance(await begin(a), Leader)
                crash.cancel()  # replica a dies holding the claim: no finish, no refresh
            follower = await begin(b)
            assert isinstance(follower, Follower) and follower.remote
            [failed] = await collect(follower.events)
            assert failed.reason is Reason.UPSTREAM_UNAVAILABLE
            assert isinstance(await begin(b), Leader)


async def test_a_live_leader_refreshes_its_lease(redis_server):
    with trio.fail_after(15):
        async with (
            replica(redis_server.url, lease_ms=800) as (a, _, _),
            replica(redis_server.url, lease_ms=800) as (b, _, _),
        ):
            leader = (await begin(a)).handle
            await trio.sleep(2.0)  # two and a half leases
            follower = await begin(b)
            assert isinstance(follower, Follower)
            leader.record_head(201, [])
            leader.record_chunk(b"done")
            await leader.finish(True)
            events = await collect(follower.events)
            assert events[0].status == 201 and events[-1] == core.END


async def test_tenants_never_see_each_others_responses(redis_server):
    with trio.fail_after(15):
        async with replica(redis_server.url) as (a, _, _), replica(redis_server.url) as (b, _, _):
            leader = (await begin(a, AUTH_A)).handle
            other = await begin(b, AUTH_B)  # same key, other tenant: its own execution
            assert isinstance(other, Leader)
            leader.record_head(200, [])
            leader.record_chunk(b"tenant a's answer")
            await leader.finish(True)
            await other.handle.finish(False)
            assert isinstance(await begin(b, AUTH_B), Leader)
            replay = await begin(b, AUTH_A)
            assert isinstance(replay, Replay) and replay.stored.chunks == [b"tenant a's answer"]


async def test_redis_killed_under_fail_open_serves_then_recovers(redis_server):
    with trio.fail_after(20):
        async with (
            replica(redis_server.url, on_store_error="fail_open", store_retry_ms=300) as (a, ma, _),
            replica(redis_server.url) as (b, _, _),
        ):
            redis_server.kill()
            degraded = await begin(a)
            assert isinstance(degraded, Leader) and degraded.handle.degraded
            local = await begin(a)  # coalesced on this replica all the same
            assert isinstance(local, Follower) and not local.remote
            degraded.handle.record_head(200, [])
            await degraded.handle.finish(True)
            assert (await collect(local.events))[-1] == core.END
            assert sample(ma, "dedup_store_errors_total", op="claim") >= 1
            assert sample(ma, "dedup_decisions_total", decision="fail_open") == 1
            retry = await begin(a)  # kept locally: a retry reaching this replica replays
            assert isinstance(retry, Replay) and retry.stored.status == 200
            redis_server.start()
            await trio.sleep(0.5)  # past store_retry_ms; pub/sub reconnects with backoff
            after = [(b"idempotency-key", b"job-8"), (b"authorization", b"Bearer tenant-a")]
            leader = await begin(a, after, body=b"after")
            assert isinstance(leader, Leader) and not leader.handle.degraded
            follower = await begin(b, after, body=b"after")
            assert isinstance(follower, Follower) and follower.remote
            async with following(follower) as got:
                leader.handle.record_head(200, [])
                await leader.handle.finish(True)
            assert got[-1] == core.END


async def test_redis_killed_under_fail_closed_answers_503(redis_server):
    with trio.fail_after(15):
        async with replica(redis_server.url, on_store_error="fail_closed") as (a, ma, _):
            assert isinstance(await begin(a), Leader)
            redis_server.kill()
            down = await begin(a, AUTH_B)
            assert isinstance(down, StoreDown) and answer(down)[0] == 503
            assert sample(ma, "dedup_decisions_total", decision="store_down") == 1


async def test_a_remote_follower_is_told_when_redis_dies_while_it_waits(redis_server):
    with trio.fail_after(15):
        async with replica(redis_server.url) as (a, _, _), replica(redis_server.url) as (b, _, _):
            await begin(a)
            follower = await begin(b)
            async with following(follower) as got:
                redis_server.kill()
            assert [e.reason for e in got] == [Reason.IDEMPOTENCY_STORE_UNAVAILABLE]
