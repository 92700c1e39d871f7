"""HTTP/1.1 upstream pool and connection against a raw trio+h11 server on loopback.

The server runs in the test's trio run, so "the server saw X" is exact; no test
waits on wall time (the idle-expiry test uses the autojump clock).
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from proxy.errors import UpstreamConnectError, UpstreamProtocolError
from proxy.http.pool import UpstreamPool
from proxy.http.upstream_h1 import H1UpstreamConnection
from proxy.metrics import Metrics
from proxy.policy.schema import Upstream
from tests.conftest import free_port
from tests.runtime.raw_servers import H1Exchange, RawH1Server

HOST = [(b"host", b"upstream.test")]
TEN_MB = 10 * 1024 * 1024


async def ok(ex: H1Exchange) -> None:
    await ex.respond(200, b"ok")


@asynccontextmanager
async def h1_upstream(handler=ok, *, metrics=None, path="", **upstream):
    with trio.fail_after(30):
        server = RawH1Server(handler)
        async with server.running():
            cfg = Upstream(url=f"http://127.0.0.1:{server.port}{path}", **upstream)
            async with UpstreamPool([cfg], metrics=metrics) as pool:
                yield server, pool


async def get(pool: UpstreamPool, target=b"/", body=b"", method=b"GET") -> tuple[int, bytes]:
    async with pool.request(0, method, target, HOST, body) as resp:
        return resp.status, await resp.read()


async def test_keep_alive_connection_serves_many_requests():
    async with h1_upstream() as (server, pool):
        for _ in range(20):
            assert await get(pool) == (200, b"ok")
        assert server.connections == 1
        assert len(server.requests) == 20
        stats = pool.statistics()[0]
        assert (stats.open_connections, stats.idle_connections, stats.outstanding) == (1, 1, 0)


async def test_bare_connection_reuses_itself_via_start_next_cycle():
    server = RawH1Server(ok)
    with trio.fail_after(30):
        async with server.running():
            conn = await H1UpstreamConnection.open("127.0.0.1", server.port)
            for _ in range(3):
                async with await conn.send_request(b"GET", b"/", HOST) as resp:
                    assert await resp.read() == b"ok"
                assert not conn.is_stale()
            conn.close()
            assert server.connections == 1 and len(server.requests) == 3


async def test_pool_bound_makes_extra_callers_wait():
    gate = trio.Event()

    async def gated(ex: H1Exchange) -> None:
        await gate.wait()
        await ex.respond(200, b"ok")

    results = []

    async def one(pool: UpstreamPool) -> None:
        results.append(await get(pool))

    async with h1_upstream(gated, max_connections=2) as (server, pool):
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(one, pool)
            await trio.testing.wait_all_tasks_blocked()
            stats = pool.statistics()[0]
            assert server.connections == 2
            assert (stats.open_connections, stats.waiting, stats.outstanding) == (2, 3, 5)
            gate.set()
        assert results == [(200, b"ok")] * 5
        assert server.connections == 2


async def test_idle_connections_close_after_idle_timeout(autojump_clock):
    async with h1_upstream(idle_timeout_s=4.0) as (server, pool):
        await get(pool)
        await trio.sleep(3.9)
        assert pool.statistics()[0].open_connections == 1
        await trio.sleep(0.2)
        assert pool.statistics()[0].open_connections == 0
        await trio.testing.wait_all_tasks_blocked()
        assert server.client_closes == 1  # the upstream saw the close


async def test_connection_closed_while_idle_is_not_reused():
    async def close_after(ex: H1Exchange) -> None:
        await ex.respond(200, b"ok")
        ex.close_after = True  # FIN with no `connection: close`: the idle race

    async with h1_upstream(close_after) as (server, pool):
        await get(pool)
        await server.closed_by_us.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert await get(pool) == (200, b"ok")
        assert server.connections == 2 and len(server.requests) == 2


async def test_send_failing_before_any_byte_is_retried_once_on_a_fresh_connection(monkeypatch):
    read = trio.Event()

    async def reset_after_read(ex: H1Exchange) -> None:
        await ex.respond(200, b"ok")
        if len(ex.server.requests) == 1:
            await read.wait()
            ex.reset()  # RST: the next send on that socket fails with nothing accepted

    async with h1_upstream(reset_after_read) as (server, pool):
        await get(pool)
        read.set()
        await server.closed_by_us.wait()
        await trio.testing.wait_all_tasks_blocked()
        monkeypatch.setattr(H1UpstreamConnection, "is_stale", lambda self: False)  # lose the pre-send check
        assert await get(pool, body=b"payload", method=b"POST") == (200, b"ok")
        assert server.connections == 2 and len(server.requests) == 2


async def test_request_that_reached_the_upstream_is_never_retried():
    async def drop_second(ex: H1Exchange) -> None:
        if len(ex.server.requests) == 2:
            ex.close_after = True  # read the request, close without answering
            return
        await ex.respond(200, b"ok")

    async with h1_upstream(drop_second) as (server, pool):
        await get(pool)
        with pytest.raises(UpstreamProtocolError) as info:
            await get(pool, body=b"payload", method=b"POST")
        assert info.value.request_sent is True
        assert info.value.upstream == "0"
        assert server.connections == 1 and len(server.requests) == 2
        assert pool.statistics()[0].outstanding == 0


async def test_undetected_stale_connection_after_send_is_not_retried(monkeypatch):
    async def close_after(ex: H1Exchange) -> None:
        await ex.respond(200, b"ok")
        ex.close_after = True

    async with h1_upstream(close_after) as (server, pool):
        await get(pool)
        await server.closed_by_us.wait()
        await trio.testing.wait_all_tasks_blocked()
        monkeypatch.setattr(H1UpstreamConnection, "is_stale", lambda self: False)
        with pytest.raises(UpstreamProtocolError) as info:
            await get(pool, body=b"x", method=b"POST")
        assert info.value.request_sent is True  # the kernel took the bytes: it may have run
        assert server.connections == 1


async def test_streamed_chunks_arrive_before_the_response_ends():
    proceed = trio.Event()

    async def sse(ex: H1Exchange) -> None:
        await ex.start(200, [(b"content-type", b"text/event-stream")])
        await ex.send(b"data: one\n\n")
        await proceed.wait()  # the rest exists only after the client saw the first chunk
        await ex.send(b"data: two\n\n")
        await ex.end()

    async with h1_upstream(sse) as (_server, pool):
        async with pool.request(0, b"GET", b"/events", HOST) as resp:
            assert resp.status == 200
            assert await resp.receive() == b"data: one\n\n"
            proceed.set()
            assert await resp.receive() == b"data: two\n\n"
            assert await resp.receive() == b""
        assert pool.statistics()[0].idle_connections == 1  # chunked end: reusable


async def test_ten_megabytes_each_way():
    async def reverse(ex: H1Exchange) -> None:
        await ex.respond(200, ex.body[::-1])

    payload = bytes(range(256)) * (TEN_MB // 256)
    async with h1_upstream(reverse) as (server, pool):
        assert await get(pool, body=payload, method=b"POST") == (200, payload[::-1])

        async def pieces():
            for i in range(0, len(payload), 1 << 20):
                yield payload[i : i + (1 << 20)]

        async with pool.request(0, b"PUT", b"/", HOST, pieces()) as resp:
            assert await resp.read() == payload[::-1]
        assert (b"transfer-encoding", b"chunked") in list(server.requests[-1].headers)
        assert server.connections == 1


async def test_cancellation_mid_response_closes_the_connection():
    async def slow(ex: H1Exchange) -> None:
        await ex.start(200)
        await ex.send(b"first")
        await ex.wait_client_gone()

    registry = CollectorRegistry()
    async with h1_upstream(slow, metrics=Metrics(registry)) as (server, pool):
        with trio.CancelScope() as scope:
            async with pool.request(0, b"GET", b"/", HOST) as resp:
                assert await resp.receive() == b"first"
                scope.cancel()
                await resp.receive()
        await server.client_gone.wait()  # the upstream saw it at once
        stats = pool.statistics()[0]
        assert (stats.open_connections, stats.outstanding) == (0, 0)
        assert (
            registry.get_sample_value("rampmeter_upstream_requests_total", {"upstream": "0", "outcome": "aborted"}) == 1
        )
        assert registry.get_sample_value("rampmeter_upstream_connections", {"upstream": "0"}) == 0


async def test_connect_refused_raises_connect_error():
    registry = CollectorRegistry()
    cfg = Upstream(url=f"http://127.0.0.1:{free_port()}")
    with trio.fail_after(30):
        async with UpstreamPool([cfg], metrics=Metrics(registry)) as pool:
            with pytest.raises(UpstreamConnectError) as info:
                await get(pool)
            assert info.value.request_sent is False and info.value.upstream == "0"
            assert pool.statistics()[0].outstanding == 0
    assert (
        registry.get_sample_value("rampmeter_upstream_requests_total", {"upstream": "0", "outcome": "connect_error"})
        == 1
    )


async def test_close_delimited_response_streams_to_eof_and_is_not_reused():
    async def raw(ex: H1Exchange) -> None:
        await ex.stream.send_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nhello ")
        await ex.stream.send_all(b"world")
        ex.close_after = True

    async with h1_upstream(raw) as (_server, pool):
        assert await get(pool) == (200, b"hello world")
        assert pool.statistics()[0].open_connections == 0


async def test_garbage_response_is_a_protocol_error():
    async def garbage(ex: H1Exchange) -> None:
        await ex.stream.send_all(b"SPDY/9 what\r\n\r\n")
        ex.close_after = True

    registry = CollectorRegistry()
    async with h1_upstream(garbage, metrics=Metrics(registry)) as (_server, pool):
        with pytest.raises(UpstreamProtocolError):
            await get(pool)
        assert pool.statistics()[0].open_connections == 0
    assert (
        registry.get_sample_value("rampmeter_upstream_requests_total", {"upstream": "0", "outcome": "protocol_error"})
        == 1
    )


async def test_url_prefix_is_prepended_and_framing_follows_the_body():
    async with h1_upstream(path="/base/") as (server, pool):
        await get(pool, b"/v1/chat?x=1", b"{}", b"POST")
        request = server.requests[-1]
        assert request.target == b"/base/v1/chat?x=1"
        assert (b"content-length", b"2") in list(request.headers)


async def test_unread_but_fully_buffered_body_keeps_the_connection():
    async with h1_upstream() as (server, pool):
        async with pool.request(0, b"GET", b"/", HOST) as resp:
            assert resp.status == 200
            # head and "ok" came in one segment; the caller never reads the body
        assert pool.statistics()[0].idle_connections == 1
        assert await get(pool) == (200, b"ok")
        assert server.connections == 1
