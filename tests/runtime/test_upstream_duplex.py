"""Full-duplex upstream exchanges: the request body goes up while the response comes down.

The upstream is the project's own server (`proxy.http.server.Server`, what the sim
pod runs) on 127.0.0.1 inside the test's trio run, with handlers that echo as they
read (`stream_echo`: the sim pod's /sim/echo), answer after reading everything
(`echo`: what model servers do), answer before reading (an early 413), stall, or
record being cancelled. Sending a large body before reading the answer deadlocks
against the first kind on HTTP/1.1 (socket buffers fill both ways) and on h2c
(our receive window fills, the upstream stops reading). Every test is bounded by
trio.fail_after; none measures time.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from proxy.http.messages import Request, ResponseSink
from proxy.http.pool import UpstreamPool
from proxy.http.server import Server
from proxy.http.upstream_h1 import SMALL_BODY_BYTES
from proxy.policy.schema import Listen, Upstream
from proxy.testing.handlers import BINARY, echo, pattern, stream_echo

HOST = [(b"host", b"upstream.test")]
TEN_MB = 10 * 1024 * 1024
PROTOCOLS = ["http1", "h2c"]
PAYLOAD = pattern(TEN_MB)


@asynccontextmanager
async def upstream(handler, protocol: str):
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            server = Server(handler, Listen(address="127.0.0.1:0"))
            address = await nursery.start(server.serve, "127.0.0.1:0")
            async with UpstreamPool([Upstream(url=f"http://{address}", protocol=protocol)]) as pool:
                yield server, pool
            nursery.cancel_scope.cancel()


async def pieces(data: bytes, size: int = 1_000_003):
    """`data` as an async-iterable body, in pieces that line up with no buffer size."""
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def post(pool: UpstreamPool, body) -> tuple[int, bytes]:
    async with pool.request(0, b"POST", b"/echo", HOST, body) as resp:
        return resp.status, await resp.read()


def settled(pool: UpstreamPool) -> tuple[int, int]:
    stats = pool.statistics()[0]
    return stats.outstanding, stats.streams


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_echo_while_reading_ten_megabytes_completes_and_keeps_the_connection(protocol):
    async with upstream(stream_echo, protocol) as (server, pool):
        assert await post(pool, PAYLOAD) == (200, PAYLOAD)
        assert settled(pool) == (0, 0)
        assert pool.statistics()[0].open_connections == 1  # h1: the sender had finished, so it was pooled
        assert await post(pool, b"again") == (200, b"again")
        assert server.statistics().connections_accepted == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_echo_while_reading_a_streamed_body(protocol):
    async with upstream(stream_echo, protocol) as (_server, pool):
        assert await post(pool, pieces(PAYLOAD)) == (200, PAYLOAD)
        assert settled(pool) == (0, 0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("streamed", [False, True])
async def test_echo_that_answers_only_after_reading_everything(protocol, streamed):
    async with upstream(echo, protocol) as (_server, pool):
        assert await post(pool, pieces(PAYLOAD) if streamed else PAYLOAD) == (200, PAYLOAD)
        assert settled(pool) == (0, 0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_each_piece_comes_back_before_the_next_is_sent(protocol):
    """Lockstep: the body source waits for the echo of its last piece, so only a duplex client finishes."""
    parts = [b"%d" % i * 5000 for i in range(1, 5)]
    echoed = [trio.Event() for _ in parts]

    async def lockstep():
        for part, seen in zip(parts, echoed, strict=False):
            yield part
            await seen.wait()

    async with upstream(stream_echo, protocol) as (_server, pool):
        async with pool.request(0, b"POST", b"/echo", HOST, lockstep()) as resp:
            got = b""
            for i in range(len(parts)):
                want = len(b"".join(parts[: i + 1]))
                while len(got) < want:
                    chunk = await resp.receive()
                    assert chunk, "the response ended early"
                    got += chunk
                echoed[i].set()
            assert await resp.read() == b""
        assert got == b"".join(parts)
        assert settled(pool) == (0, 0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_an_answer_before_the_body_was_read_is_delivered(protocol):
    async def early(request: Request, sink: ResponseSink) -> None:
        await sink.respond(413, BINARY, b"too big")

    async with upstream(early, protocol) as (_server, pool):
        assert await post(pool, PAYLOAD) == (413, b"too big")
        assert settled(pool) == (0, 0)
        # h1: the unsent rest of the body leaves the connection unusable; h2: the stream ends alone.
        assert pool.statistics()[0].open_connections == (1 if protocol == "h2c" else 0)
        assert await post(pool, b"next") == (413, b"too big")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("streamed", [False, True])
async def test_cancelled_caller_stops_the_upload_and_the_upstream_sees_it(protocol, streamed):
    arrived, gone, source_stopped = trio.Event(), trio.Event(), trio.Event()

    async def stall(request: Request, sink: ResponseSink) -> None:
        try:
            async for _ in request.body.chunks():
                arrived.set()
                await trio.sleep_forever()  # stop reading: our upload blocks
        finally:
            gone.set()

    async def endless():
        try:
            yield PAYLOAD[:SMALL_BODY_BYTES]
            await trio.sleep_forever()  # a slow client still sending
        finally:
            source_stopped.set()

    async with upstream(stall, protocol) as (_server, pool), trio.open_nursery() as nursery:
        scope = trio.CancelScope()
        baseline = len(pool.nursery.child_tasks)  # h1: the reaper; h2: no connection yet

        async def call() -> None:
            with scope:
                await post(pool, endless() if streamed else PAYLOAD)

        nursery.start_soon(call)
        await arrived.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert pool.statistics()[0].outstanding == 1
        connection_tasks = 2 if protocol == "h2c" else 0  # h2c: its reader and writer
        assert len(pool.nursery.child_tasks) == baseline + connection_tasks + 1  # + the sender
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert len(pool.nursery.child_tasks) == baseline + connection_tasks  # the sender is gone
        if streamed:
            await source_stopped.wait()  # the body source was cancelled with the sender
        if protocol == "h2c" or streamed:
            # (An h1 server whose body buffer is full reads no more, so it cannot see the close.)
            await gone.wait()  # the upstream's handler was cancelled: stream reset / connection closed
        assert settled(pool) == (0, 0)
        assert pool.statistics()[0].open_connections == (1 if protocol == "h2c" else 0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_failing_body_source_fails_the_exchange_with_its_error(protocol):
    class SourceFailed(Exception):
        pass

    async def failing():
        yield PAYLOAD[: 1 << 20]
        raise SourceFailed("the client went away mid-body")

    async with upstream(stream_echo, protocol) as (_server, pool):
        with pytest.raises(SourceFailed):
            await post(pool, failing())
        assert settled(pool) == (0, 0)
        assert await post(pool, b"still fine") == (200, b"still fine")


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_small_bodies_are_sent_inline_and_large_ones_by_one_task(protocol):
    """The common request costs no task; a large body costs exactly one while it is sent."""
    release = trio.Event()
    tasks_while_waiting: list[int] = []

    async def held(request: Request, sink: ResponseSink) -> None:
        if request.path == b"/warm":
            return await sink.respond(200, BINARY, b"")
        async for _ in request.body.chunks():
            break  # read a little, then stop reading: a large upload stays in flight
        await release.wait()
        await sink.respond(200, BINARY, b"done")

    async with upstream(held, protocol) as (_server, pool), trio.open_nursery() as nursery:
        async with pool.request(0, b"GET", b"/warm", HOST) as resp:  # h2: the connection's tasks exist now
            await resp.read()
        baseline = len(pool.nursery.child_tasks)
        for body in (PAYLOAD[:SMALL_BODY_BYTES], PAYLOAD):
            release = trio.Event()
            nursery.start_soon(post, pool, body)
            await trio.testing.wait_all_tasks_blocked()
            tasks_while_waiting.append(len(pool.nursery.child_tasks) - baseline)
            release.set()
            await trio.testing.wait_all_tasks_blocked()
    assert tasks_while_waiting == [0, 1]
