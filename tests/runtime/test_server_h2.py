"""HTTP/2 server connection over in-memory streams, driven frame by frame by `H2Peer`,
on trio's autojump clock (every test takes `autojump_clock`)."""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from msgspec.structs import replace

from proxy.http.exchange import ServerContext
from proxy.http.h2server import (
    IDLE_WORKERS_AT_REST,
    MAX_STREAM_ID,
    REST_RELEASE_S,
    STREAM_WINDOW,
    H2ServerConnection,
    drain_idle_wait_s,
)
from proxy.metrics import Metrics
from proxy.policy.schema import Listen
from proxy.testing.handlers import Gate, H2Peer, Router, blob, echo, hello, pattern

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
LIMITS = Listen(
    max_body_bytes=2_000_000,
    max_header_bytes=2048,
    max_concurrent_streams=4,
    header_timeout_s=5.0,
    idle_timeout_s=30.0,
)


@asynccontextmanager
async def connection(handler, limits: Listen = LIMITS, metrics: Metrics | None = None, **peer_options):
    client_stream, server_stream = trio.testing.memory_stream_pair()
    ctx = ServerContext(handler, limits, metrics)
    conn = H2ServerConnection(ctx, server_stream, "192.0.2.9", trio.current_time())
    done = trio.Event()

    async def run() -> None:
        await conn.run(b"")
        done.set()

    # Virtual seconds: with autojump a deadlocked test fails at once instead of spinning.
    with trio.fail_after(3600):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            peer = H2Peer(client_stream, **peer_options)
            await peer.start()
            await peer.until(lambda: peer.remote_max_streams is not None)  # the server's SETTINGS
            yield peer, ctx, conn, done
            nursery.cancel_scope.cancel()


async def test_request_fields_and_response(autojump_clock):
    async with connection(echo) as (peer, _, _, _):
        sid = await peer.request(b"/e?q=1", method=b"POST", headers=[(b"x-a", b"1")], body=b"hi")
        await peer.until(lambda: peer.streams[sid].ended)
        response = peer.streams[sid]
        assert (response.status, response.body) == (200, b"hi")
        assert response.header(b"x-echo-target") == b"/e?q=1"
        assert response.header(b"x-echo-authority") == b"test"
        assert response.header(b"x-echo-version") == b"2"
        assert response.header(b"x-echo-client") == b"192.0.2.9"
        assert peer.remote_max_streams == LIMITS.max_concurrent_streams


async def test_unread_body_of_one_stream_does_not_block_the_others(autojump_clock):
    gate = Gate()
    async with connection(Router({b"/slow": gate, b"/fast": echo})) as (peer, _, conn, _):
        slow = await peer.request(b"/slow", method=b"POST", end=False)
        await gate.arrived.wait()
        await peer.send(slow, b"x" * STREAM_WINDOW)  # fills the slow stream's whole window, unread
        for _ in range(3):
            fast = await peer.request(b"/fast", method=b"POST", body=b"y" * 100_000)
            await peer.until(lambda fast=fast: peer.streams[fast].ended)
            assert peer.streams[fast].body == b"y" * 100_000
        assert conn.streams[slow].body._parts  # the slow body is still buffered, unread


async def test_large_request_body_flows_as_the_handler_consumes_it(autojump_clock):
    body = pattern(1_500_000)  # far past the initial windows: needs WINDOW_UPDATEs
    async with connection(echo) as (peer, _, _, _):
        sid = await peer.request(method=b"POST", end=False)
        offset = 0
        while offset < len(body):
            window = peer.conn.local_flow_control_window(sid)
            if window == 0:
                await peer.receive()
                continue
            size = min(window, len(body) - offset)
            await peer.send(sid, body[offset : offset + size])
            offset += size
        await peer.send(sid, b"", end=True)
        await peer.until(lambda: peer.streams[sid].ended)
        assert peer.streams[sid].body == body


async def test_response_waits_for_the_clients_window(autojump_clock):
    size = 100_000
    settings = {SettingCodes.INITIAL_WINDOW_SIZE: 16_384}
    async with connection(blob(size), auto_ack=False, settings=settings) as (peer, _, _, _):
        sid = await peer.request()
        stream = peer.streams[sid]
        await peer.until(lambda: len(stream.body) == 16_384)
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(1):
            await peer.receive()  # nothing more may come until the window opens
        assert len(stream.body) == 16_384 and not stream.ended
        while not stream.ended:
            await peer.ack(sid, 16_384)
            await peer.receive()
        assert stream.body == pattern(size)


