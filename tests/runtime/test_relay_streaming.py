"""Streamed answers through the real pool and relay: every chunk goes on as it comes, and what
arrived together goes on together.

Unbuffered: an upstream that produces its next chunk only once the client has the previous
one (a model that waits on nothing, seen from the outside) must not stall; if the relay held
a chunk back waiting for another, these tests would hang until their `fail_after`.
Coalesced: chunks the upstream wrote back to back and the proxy finds already received are
handed on in one piece (one client write, not one per chunk), whatever the upstream protocol.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from proxy.core.decisions import Outcome
from proxy.http import sockio
from proxy.http.messages import Request
from proxy.http.pool import UpstreamPool
from proxy.policy.schema import Upstream
from proxy.runtime import relay
from tests.runtime.raw_servers import H1Exchange, H2Exchange, RawH1Server, RawH2Server

HOST = [(b"host", b"upstream.test")]
EVENTS = [b"data: %d\n\n" % i for i in range(5)] + [b"data: [DONE]\n\n"]


class Sink:
    """A client that records every write and says when each one arrived."""

    def __init__(self) -> None:
        self.headers_sent = False
        self.sent: list[bytes] = []
        self.wrote = trio.Event()
        self.ended = False

    async def respond(self, status, headers, body=b"") -> None:
        raise AssertionError("a streamed answer goes out as start/send/end")

    async def start(self, status, headers) -> None:
        self.headers_sent = True

    async def send(self, data: bytes) -> None:
        self.sent.append(data)
        self.wrote.set()
        self.wrote = trio.Event()

    async def end(self) -> None:
        self.ended = True

    async def trailers(self, fields) -> None:
        self.ended = True


@asynccontextmanager
async def upstream(protocol: str, handler):
    with trio.fail_after(10):
        server = RawH1Server(handler) if protocol == "h1" else RawH2Server(handler)
        async with server.running():
            cfg = Upstream(url=f"http://127.0.0.1:{server.port}", protocol="h2c" if protocol == "h2c" else "http1")
            async with UpstreamPool([cfg]) as pool:
                yield pool


def lockstep(sink_box: list[Sink]):
    """An upstream handler that sends each event only once the client has the one before."""

    async def h1(ex: H1Exchange) -> None:
        await ex.start(200, [(b"content-type", b"text/event-stream")])
        for event in EVENTS:
            wrote = sink_box[0].wrote
            await ex.send(event)
            await wrote.wait()  # the relay must pass this one on before the next exists
        await ex.end()

    async def h2(ex: H2Exchange) -> None:
        await ex.read_body()
        await ex.start(200, [(b"content-type", b"text/event-stream")])
        for event in EVENTS:
            wrote = sink_box[0].wrote
            await ex.send(event)
            await wrote.wait()
        await ex.send(b"", end=True)

    return {"h1": h1, "h2c": h2}


@pytest.mark.parametrize("protocol", ["h1", "h2c"])
async def test_each_chunk_reaches_the_client_before_the_upstream_makes_the_next(protocol: str) -> None:
    box = [Sink()]
    async with upstream(protocol, lockstep(box)[protocol]) as pool:
        request = Request(b"POST", b"/v1/chat/completions", [], body=None, client="192.0.2.1")
        result = await relay.forward(pool, 0, 10.0, request, b"{}", box[0], [], scoped=False, restamp=False)
    assert box[0].sent == EVENTS  # one write per chunk: none was there early to join
    assert box[0].ended and result.outcome is Outcome.SUCCESS
    assert result.observed is not None and result.observed.output_tokens == 5  # [DONE] is not a token


def burst(sent: trio.Event, go: trio.Event):
    """An upstream that writes every event back to back (separate writes), once told to."""

    async def h1(ex: H1Exchange) -> None:
        await ex.start(200, [(b"content-type", b"text/event-stream")])
        await go.wait()
        for event in EVENTS:
            await ex.send(event)
        sent.set()
        await ex.end()

    async def h2(ex: H2Exchange) -> None:
        await ex.read_body()
        await ex.start(200, [(b"content-type", b"text/event-stream")])
        await go.wait()
        for event in EVENTS:
            await ex.send(event)
        sent.set()
        await ex.send(b"", end=True)

    return {"h1": h1, "h2c": h2}


@pytest.mark.parametrize("protocol", ["h1", "h2c"])
async def test_chunks_already_received_come_back_as_one_piece(protocol: str) -> None:
    sent, go = trio.Event(), trio.Event()
    async with (
        upstream(protocol, burst(sent, go)[protocol]) as pool,
        pool.request(0, b"POST", b"/v1/chat/completions", HOST, b"{}") as resp,
    ):
        go.set()
        await sent.wait()
        await trio.testing.wait_all_tasks_blocked()  # on loopback the bytes are ours by now
        assert await resp.receive() == b"".join(EVENTS)  # six chunks, one piece, nothing lost
        assert await resp.receive() == b""


async def test_a_socket_that_keeps_missing_waits_first_and_still_reads_everything() -> None:
    a, b = trio.socket.socketpair()
    io = sockio.SocketIO(b, learns=True)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            got: list[bytes] = []

            async def reader(n: int) -> None:
                for _ in range(n):
                    got.append(await io.receive(100, wait_first=True))

            nursery.start_soon(reader, sockio.MISSES_BEFORE_SKIP + sockio.PROBE_EVERY + 2)
            for i in range(sockio.MISSES_BEFORE_SKIP + sockio.PROBE_EVERY + 2):
                await trio.testing.wait_all_tasks_blocked()  # the reader waits: its read finds nothing
                await sockio.send_all(a, b"%d" % i)
    assert got == [b"%d" % i for i in range(sockio.MISSES_BEFORE_SKIP + sockio.PROBE_EVERY + 2)]
    assert io._misses >= sockio.MISSES_BEFORE_SKIP  # it learnt that reading first does not pay here
    await sockio.send_all(a, b"early")  # bytes there before the read: waiting first still finds them
    assert await io.receive(100, wait_first=False) == b"early"
    with trio.move_on_after(0.05) as scope:  # a wait in skip mode is a cancellable checkpoint
        await io.receive(100, wait_first=True)
    assert scope.cancelled_caught
    a.close()
    b.close()


async def test_a_socket_whose_reads_find_bytes_keeps_reading_first() -> None:
    a, b = trio.socket.socketpair()
    io = sockio.SocketIO(b, learns=True)
    io._misses = sockio.MISSES_BEFORE_SKIP  # as if it had been missing
    for _ in range(sockio.PROBE_EVERY + 1):  # a probe comes within PROBE_EVERY + 1 reads
        await sockio.send_all(a, b"x")
        assert await io.receive(100, wait_first=False) == b"x"
    assert io._misses == 0  # the probe found bytes: back to reading first
    a.close()
    b.close()


async def test_a_socket_that_does_not_learn_always_reads_first() -> None:
    a, b = trio.socket.socketpair()
    io = sockio.SocketIO(b)  # the server connections' and the h2c upstream's (sockio module doc)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            got: list[bytes] = []

            async def reader() -> None:
                for _ in range(sockio.MISSES_BEFORE_SKIP + 2):
                    got.append(await io.receive(100, wait_first=True))

            nursery.start_soon(reader)
            for i in range(sockio.MISSES_BEFORE_SKIP + 2):
                await trio.testing.wait_all_tasks_blocked()
                await sockio.send_all(a, b"%d" % i)
    assert len(got) == sockio.MISSES_BEFORE_SKIP + 2
    assert io._misses < sockio.MISSES_BEFORE_SKIP  # every miss seen, never enough to wait first
    a.close()
    b.close()
