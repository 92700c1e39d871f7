"""Defect 14: the dedup memory cap counts the memory kept responses really hold.

Before the fix the cap summed response bytes (body and headers), while each kept
response is a tree of Python objects: 14.4 MB counted was 29 MB of RSS in the attack
pass. Here responses go through the real recording path (a leader's head, then one
chunk per SSE event, as the relay writes them) into the memory store, and into the
replay cache kept in front of Redis, and what the store says it holds
(`statistics()["bytes"]`, the figure the cap and `rampmeter_dedup_stored_bytes` use)
is compared with what tracemalloc saw allocated and kept: within 15%, never under by
more than 10%. A filled store then stays under its cap in those real terms.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest
import trio

from proxy.core import dedup as core
from proxy.policy.dedup import Dedup as DedupPolicy
from proxy.runtime.dedup import Deduplicator, Leader, MemoryStore
from proxy.runtime.dedup.coalesce import Recording
from proxy.runtime.dedup.replay_cache import ReplayCache

N = 1500
JSON_HEADERS = [(b"content-type", b"application/json"), (b"date", b"Mon, 01 Jan 2024 00:00:00 GMT"), (b"server", b"x")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def response(i: int, shape: str) -> tuple[list[tuple[bytes, bytes]], list[bytes], bool]:
    """(headers, chunks, streamed): fresh objects per response, as an HTTP/1.1 upstream's parser makes them."""
    rid = b"x-request-id", b"%032x" % i
    if shape == "json":
        body = b'{"id":"chatcmpl-%08d","choices":[{"message":{"content":"%s"}}],"usage":{}}' % (i, b"w" * 300)
        return [*[(_copy(k), _copy(v)) for k, v in JSON_HEADERS], rid], [body], False
    chunks = [b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % j for j in range(48)]
    return [*[(_copy(k), _copy(v)) for k, v in SSE_HEADERS], rid], [*chunks, b"data: [DONE]\n\n"], True


def _copy(b: bytes) -> bytes:
    return bytes(bytearray(b))  # bytes(b) would return `b` itself


def held(measure) -> tuple[int, int]:
    """(bytes tracemalloc saw allocated and kept by `measure()`, what it returns the store counts)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        counted = measure()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, counted
    finally:
        tracemalloc.stop()


def assert_honest(real: int, counted: int) -> None:
    assert counted >= 0.9 * real, f"counted {counted} bytes for {real} really held ({real / counted:.2f}x)"
    assert counted <= 1.15 * real, f"counted {counted} bytes for {real} really held (over by {counted / real:.2f}x)"


@pytest.mark.parametrize("shape", ["json", "sse"])
def test_the_memory_store_counts_what_it_holds(shape):
    async def fill() -> int:
        dedup = Deduplicator(DedupPolicy(max_memory_bytes=1 << 40), MemoryStore(1 << 40))
        for i in range(N):
            headers = [(b"idempotency-key", b"key-%d" % i), (b"authorization", b"Bearer tenant")]
            ident = dedup.identify(b"POST", b"/v1/chat/completions", headers, b'{"n": %d}' % i)
            leader = await dedup.begin(ident.scope, ident.fingerprint)
            assert isinstance(leader, Leader)
            head, chunks, streamed = response(i, shape)
            leader.handle.record_head(200, head, streamed=streamed)
            for chunk in chunks:
                leader.handle.record_chunk(chunk)
            assert await leader.handle.finish(True) is core.Verdict.STORED
        assert dedup.statistics()["store"]["responses"] == N
        kept.append(dedup)  # measured while alive
        return dedup.statistics()["store"]["bytes"]

    kept: list[Deduplicator] = []
    real, counted = held(lambda: trio.run(fill))
    assert_honest(real, counted)


@pytest.mark.parametrize("shape", ["json", "sse"])
def test_the_replay_cache_counts_what_it_holds(shape):
    cache = ReplayCache(1 << 40, clock=lambda: 0.0)

    def fill() -> int:
        for i in range(N):
            recording = Recording(f"{i:064x}", f"{i * 7919:032x}", "", 1 << 20)
            head, chunks, streamed = response(i, shape)
            recording.record_head(200, head, streamed)
            for chunk in chunks:
                recording.record_chunk(chunk)
            recording.end()
            record = core.Record(core.State.COMPLETE, recording.fingerprint, "", recording.stored())
            assert cache.put(recording.scope, record, 60.0)
        return cache.statistics()["bytes"]

    real, counted = held(fill)
    assert len(cache) == N
    assert_honest(real, counted)


def test_a_full_store_stays_under_its_cap_in_real_memory():
    cap = 1_000_000
    store = MemoryStore(cap)

    async def fill() -> int:
        for i in range(3 * N):
            scope, token = f"{i:064x}", f"{i:032x}"
            head, chunks, streamed = response(i, "sse")
            await store.claim(scope, "fp", token, 10_000)
            await store.complete(scope, token, "fp", core.Stored("fp", 200, head, chunks, streamed), 60.0)
        return store.statistics()["bytes"]

    real, counted = held(lambda: trio.run(fill))
    assert counted <= cap and store.statistics()["responses"] < 3 * N  # it evicted
    assert real <= 1.1 * cap, f"{real} bytes really held under a {cap} byte cap"