async def test_streams_beyond_max_concurrent_are_refused(autojump_clock):
    gate = Gate()
    routes = Router({b"/wait": gate, b"/": hello})
    async with connection(routes, obey_stream_limit=False) as (peer, _, _, _):
        waiting = [await peer.request(b"/wait") for _ in range(LIMITS.max_concurrent_streams)]
        await trio.testing.wait_all_tasks_blocked()
        assert len(gate.requests) == LIMITS.max_concurrent_streams
        refused = await peer.request(b"/")
        await peer.until(lambda: peer.streams[refused].reset_code is not None)
        assert peer.streams[refused].reset_code == ErrorCodes.REFUSED_STREAM
        gate.release.set()
        await peer.until(lambda: all(peer.streams[s].ended for s in waiting))
        again = await peer.request(b"/")
        await peer.until(lambda: peer.streams[again].ended)
        assert peer.streams[again].status == 200


async def test_rst_stream_cancels_that_handler_only(autojump_clock):
    gone, kept = Gate(), Gate()
    async with connection(Router({b"/gone": gone, b"/kept": kept})) as (peer, ctx, _, _):
        a = await peer.request(b"/gone")
        b = await peer.request(b"/kept")
        await gone.arrived.wait()
        await kept.arrived.wait()
        await peer.reset(a)
        await gone.gone.wait()
        assert gone.requests[0].client_gone is True
        kept.release.set()
        await peer.until(lambda: peer.streams[b].ended)
        assert peer.streams[b].body == b"released\n"
        assert kept.requests[0].client_gone is False
        assert ctx.client_disconnects == 1


@pytest.mark.parametrize(
    ("garbage", "codes"),
    [
        (
            b"\x00\x00\x04\x00\x00\x00\x00\x00\x00abcd",
            {ErrorCodes.PROTOCOL_ERROR},
        ),  # DATA on stream 0
        (
            b"\x00\x40\x01\x00\x00\x00\x00\x00\x01" + b"z" * 16_385,
            {ErrorCodes.FRAME_SIZE_ERROR},
        ),  # > MAX_FRAME_SIZE
        (
            b"\x00\x00\x05\x01\x05\x00\x00\x00\x01\xff\xff\xff\xff\xff",
            {ErrorCodes.COMPRESSION_ERROR, ErrorCodes.PROTOCOL_ERROR},
        ),
    ],
)
async def test_protocol_errors_get_goaway_with_their_code(garbage, codes, autojump_clock):
    metrics = Metrics()
    async with connection(hello, metrics=metrics) as (peer, ctx, _, done):
        await peer.stream.send_all(garbage)
        await peer.until(lambda: peer.goaway is not None)
        assert peer.goaway[0] in codes
        await done.wait()
        assert ctx.protocol_errors == 1
    kinds = {s.labels["kind"] for s in metrics.protocol_errors.collect()[0].samples if s.value}
    assert kinds == {f"h2_{ErrorCodes(peer.goaway[0]).name.lower()}"}


async def test_no_request_head_in_time_gets_goaway(autojump_clock):
    async with connection(hello) as (peer, ctx, _, done):
        start = trio.current_time()
        await peer.until(lambda: peer.goaway is not None)
        assert peer.goaway[0] == ErrorCodes.NO_ERROR
        assert trio.current_time() - start == pytest.approx(LIMITS.header_timeout_s)
        await done.wait()
        assert ctx.protocol_errors == 1


async def test_idle_connection_gets_goaway(autojump_clock):
    async with connection(hello) as (peer, ctx, _, done):
        sid = await peer.request()
        await peer.until(lambda: peer.streams[sid].ended)
        answered = trio.current_time()
        await peer.until(lambda: peer.goaway is not None)
        assert peer.goaway == (ErrorCodes.NO_ERROR, sid)
        assert trio.current_time() - answered == pytest.approx(LIMITS.idle_timeout_s)
        await done.wait()
        assert ctx.protocol_errors == 0


async def test_header_list_over_limit_is_431_on_its_stream(autojump_clock):
    async with connection(hello) as (peer, _, _, _):
        big = await peer.request(headers=[(b"x-big", b"a" * 3000)])
        await peer.until(lambda: peer.streams[big].ended)
        assert peer.streams[big].status == 431
        fine = await peer.request()
        await peer.until(lambda: peer.streams[fine].ended)
        assert peer.streams[fine].status == 200


async def test_declared_body_over_cap_is_413_without_the_handler(autojump_clock):
    gate = Gate()
    async with connection(gate) as (peer, _, _, _):
        sid = await peer.request(method=b"POST", headers=[(b"content-length", b"9999999")], end=False)
        await peer.until(lambda: peer.streams[sid].ended or peer.streams[sid].reset_code is not None)
        assert peer.streams[sid].status == 413
        assert gate.requests == []


