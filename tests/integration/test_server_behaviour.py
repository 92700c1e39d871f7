"""The front-end server on real loopback sockets: streaming arrival, client disconnects,
graceful drain, malformed input and connection limits.

Ordering is asserted against handler progress (a handler waits on an event that the
test sets after it saw the previous chunk), never against wall-clock time.
"""

from __future__ import annotations

import subprocess
from contextlib import asynccontextmanager
from functools import partial

import httpx
import pytest
import trio
import trio.testing
from h2.errors import ErrorCodes

from proxy.http.h2server import MAX_STREAM_ID
from proxy.http.server import PREFACE, Server
from proxy.metrics import Metrics
from proxy.policy.schema import Listen
from proxy.testing.handlers import Gate, H2Peer, Router, hello
from tests.conftest import require_binary

pytestmark = pytest.mark.integration
CHUNKS = [b"first\n", b"second\n", b"third\n"]


@asynccontextmanager
async def serving(handler, limits: Listen | None = None, metrics: Metrics | None = None):
    server = Server(handler, limits or Listen(), metrics=metrics)
    async with trio.open_nursery() as nursery:
        address = await nursery.start(server.serve, "127.0.0.1:0")
        yield server, address
        nursery.cancel_scope.cancel()


async def connect(address: str) -> trio.SocketStream:
    host, port = address.rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


async def read_until(stream: trio.abc.ReceiveStream, needle: bytes, buf: bytes = b"") -> bytes:
    while needle not in buf:
        data = await stream.receive_some(65536)
        if not data:
            raise AssertionError(f"EOF before {needle!r}; got {buf!r}")
        buf += data
    return buf


async def read_to_eof(stream: trio.abc.ReceiveStream) -> bytes:
    out = b""
    while data := await stream.receive_some(65536):
        out += data
    return out


@pytest.mark.parametrize("version", ["--http1.1", "--http2-prior-knowledge"])
async def test_curl_sees_each_chunk_before_the_handler_sends_the_next(version):
    curl = require_binary("curl")
    gate = Gate(CHUNKS)
    with trio.fail_after(30):
        async with serving(gate) as (_, address):
            async with trio.open_nursery() as nursery:
                argv = [curl, "-sSN", version, f"http://{address}/"]
                proc = await nursery.start(partial(trio.run_process, argv, stdout=subprocess.PIPE))
                seen = b""
                for chunk, opened in zip(CHUNKS, gate.opens, strict=False):
                    seen = await read_until(proc.stdout, chunk, seen)
                    assert not opened.is_set()  # arrived while the handler still waits
                    opened.set()
                assert seen + await read_to_eof(proc.stdout) == b"".join(CHUNKS)
            assert proc.returncode == 0


@pytest.mark.parametrize("http2", [False, True])
async def test_httpx_stream_arrives_incrementally(http2):
    gate = Gate(CHUNKS)
    with trio.fail_after(30):
        async with serving(gate) as (_, address):
            async with (
                httpx.AsyncClient(http1=not http2, http2=http2) as client,
                client.stream("GET", f"http://{address}/") as response,
            ):
                received = []
                async for piece in response.aiter_raw():
                    received.append(piece)
                    if len(received) <= len(gate.opens):
                        assert piece == CHUNKS[len(received) - 1]
                        gate.opens[len(received) - 1].set()
            assert b"".join(received) == b"".join(CHUNKS)


async def test_h1_client_disconnect_mid_stream_cancels_the_handler():
    gate = Gate(CHUNKS)
    with trio.fail_after(30):
        async with serving(gate) as (server, address):
            stream = await connect(address)
            await stream.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            await read_until(stream, CHUNKS[0])
            await stream.aclose()
            await gate.gone.wait()
            assert gate.requests[0].client_gone is True
            assert server.statistics().client_disconnects == 1


