"""h2c upstream pool and connection against a raw trio+h2 server on loopback."""

from __future__ import annotations

from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
import trio.testing
from h2.errors import ErrorCodes
from prometheus_client import CollectorRegistry

from proxy.errors import UpstreamConnectError, UpstreamProtocolError
from proxy.http.pool import UpstreamPool
from proxy.http.upstream_h2 import H2UpstreamConnection
from proxy.metrics import Metrics
from proxy.policy.schema import Upstream
from tests.conftest import free_port
from tests.runtime.raw_servers import H2Exchange, RawH2Server

HOST = [(b"host", b"upstream.test")]
TEN_MB = 10 * 1024 * 1024


async def ok(ex: H2Exchange) -> None:
    await ex.read_body()
    await ex.respond(200, b"ok")


@asynccontextmanager
async def h2_upstream(handler=ok, *, metrics=None, max_concurrent_streams=100, path="", **upstream):
    with trio.fail_after(30):
        server = RawH2Server(handler, max_concurrent_streams=max_concurrent_streams)
        async with server.running():
            cfg = Upstream(url=f"http://127.0.0.1:{server.port}{path}", protocol="h2c", **upstream)
            async with UpstreamPool([cfg], metrics=metrics) as pool:
                yield server, pool


async def get(pool: UpstreamPool, target=b"/", body=b"", method=b"GET") -> tuple[int, bytes]:
    async with pool.request(0, method, target, HOST, body) as resp:
        assert resp.http_version == "2"
        return resp.status, await resp.read()


def gated_handler(gate: trio.Event):
    async def handler(ex: H2Exchange) -> None:
        await ex.read_body()
        await gate.wait()
        await ex.respond(200, b"ok")

    return handler


async def run_concurrently(pool: UpstreamPool, n: int, nursery: trio.Nursery, results: list) -> None:
    async def one() -> None:
        results.append(await get(pool))

    for _ in range(n):
        nursery.start_soon(one)


async def test_streams_share_one_connection_and_pseudo_headers_come_from_host():
    gate = trio.Event()
    results: list = []
    async with h2_upstream(gated_handler(gate), path="/base") as (server, pool):
        async with trio.open_nursery() as nursery:
            await run_concurrently(pool, 10, nursery, results)
            await trio.testing.wait_all_tasks_blocked()
            assert server.max_active == 10 and pool.statistics()[0].streams == 10
            gate.set()
        assert results == [(200, b"ok")] * 10
        assert server.connections == 1
        headers = server.exchanges[0].headers
        assert (headers[b":authority"], headers[b":path"], headers[b":scheme"]) == (
            b"upstream.test",
            b"/base/",
            b"http",
        )
        assert b"host" not in headers


async def test_streams_beyond_the_peer_limit_wait_when_connections_are_capped():
    gate = trio.Event()
    results: list = []
    async with h2_upstream(gated_handler(gate), max_concurrent_streams=2, max_connections=1) as (server, pool):
        async with trio.open_nursery() as nursery:
            await run_concurrently(pool, 5, nursery, results)
            await trio.testing.wait_all_tasks_blocked()
            stats = pool.statistics()[0]
            assert (server.max_active, stats.streams, stats.waiting) == (2, 2, 3)
            gate.set()
        assert results == [(200, b"ok")] * 5
        assert server.connections == 1 and server.max_active == 2
        assert pool.statistics()[0].outstanding == 0


async def test_streams_beyond_the_peer_limit_open_another_connection():
    gate = trio.Event()
    results: list = []
    async with h2_upstream(gated_handler(gate), max_concurrent_streams=2, max_connections=3) as (server, pool):
        async with trio.open_nursery() as nursery:
            await run_concurrently(pool, 5, nursery, results)
            await trio.testing.wait_all_tasks_blocked()
            assert server.connections == 3 and pool.statistics()[0].open_connections == 3
            gate.set()
        assert results == [(200, b"ok")] * 5


async def test_goaway_sends_new_requests_to_a_new_connection_while_old_streams_finish():
    gate = trio.Event()

    async def handler(ex: H2Exchange) -> None:
        await ex.read_body()
        if ex.stream_id == 1 and ex.conn is ex.server.exchanges[0].conn:
            await gate.wait()
        await ex.respond(200, b"first" if ex is ex.server.exchanges[0] else b"later")

    async with h2_upstream(handler) as (server, pool):
        async with trio.open_nursery() as nursery:
            first: list = []

            async def slow() -> None:
                first.append(await get(pool))

            nursery.start_soon(slow)
            await trio.testing.wait_all_tasks_blocked()
            await server.exchanges[0].conn.goaway(last_stream_id=1)
            await trio.testing.wait_all_tasks_blocked()
            assert await get(pool) == (200, b"later")
            assert server.connections == 2
            gate.set()
        assert first == [(200, b"first")]  # the stream at or below last_stream_id finished
        await trio.testing.wait_all_tasks_blocked()
        assert server.closed_connections == 1  # the drained connection was closed by the client
        assert pool.statistics()[0].open_connections == 1