async def test_streamed_body_crossing_cap_is_413_then_reset_no_error(autojump_clock):
    limits = Listen(max_body_bytes=100_000, max_concurrent_streams=4)
    async with connection(echo, limits=limits) as (peer, _, _, _):
        sid = await peer.request(method=b"POST", end=False)
        for _ in range(7):
            await peer.send(sid, b"z" * 16_384)
        await peer.until(lambda: peer.streams[sid].reset_code is not None)
        assert peer.streams[sid].status == 413
        assert peer.streams[sid].reset_code == ErrorCodes.NO_ERROR


async def test_handler_failing_after_start_resets_stream_internal_error(autojump_clock):
    async def handler(request, sink):
        await sink.start(200, [])
        raise RuntimeError("boom")

    async with connection(Router({b"/bad": handler, b"/": hello})) as (peer, _, _, _):
        bad = await peer.request(b"/bad")
        await peer.until(lambda: peer.streams[bad].reset_code is not None)
        assert peer.streams[bad].reset_code == ErrorCodes.INTERNAL_ERROR
        ok = await peer.request(b"/")
        await peer.until(lambda: peer.streams[ok].ended)
        assert peer.streams[ok].status == 200


async def test_drain_of_a_busy_connection_sends_two_goaways_finishes_in_flight_and_refuses_new(autojump_clock):
    gate = Gate()
    async with connection(Router({b"/wait": gate, b"/": hello})) as (peer, ctx, conn, done):
        in_flight = await peer.request(b"/wait")
        await gate.arrived.wait()
        ctx.draining = True
        conn.drain()
        await trio.sleep(drain_idle_wait_s(LIMITS))  # still busy: the advisory GOAWAY is on its way
        racing = await peer.request(b"/")  # sent before the client has read it: must be served
        await peer.until(lambda: len(peer.goaways) == 2)
        assert peer.goaways[0] == (ErrorCodes.NO_ERROR, MAX_STREAM_ID)
        assert peer.goaways[1] == (ErrorCodes.NO_ERROR, racing)  # after the PING's round trip
        await peer.until(lambda: peer.streams[racing].ended)
        assert peer.streams[racing].status == 200
        late = await peer.request(b"/")  # sent after the real GOAWAY: above its last-stream-id
        await peer.until(lambda: peer.streams[late].reset_code is not None)
        assert peer.streams[late].reset_code == ErrorCodes.REFUSED_STREAM
        gate.release.set()
        await peer.until(lambda: peer.streams[in_flight].ended)
        assert peer.streams[in_flight].body == b"released\n"
        await done.wait()


async def test_drain_of_an_idle_connection_sends_one_goaway_at_once(autojump_clock):
    async with connection(hello) as (peer, ctx, conn, done):
        sid = await peer.request()
        await peer.until(lambda: peer.streams[sid].ended)
        started = trio.current_time()
        ctx.draining = True
        conn.drain()
        await done.wait()
        await peer.until(lambda: peer.goaway is not None)
        assert peer.goaways == [(ErrorCodes.NO_ERROR, sid)]
        assert trio.current_time() == started


async def test_drain_of_a_connection_that_goes_idle_soon_sends_one_goaway(autojump_clock):
    gate = Gate()
    async with connection(Router({b"/wait": gate, b"/": hello})) as (peer, ctx, conn, done):
        in_flight = await peer.request(b"/wait")
        await gate.arrived.wait()
        ctx.draining = True
        conn.drain()
        await trio.sleep(drain_idle_wait_s(LIMITS) / 2)
        gate.release.set()
        await peer.until(lambda: peer.streams[in_flight].ended and peer.goaway is not None)
        await done.wait()
        assert peer.goaways == [(ErrorCodes.NO_ERROR, in_flight)]


async def test_head_response_has_length_but_no_body(autojump_clock):
    async with connection(hello) as (peer, _, _, _):
        sid = await peer.request(method=b"HEAD")
        await peer.until(lambda: peer.streams[sid].ended)
        assert peer.streams[sid].header(b"content-length") == b"6"
        assert peer.streams[sid].body == b""


async def test_many_requests_on_one_connection_keep_h2s_stream_map_bounded(autojump_clock):
    """h2 prunes its closed streams only when asked to count them; we count ours (h2server._H2State),
    so the pruning must still happen: 500 requests in sequence leave a bounded map, and stream
    workers are reused (no task per request)."""
    async with connection(echo) as (peer, _, conn, _):
        for i in range(500):
            sid = await peer.request(b"/", method=b"POST", body=b"%d" % i)
            await peer.until(lambda sid=sid: peer.streams[sid].ended)
            assert peer.streams[sid].body == b"%d" % i
        await trio.testing.wait_all_tasks_blocked()
        assert len(conn.h2.streams) <= 2 * len(conn.streams) + 33
        assert len(conn._idle_workers) == 1  # one worker served them all, one after the other