async def test_h2_reset_cancels_one_stream_and_connection_loss_cancels_the_rest():
    gates = {name: Gate([b"x"]) for name in (b"/a", b"/b", b"/c")}
    with trio.fail_after(30):
        async with serving(Router(gates)) as (server, address):
            stream = await connect(address)
            peer = H2Peer(stream)
            await peer.start()
            sids = {name: await peer.request(name) for name in gates}
            await peer.until(lambda: all(peer.streams[s].chunks for s in sids.values()))
            await peer.reset(sids[b"/a"])
            await gates[b"/a"].gone.wait()
            assert not gates[b"/b"].gone.is_set() and not gates[b"/c"].gone.is_set()
            gates[b"/b"].opens[0].set()
            await peer.until(lambda: peer.streams[sids[b"/b"]].ended)  # the others go on
            await stream.aclose()
            await gates[b"/c"].gone.wait()
            assert [g.requests[0].client_gone for g in gates.values()] == [True, False, True]
            assert server.statistics().client_disconnects == 2


async def test_drain_finishes_in_flight_refuses_new_and_tells_clients():
    h1_gate, h2_gate = Gate(), Gate()
    metrics = Metrics()
    with trio.fail_after(30):
        # drain_timeout_s 4: a busy h2 connection gets its two-step GOAWAY after 1 s of waiting to go idle.
        limits = Listen(drain_timeout_s=4.0)
        async with serving(Router({b"/h1": h1_gate, b"/h2": h2_gate}), limits, metrics=metrics) as (
            server,
            address,
        ):
            h1 = await connect(address)
            await h1.send_all(b"GET /h1 HTTP/1.1\r\nhost: x\r\n\r\n")
            idle_h1 = await connect(address)
            await idle_h1.send_all(b"GET /h1x HTTP/1.1\r\nhost: x\r\n\r\n")
            await read_until(idle_h1, b"no such path")  # answered, now idle keep-alive
            h2 = H2Peer(await connect(address))
            await h2.start()
            sid = await h2.request(b"/h2")
            await h1_gate.arrived.wait()
            await h2_gate.arrived.wait()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.shutdown, 20.0)
                # Still busy after drain_idle_wait_s: the two-step GOAWAY (2^31-1, then the real last stream).
                await h2.until(lambda: len(h2.goaways) == 2)
                assert h2.goaways == [(ErrorCodes.NO_ERROR, MAX_STREAM_ID), (ErrorCodes.NO_ERROR, sid)]
                assert await read_to_eof(idle_h1) == b""  # idle keep-alive closed
                with pytest.raises(OSError):
                    await connect(address)  # listener closed: refused
                h1_gate.release.set()
                h2_gate.release.set()
                answer = await read_to_eof(h1)
                assert answer.startswith(b"HTTP/1.1 200 ") and b"connection: close" in answer.lower()
                await h2.until(lambda: h2.streams[sid].ended)
                assert h2.streams[sid].body == b"released\n"
            assert server.statistics().connections_http1 == server.statistics().connections_h2 == 0
    open_now = {s.labels["protocol"]: s.value for s in metrics.connections_open.collect()[0].samples}
    assert open_now == {"http1": 0.0, "h2": 0.0}


async def test_drain_cancels_what_is_still_running_at_the_deadline():
    gate = Gate()
    with trio.fail_after(30):
        async with serving(gate) as (server, address):
            stream = await connect(address)
            await stream.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            await gate.arrived.wait()
            await server.shutdown(0.2)
            assert gate.gone.is_set()