async def test_stream_above_goaway_last_stream_id_is_retried_on_a_new_connection():
    async def handler(ex: H2Exchange) -> None:
        await ex.read_body()
        if ex.conn is ex.server.exchanges[0].conn:
            if len(ex.server.exchanges) == 2:
                await ex.conn.goaway(last_stream_id=1)  # stream 3 was "not processed"
            await ex.reset_seen.wait()  # hold both; neither is answered on this connection
            return
        await ex.respond(200, b"retried")

    async with h2_upstream(handler) as (server, pool), trio.open_nursery() as nursery:
        nursery.start_soon(lambda: get(pool, body=b"one", method=b"POST"))  # stream 1: held
        await trio.testing.wait_all_tasks_blocked()
        assert await get(pool, body=b"two", method=b"POST") == (200, b"retried")
        assert server.connections == 2
        assert [bytes(ex.body) for ex in server.exchanges] == [b"one", b"two", b"two"]
        nursery.cancel_scope.cancel()


async def test_refused_stream_is_retried_once_and_other_resets_are_errors():
    async def handler(ex: H2Exchange) -> None:
        n = len(ex.server.exchanges)
        if n == 1:
            await ex.reset(ErrorCodes.REFUSED_STREAM)
        elif n == 3:
            await ex.reset(ErrorCodes.INTERNAL_ERROR)
        else:
            await ex.respond(200, b"ok")

    registry = CollectorRegistry()
    async with h2_upstream(handler, metrics=Metrics(registry)) as (server, pool):
        assert await get(pool, body=b"x", method=b"POST") == (200, b"ok")
        with pytest.raises(UpstreamProtocolError) as info:
            await get(pool, body=b"x", method=b"POST")
        assert info.value.request_sent is True and "INTERNAL_ERROR" in str(info.value)
        assert len(server.exchanges) == 3 and server.connections == 1
    assert registry.get_sample_value("rampmeter_upstream_requests_total", {"upstream": "0", "outcome": "ok"}) == 1
    assert (
        registry.get_sample_value("rampmeter_upstream_requests_total", {"upstream": "0", "outcome": "protocol_error"})
        == 1
    )