async def test_a_burst_of_streams_leaves_nothing_behind_once_the_connection_rests(autojump_clock):
    """h2server._at_rest: a client that sent streams at once and then holds the connection idle keeps
    neither h2's closed streams nor a pool of idle workers past REST_RELEASE_S (bench.attacks'
    bad_targets: ~145 such connections held 50,000-230,000 objects for the collector to walk); a
    burst that follows at once finds its workers still there (no task spawned)."""
    gate = Gate()
    async with connection(gate, replace(LIMITS, max_concurrent_streams=32)) as (peer, _, conn, _):
        nursery = trio.lowlevel.current_task().parent_nursery
        assert nursery is not None

        async def burst() -> None:
            gate.requests.clear()
            gate.release = trio.Event()
            sids = [await peer.request(b"/", method=b"GET") for _ in range(24)]
            await trio.testing.wait_all_tasks_blocked()
            assert len(gate.requests) == 24  # 24 workers, one stream each
            gate.release.set()
            await peer.until(lambda: all(peer.streams[sid].ended for sid in sids))
            await trio.testing.wait_all_tasks_blocked()

        await burst()
        assert not conn.streams and len(conn._idle_workers) == 16  # IDLE_WORKERS: the rest ended
        tasks = len(nursery.child_tasks)
        await burst()  # at once: the idle workers take it, 8 more are spawned and end again
        assert len(nursery.child_tasks) == tasks and len(conn._idle_workers) == 16
        await trio.sleep(REST_RELEASE_S)
        await trio.testing.wait_all_tasks_blocked()
        assert len(conn.h2.streams) == 0  # pruned at rest (h2 alone would keep them)
        assert len(conn._idle_workers) == IDLE_WORKERS_AT_REST
        again = await peer.request(b"/", method=b"GET")  # the worker kept serves the next stream
        await peer.until(lambda: peer.streams[again].ended)
        await trio.testing.wait_all_tasks_blocked()
        assert len(conn._idle_workers) == IDLE_WORKERS_AT_REST


async def test_request_trailers_and_a_second_head_take_h2s_own_path(autojump_clock):
    """`_Inbound` cuts a new stream's whole HEADERS frame itself (h2server._WholeHeaders); trailers
    (HEADERS on an open stream) go through h2's own HEADERS handling and reach the handler."""

    async def trailers_echo(request, sink) -> None:
        body = await request.body.read_all()
        await sink.respond(200, [(b"x-trailers", repr(request.trailers).encode())], body)

    async with connection(trailers_echo) as (peer, _, _, _):
        sid = await peer.request(b"/t", method=b"POST", body=b"abc", end=False)
        peer.conn.send_headers(sid, [(b"x-checksum", b"42")], end_stream=True)
        await peer.flush()
        await peer.until(lambda: peer.streams[sid].ended)
        assert (peer.streams[sid].status, peer.streams[sid].body) == (200, b"abc")
        assert peer.streams[sid].header(b"x-trailers") == repr([(b"x-checksum", b"42")]).encode()
        again = await peer.request(b"/t", method=b"POST", body=b"d")  # the next stream's head: the fast path
        await peer.until(lambda: peer.streams[again].ended)
        assert peer.streams[again].body == b"d"


async def test_finished_streams_leave_no_cyclic_garbage(autojump_clock):
    """A finished stream's objects (H2Stream, its sink, body and Request) are freed by reference
    counting: with the cyclic GC off, none of them outlives its stream. A reference cycle per request
    was ~8 objects of garbage each, and the GC passes collecting them were the h2c wire's long pauses."""
    import gc

    from proxy.http.h2stream import H2Body, H2Sink, H2Stream
    from proxy.http.messages import Request

    kinds = (H2Stream, H2Sink, H2Body, Request)
    async with connection(echo) as (peer, _, conn, _):
        gc.collect()
        gc.disable()
        try:
            for i in range(50):
                sid = await peer.request(b"/", method=b"POST", body=b"%d" % i)
                await peer.until(lambda sid=sid: peer.streams[sid].ended)
            await trio.testing.wait_all_tasks_blocked()
            assert not conn.streams
            left = [o for o in gc.get_objects() if type(o) in kinds]
        finally:
            gc.enable()
        assert left == []