@pytest.mark.parametrize(
    ("raw", "answer"),
    [
        (b"GET / HTTP/1.1 junk\r\n\r\n", b"HTTP/1.1 400 "),
        (b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n", b"HTTP/1.1 431 "),
        (
            b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nnot-hex\r\n",
            b"HTTP/1.1 400 ",
        ),
    ],
)
async def test_malformed_h1_is_answered_and_others_are_still_served(raw, answer):
    async def reads_body(request, sink):
        await sink.respond(200, [], await request.body.read_all())

    with trio.fail_after(30):
        async with serving(reads_body) as (server, address):
            bad = await connect(address)
            await bad.send_all(raw)
            assert (await read_to_eof(bad)).startswith(answer)
            async with httpx.AsyncClient() as client:
                assert (await client.post(f"http://{address}/", content=b"ok")).content == b"ok"
            assert server.statistics().protocol_errors == 1


async def test_h2_garbage_after_preface_gets_goaway_and_others_are_still_served():
    with trio.fail_after(30):
        async with serving(hello) as (server, address):
            stream = await connect(address)
            peer = H2Peer(stream)
            await peer.start()
            await stream.send_all(b"\x00\x00\x08\x07\x00\x00\x00\x00\x01garbage!")  # GOAWAY on stream 1
            await peer.until(lambda: peer.goaway is not None)
            assert peer.goaway[0] == ErrorCodes.PROTOCOL_ERROR
            async with httpx.AsyncClient(http1=False, http2=True) as client:
                assert (await client.get(f"http://{address}/")).status_code == 200
            assert server.statistics().protocol_errors == 1


async def test_at_max_connections_the_longest_silent_connection_makes_room():
    metrics = Metrics()
    with trio.fail_after(30):
        async with serving(hello, Listen(max_connections=2), metrics=metrics) as (server, address):
            served = await connect(address)
            await served.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            await read_until(served, b"hello\n")  # now idle, kept alive
            silent = await connect(address)  # never says a word
            await trio.sleep(0.05)
            newcomer = await connect(address)
            await newcomer.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await read_until(newcomer, b"hello\n")).startswith(b"HTTP/1.1 200 ")
            assert await read_to_eof(served) == b""  # idle longest: closed to make room, without a word
            await served.aclose()
            await silent.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await read_until(silent, b"hello\n")).startswith(b"HTTP/1.1 200 ")
            stats = server.statistics()
            assert (stats.connections_evicted, stats.connections_rejected) == (1, 0)


async def test_at_max_connections_a_newcomer_is_refused_only_when_all_are_busy():
    metrics = Metrics()
    gate = Gate()
    with trio.fail_after(30):
        async with serving(gate, Listen(max_connections=2), metrics=metrics) as (server, address):
            busy = [await connect(address) for _ in range(2)]
            for stream in busy:
                await stream.send_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            while len(gate.requests) < 2:
                await trio.sleep(0.01)
            extra = await connect(address)
            try:
                assert await extra.receive_some(100) == b""
            except trio.BrokenResourceError:
                pass  # a reset is as good as a close here
            assert server.statistics().connections_rejected == 1
            assert metrics.connections_rejected.collect()[0].samples[0].value == 1.0
            gate.release.set()
            assert (await read_until(busy[0], b"released\n")).startswith(b"HTTP/1.1 200 ")


async def test_slow_head_gets_408():
    with trio.fail_after(30):
        async with serving(hello, Listen(header_timeout_s=0.3)) as (_, address):
            stream = await connect(address)
            await stream.send_all(b"GET / HTTP/1.1\r\nhost")
            assert (await read_to_eof(stream)).startswith(b"HTTP/1.1 408 ")


async def test_preface_that_trickles_in_is_still_detected():
    with trio.fail_after(30):
        async with serving(hello) as (server, address):
            stream = await connect(address)
            peer = H2Peer(stream)
            peer.conn.initiate_connection()
            opening = peer.conn.data_to_send()
            assert opening.startswith(PREFACE)
            for i in range(0, len(opening), 5):
                await stream.send_all(opening[i : i + 5])
                await trio.lowlevel.checkpoint()
            sid = await peer.request()
            await peer.until(lambda: peer.streams[sid].ended)
            assert peer.streams[sid].body == b"hello\n"
            assert server.statistics().connections_h2 == 1