async def test_ten_megabytes_each_way_under_flow_control():
    async def reverse(ex: H2Exchange) -> None:
        body = await ex.read_body()
        await ex.respond(200, body[::-1])

    payload = bytes(range(256)) * (TEN_MB // 256)
    async with h2_upstream(reverse) as (server, pool):
        assert await get(pool, body=payload, method=b"POST") == (200, payload[::-1])

        async def pieces():
            for i in range(0, len(payload), 1 << 20):
                yield payload[i : i + (1 << 20)]

        async with pool.request(0, b"PUT", b"/", HOST, pieces()) as resp:
            assert await resp.read() == payload[::-1]
        assert server.connections == 1


async def test_streamed_chunks_arrive_before_the_stream_ends():
    proceed = trio.Event()

    async def sse(ex: H2Exchange) -> None:
        await ex.start(200, [(b"content-type", b"text/event-stream")])
        await ex.send(b"data: one\n\n")
        await proceed.wait()
        await ex.send(b"data: two\n\n", end=True)

    async with h2_upstream(sse) as (_server, pool), pool.request(0, b"GET", b"/events", HOST) as resp:
        assert await resp.receive() == b"data: one\n\n"
        proceed.set()
        assert await resp.receive() == b"data: two\n\n"
        assert await resp.receive() == b""


async def test_cancellation_mid_response_resets_the_stream_and_keeps_the_connection():
    async def slow(ex: H2Exchange) -> None:
        if len(ex.server.exchanges) > 1:
            return await ok(ex)
        await ex.start(200)
        await ex.send(b"first")
        await ex.reset_seen.wait()

    async with h2_upstream(slow) as (server, pool):
        with trio.CancelScope() as scope:
            async with pool.request(0, b"GET", b"/", HOST) as resp:
                assert await resp.receive() == b"first"
                scope.cancel()
                await resp.receive()
        with trio.fail_after(5):
            await server.exchanges[0].reset_seen.wait()
        assert server.exchanges[0].reset_code == ErrorCodes.CANCEL
        assert await get(pool) == (200, b"ok")
        assert server.connections == 1 and pool.statistics()[0].outstanding == 0


async def test_early_response_stops_the_upload():
    async def early(ex: H2Exchange) -> None:
        await ex.respond(413, b"too big")
        await ex.reset(ErrorCodes.NO_ERROR)  # RFC 9113 8.1: stop sending, the response stands

    async with h2_upstream(early) as (_server, pool):
        assert await get(pool, body=b"x" * TEN_MB, method=b"POST") == (413, b"too big")


async def test_connect_refused_and_non_h2_peer():
    cfg = Upstream(url=f"http://127.0.0.1:{free_port()}", protocol="h2c")
    with trio.fail_after(30):
        async with UpstreamPool([cfg]) as pool:
            with pytest.raises(UpstreamConnectError) as info:
                await get(pool)
            assert info.value.request_sent is False

        async def http1_only(stream: trio.SocketStream) -> None:
            await stream.receive_some(65536)
            await stream.send_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await stream.aclose()

        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, http1_only, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            async with UpstreamPool([Upstream(url=f"http://127.0.0.1:{port}", protocol="h2c")]) as pool:
                with pytest.raises(UpstreamProtocolError) as info:
                    await get(pool)
                assert info.value.request_sent is False
                assert pool.statistics()[0].open_connections == 0
            nursery.cancel_scope.cancel()


async def test_idle_h2_connection_closes_after_idle_timeout(autojump_clock):
    async with h2_upstream(idle_timeout_s=2.0) as (server, pool):
        await get(pool)
        await trio.sleep(1.9)
        assert pool.statistics()[0].open_connections == 1
        await trio.sleep(0.2)
        assert pool.statistics()[0].open_connections == 0
        await trio.testing.wait_all_tasks_blocked()
        assert server.closed_connections == 1


async def test_bare_connection_for_the_load_generator():
    server = RawH2Server(ok)
    with trio.fail_after(30):
        async with server.running():
            async with H2UpstreamConnection.connect("127.0.0.1", server.port) as conn:
                for _ in range(3):
                    async with await conn.send_request(b"GET", b"/", HOST) as resp:
                        assert (resp.status, await resp.read()) == (200, b"ok")
                assert conn.requests == 3 and conn.active_streams == 0
            assert server.connections == 1


async def test_request_frames_serialised_by_us_keep_h2s_state_and_prune_closed_streams():
    """upstream_h2 writes HEADERS/DATA itself (h2frames): h2's streams still close, get pruned
    (the map stays bounded over many requests), a HEAD's method is remembered, bodies arrive whole."""
    server = RawH2Server(ok)
    with trio.fail_after(30):
        async with server.running(), H2UpstreamConnection.connect("127.0.0.1", server.port) as conn:
            for i in range(300):
                body = b"b" * (i % 7) * 1000
                async with await conn.send_request(b"POST", b"/", HOST, body) as resp:
                    assert (resp.status, await resp.read()) == (200, b"ok")
            assert len(conn._h2.streams) <= 2 * conn.active_streams + 33  # pruned (_ClientState)
            async with await conn.send_request(b"HEAD", b"/", HOST) as resp:
                assert resp.status == 200
                state = conn._h2.streams[resp._s.id]
                assert state.request_method == b"HEAD" and state.state_machine.headers_sent


@pytest.mark.parametrize(
    "head",
    [
        [(b"X-Upper", b"1")],  # names are lower case (RFC 9113 8.2)
        [(b"x-split", b"a\r\nset-cookie: evil")],  # no CR/LF: it would split an HTTP/1.1 head downstream
        [(b"connection", b"close")],  # connection-specific (8.2.2)
    ],
)
async def test_a_malformed_response_head_fails_its_stream_only(head):
    """h2's own inbound validation is off (h2rules.parse_response instead): a malformed head is a
    stream error, reset PROTOCOL_ERROR, and the connection goes on serving (h2's would end it)."""

    async def handler(ex: H2Exchange) -> None:
        await ex.read_body()
        if len(ex.server.exchanges) == 1:
            ex.conn.h2.config.validate_outbound_headers = False  # the raw server sends what we say
            ex.conn.h2.config.normalize_outbound_headers = False
            await ex.start(200, head)
            await ex.reset_seen.wait()
        else:
            await ex.respond(200, b"fine")

    async with h2_upstream(handler) as (server, pool):
        with pytest.raises(UpstreamProtocolError, match="malformed response head"):
            await get(pool)
        assert await get(pool) == (200, b"fine")
        assert server.resets[0][1] == ErrorCodes.PROTOCOL_ERROR and server.connections == 1


async def test_malformed_trailers_fail_the_stream():
    async def handler(ex: H2Exchange) -> None:
        await ex.read_body()
        await ex.start(200, [(b"content-type", b"application/grpc")])
        await ex.send(b"\x00\x00\x00\x00\x00")
        ex.conn.h2.config.validate_outbound_headers = False
        ex.conn.h2.send_headers(ex.stream_id, [(b":status", b"200")], end_stream=True)  # a pseudo-header in trailers
        await ex.conn.flush()

    async with h2_upstream(handler) as (_, pool):
        with pytest.raises(UpstreamProtocolError, match="malformed trailers"):
            async with pool.request(0, b"POST", b"/", HOST, b"") as resp:
                await resp.read()
