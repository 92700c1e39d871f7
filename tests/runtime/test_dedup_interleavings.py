"""Hypothesis over arrival orders and leader outcomes, run on the real engine and store
(virtual time): per key at most one leader runs at a time, every follower gets exactly
one terminal event, followers see exactly their leader's bytes, and only storable
successes are replayed."""

from __future__ import annotations

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core import dedup as core
from proxy.policy.dedup import Dedup as DedupPolicy
from proxy.runtime.dedup import (
    Deduplicator,
    Follower,
    InFlightConflict,
    Leader,
    MemoryStore,
    Mismatch,
    Replay,
    events_of,
)

request = st.tuples(
    st.integers(0, 8),  # arrival, in virtual seconds
    st.sampled_from([b"k0", b"k1"]),
    st.sampled_from([b"body-a", b"body-b"]),
    st.sampled_from(["ok200", "ok400", "ok503", "fail", "cancel"]),  # how it ends if it leads
    st.integers(0, 3),  # chunks
)


async def scenario(requests, on_in_flight):
    policy = DedupPolicy(on_in_flight=on_in_flight, ttl_s=5, lease_ms=100_000)
    dedup = Deduplicator(policy, MemoryStore(policy.max_memory_bytes))
    running: dict[bytes, int] = {}  # key -> the leader running now
    leaders: dict[int, tuple[bytes, str, bytes]] = {}  # id -> (fp body, verdict, full body)
    seen: list[tuple[int, str, list, bytes]] = []

    async def one(i, at, key, body, ending, chunks):
        await trio.sleep(at)
        ident = dedup.identify(b"POST", b"/v1/x", [(b"idempotency-key", key)], body)
        outcome = await dedup.begin(ident.scope, ident.fingerprint)
        if isinstance(outcome, Leader):
            assert key not in running, f"two leaders for {key!r}"
            running[key] = i
            sent = b"".join(b"%d:%d;" % (i, n) for n in range(chunks))
            leaders[i] = (body, "running", sent)
            handle = outcome.handle
            try:
                with trio.move_on_after(0.5 + chunks if ending == "cancel" else float("inf")):
                    async with handle:
                        handle.record_head(
                            int(ending[2:]) if ending.startswith("ok") else 200, [(b"x-leader", b"%d" % i)]
                        )
                        for n in range(chunks):
                            await trio.sleep(1)
                            handle.record_chunk(b"%d:%d;" % (i, n))
                        if ending == "cancel":
                            await trio.sleep_forever()
                        verdict = await handle.finish(ending != "fail")
                        leaders[i] = (body, verdict.value, sent)
            finally:
                del running[key]
                if leaders[i][1] == "running":
                    leaders[i] = (body, "failed", sent)
        elif isinstance(outcome, Follower | Replay):
            seen.append((i, type(outcome).__name__, await _collect(events_of(outcome)), body))
        else:
            assert isinstance(outcome, Mismatch | InFlightConflict)

    async with trio.open_nursery() as nursery:
        for i, req in enumerate(requests):
            nursery.start_soon(one, i, *req)

    for i, kind, events, body in seen:
        terminals = [e for e in events if isinstance(e, core.End | core.Failed)]
        assert len(terminals) == 1 and events[-1] is terminals[0], f"request {i}: {events}"
        if not isinstance(events[0], core.Head):
            continue  # the leader failed before its head
        leader = int(dict(events[0].headers)[b"x-leader"])
        fp_body, verdict, sent = leaders[leader]
        assert fp_body == body, "followed or replayed another payload's response"
        got = b"".join(e.data for e in events if isinstance(e, core.Chunk))
        if isinstance(terminals[0], core.End):
            assert got == sent, "a follower's bytes differ from its leader's"
            assert verdict != "failed"
        else:
            assert sent.startswith(got) and verdict == "failed"
        if kind == "Replay":
            assert verdict == "stored" and core.is_storable(events[0].status)


async def _collect(events):
    return [e async for e in events]


@settings(max_examples=60, deadline=None)
@given(st.lists(request, min_size=1, max_size=8), st.sampled_from(["coalesce", "conflict"]))
def test_interleavings_keep_the_dedup_invariants(requests, on_in_flight):
    trio.run(scenario, requests, on_in_flight, clock=trio.testing.MockClock(autojump_threshold=0))
