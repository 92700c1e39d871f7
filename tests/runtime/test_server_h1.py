"""HTTP/1.1 server connection over in-memory streams, on trio's autojump clock (every test
takes `autojump_clock`, so timeouts pass at once and exactly). The connection's timeouts
and hang-up watcher come from the server's patrol, which each test runs beside it."""

from __future__ import annotations

import collections
from contextlib import asynccontextmanager

import h11
import msgspec
import pytest
import trio
import trio.testing

from proxy.errors import ProtocolError
from proxy.http.exchange import ServerContext
from proxy.http.h1server import H1ServerConnection
from proxy.metrics import Metrics
from proxy.policy.schema import Listen
from proxy.testing.handlers import Gate, Router, echo, hello, stream_echo

LIMITS = Listen(max_body_bytes=4096, max_header_bytes=2048, header_timeout_s=5.0, idle_timeout_s=30.0)


class Client:
    """The test's end: h11 on the client side, or raw bytes."""

    def __init__(self, stream: trio.testing.StapledStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    async def request(
        self,
        target: bytes = b"/",
        method: bytes = b"GET",
        headers=(),
        body: bytes = b"",
        version=b"1.1",
    ):
        hdrs = [(b"host", b"test"), *headers]
        if body and not any(k == b"transfer-encoding" for k, _ in hdrs):
            hdrs.append((b"content-length", str(len(body)).encode()))
        data = self.h11.send(h11.Request(method=method, target=target, headers=hdrs, http_version=version))
        if body:
            data += self.h11.send(h11.Data(data=body))
        data += self.h11.send(h11.EndOfMessage())
        await self.stream.send_all(data)

    async def response(self) -> tuple[h11.Response, bytes]:
        head, parts = None, []
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                parts.append(event.data)
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                assert head is not None
                return head, b"".join(parts)

    async def read_to_eof(self) -> bytes:
        out = b""
        while data := await self.stream.receive_some(65536):
            out += data
        return out


@asynccontextmanager
async def connection(handler, limits: Listen = LIMITS, metrics: Metrics | None = None):
    client_stream, server_stream = trio.testing.memory_stream_pair()
    ctx = ServerContext(handler, limits, metrics)
    conn = H1ServerConnection(ctx, server_stream, "192.0.2.7", trio.current_time())
    done = trio.Event()

    async def run() -> None:
        await conn.run(b"")
        done.set()

    # Virtual seconds: with autojump a deadlocked test fails at once instead of spinning.
    with trio.fail_after(3600):
        async with trio.open_nursery() as nursery:
            await nursery.start(ctx.patrol.run)  # the server's: phase deadlines, hung-up clients
            nursery.start_soon(run)
            yield Client(client_stream), ctx, done
            nursery.cancel_scope.cancel()


def header(response: h11.Response, name: bytes) -> bytes | None:
    return next((v for k, v in response.headers if k == name), None)


async def test_keep_alive_serves_many_requests_on_one_connection(autojump_clock):
    async with connection(echo) as (client, ctx, done):
        for i in range(3):
            await client.request(b"/echo", b"POST", body=b"n%d" % i)
            response, body = await client.response()
            client.h11.start_next_cycle()
            assert (response.status_code, body) == (200, b"n%d" % i)
            assert header(response, b"x-echo-client") == b"192.0.2.7"
            assert header(response, b"x-echo-authority") == b"test"
        assert ctx.requests_total == 3
        assert not done.is_set()


async def test_chunked_request_is_echoed_as_chunked_stream(autojump_clock):
    async with connection(stream_echo) as (client, _, _):
        await client.request(b"/s", b"POST", headers=[(b"transfer-encoding", b"chunked")], body=b"abc")
        response, body = await client.response()
        assert header(response, b"transfer-encoding") == b"chunked"
        assert header(response, b"x-echo-content-length") == b"None"
        assert body == b"abc"


async def test_http10_client_gets_close_delimited_stream(autojump_clock):
    async with connection(stream_echo) as (client, _, done):
        await client.stream.send_all(b"POST /s HTTP/1.0\r\ncontent-length: 2\r\n\r\nhi")
        raw = await client.read_to_eof()
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert b"\r\ntransfer-encoding:" not in head.lower() and b"\r\ncontent-length:" not in head.lower()
        assert body == b"hi"
        await done.wait()


async def test_pipelined_requests_are_answered_in_order(autojump_clock):
    async with connection(Router({b"/a": hello, b"/b": echo})) as (client, _, done):
        await client.stream.send_all(
            b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n"
            b"POST /b HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\nconnection: close\r\n\r\nZ"
        )
        raw = await client.read_to_eof()
        first, second = raw.split(b"HTTP/1.1 200 OK")[1:]
        assert first.endswith(b"\r\n\r\nhello\n") and second.endswith(b"\r\n\r\nZ")
        await done.wait()


async def test_expect_100_continue_is_sent_when_the_handler_starts_reading(autojump_clock):
    may_read = trio.Event()

    async def handler(request, sink):
        await may_read.wait()
        await sink.respond(200, [], await request.body.read_all())

    async with connection(handler) as (client, _, _):
        await client.stream.send_all(b"POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n")
        with trio.move_on_after(1.0):
            early = await client.stream.receive_some(100)
            pytest.fail(f"server answered before the handler read the body: {early!r}")
        may_read.set()
        assert (await client.stream.receive_some(100)).startswith(b"HTTP/1.1 100 ")
        await client.stream.send_all(b"body")
        raw = await client.stream.receive_some(1000)
        assert raw.startswith(b"HTTP/1.1 200 ") and raw.endswith(b"\r\n\r\nbody")


async def test_stalled_head_gets_408_after_header_timeout(autojump_clock):
    async with connection(hello) as (client, ctx, done):
        start = trio.current_time()
        await client.stream.send_all(b"GET / HTTP/1.1\r\nhost:")
        raw = await client.read_to_eof()
        assert raw.startswith(b"HTTP/1.1 408 ")
        assert trio.current_time() - start == pytest.approx(LIMITS.header_timeout_s)
        assert ctx.protocol_errors == 1
        await done.wait()


async def test_idle_keep_alive_connection_is_closed_quietly(autojump_clock):
    async with connection(hello) as (client, _, done):
        await client.request()
        await client.response()
        answered = trio.current_time()
        assert await client.read_to_eof() == b""
        assert trio.current_time() - answered == pytest.approx(LIMITS.idle_timeout_s)
        await done.wait()


async def test_content_length_over_cap_is_413_before_the_handler_runs(autojump_clock):
    gate = Gate()
    async with connection(gate) as (client, _, done):
        await client.stream.send_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 99999\r\n\r\n")
        raw = await client.read_to_eof()
        assert raw.startswith(b"HTTP/1.1 413 ") and b"connection: close" in raw
        assert gate.requests == []
        await done.wait()


async def test_chunked_body_crossing_cap_raises_body_too_large_answered_413(autojump_clock):
    async with connection(echo) as (client, _, _):
        chunk = b"1000\r\n" + b"x" * 4096 + b"\r\n"
        await client.stream.send_all(b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n" + chunk * 2)
        raw = await client.stream.receive_some(10000)
        assert raw.startswith(b"HTTP/1.1 413 ")
        assert b"larger than 4096 bytes" in raw


@pytest.mark.parametrize(
    ("raw", "status", "words"),
    [
        (b"GET / HTTP/1.1 junk\r\nhost: x\r\n\r\n", 400, b"request line"),
        (b"GET / HTTP/1.1\r\nbad header\r\n\r\n", 400, b"header"),
        (b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 3000 + b"\r\n\r\n", 431, b"too large"),
    ],
)
async def test_malformed_heads_are_answered_and_closed(raw, status, words, autojump_clock):
    metrics = Metrics()
    async with connection(hello, metrics=metrics) as (client, ctx, done):
        await client.stream.send_all(raw)
        answer = await client.read_to_eof()
        assert answer.startswith(b"HTTP/1.1 %d " % status)
        assert words in answer.lower()
        assert ctx.protocol_errors == 1
        await done.wait()
    kinds = {s.labels["kind"] for s in metrics.protocol_errors.collect()[0].samples if s.value}
    assert kinds == {"h1_header_too_large" if status == 431 else "h1_bad_head"}


async def test_bad_chunked_encoding_fails_the_body_read_with_400(autojump_clock):
    seen: list[BaseException] = []

    async def handler(request, sink):
        try:
            await request.body.read_all()
        except ProtocolError as exc:
            seen.append(exc)
            raise

    async with connection(handler) as (client, _, done):
        await client.stream.send_all(b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nZZZ\r\n")
        answer = await client.read_to_eof()
        assert answer.startswith(b"HTTP/1.1 400 ") and b"chunk" in answer
        assert len(seen) == 1
        await done.wait()


async def test_client_eof_cancels_the_handler_and_marks_client_gone(autojump_clock):
    gate = Gate()
    async with connection(gate) as (client, ctx, done):
        await client.request()
        await gate.arrived.wait()
        await client.stream.send_stream.aclose()
        await gate.gone.wait()
        assert gate.requests[0].client_gone is True
        assert ctx.client_disconnects == 1
        await done.wait()


async def test_handler_exception_before_answer_is_500(autojump_clock):
    async def handler(request, sink):
        raise RuntimeError("boom")

    async with connection(handler) as (client, _, _):
        await client.request()
        response, body = await client.response()
        assert response.status_code == 500 and body == b"500 internal error\n"
        client.h11.start_next_cycle()
        await client.request()
        assert (await client.response())[0].status_code == 500  # connection still usable


async def test_handler_returning_without_answer_is_500(autojump_clock):
    async def handler(request, sink):
        return None

    async with connection(handler) as (client, _, _):
        await client.request()
        assert (await client.response())[0].status_code == 500


async def test_handler_failing_mid_stream_aborts_the_connection(autojump_clock):
    async def handler(request, sink):
        await sink.start(200, [])
        await sink.send(b"partial")
        raise RuntimeError("boom")

    async with connection(handler) as (client, _, done):
        await client.request()
        raw = await client.read_to_eof()
        assert raw.startswith(b"HTTP/1.1 200 ") and b"partial" in raw
        assert not raw.endswith(b"0\r\n\r\n")  # no chunked terminator: the client sees a truncated body
        await done.wait()


async def test_drain_closes_idle_and_marks_in_flight_answers_connection_close(autojump_clock):
    gate = Gate()
    async with connection(gate) as (client, ctx, done):
        await client.request()
        await gate.arrived.wait()
        ctx.draining = True
        gate.release.set()
        response, _ = await client.response()
        assert header(response, b"connection") == b"close"
        await done.wait()


async def test_request_metrics_are_recorded_by_protocol_and_code(autojump_clock):
    metrics = Metrics()
    async with connection(Router({b"/": hello})) as (client, _, _):
        pass
    async with connection(Router({b"/": hello}), metrics=metrics) as (client, _, _):
        for target in (b"/", b"/nope"):
            await client.request(target)
            await client.response()
            client.h11.start_next_cycle()
    samples = {
        (s.labels["protocol"], s.labels["code"]): s.value
        for s in metrics.requests.collect()[0].samples
        if s.name.endswith("_total")
    }
    assert samples == {("http1", "200"): 1.0, ("http1", "404"): 1.0}
    counts = [s.value for s in metrics.request_duration_seconds.collect()[0].samples if s.name.endswith("_count")]
    assert counts == [2.0]


async def test_head_response_has_length_but_no_body(autojump_clock):
    async with connection(hello) as (client, _, _):
        await client.request(method=b"HEAD")
        response, body = await client.response()
        assert header(response, b"content-length") == b"6"
        assert body == b""


async def test_closed_connections_leave_no_cyclic_garbage(autojump_clock):
    """A closed connection (answered, or 408 on a stalled body) is freed by reference counting, not
    left in a cycle for the GC: none of its connection, parser or body is among the unreachable
    objects a collection finds. Each was a cycle (llhttp's bound callbacks, sink/body <->
    connection, a stored error's traceback), ~110 objects of garbage a connection, and under a
    stalled-body flood peak RSS waited on full GC passes. One server context for all, as in the
    server (its patrol may hold a closed connection until that one's timer is due: not a cycle)."""
    import gc

    from proxy.http.h1parse import RequestParser
    from proxy.http.h1sink import H1Body

    kinds = (H1ServerConnection, RequestParser, H1Body)
    ctx = ServerContext(echo, msgspec.structs.replace(LIMITS, body_timeout_s=2.0), None)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable is kept in gc.garbage
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(ctx.patrol.run)
            for i in range(10):
                client_stream, server_stream = trio.testing.memory_stream_pair()
                client = Client(client_stream)
                conn = H1ServerConnection(ctx, server_stream, "192.0.2.7", trio.current_time())
                nursery.start_soon(conn.run, b"")
                del conn
                if i % 2:
                    await client.stream.send_all(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 3000\r\n\r\nabc")
                    assert (await client.read_to_eof()).startswith(b"HTTP/1.1 408 ")
                else:
                    await client.request(b"/", method=b"POST", body=b"%d" % i, headers=[(b"connection", b"close")])
                    assert (await client.response())[0].status_code == 200
                    assert await client.read_to_eof() == b""
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            in_cycles = [type(o).__name__ for o in gc.garbage if type(o) in kinds]
            nursery.cancel_scope.cancel()
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert in_cycles == [], collections.Counter(in_cycles)
