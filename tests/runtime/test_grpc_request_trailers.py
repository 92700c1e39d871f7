"""Request trailers and oversized bodies on gRPC streams (issue 17's remainder).

- A client-streaming / bidi call's body goes upstream as it arrives (h2stream.PassingBody), so
  its trailers are not known when the upstream stream opens: they must still follow the last
  chunk, as a trailing HEADERS with END_STREAM, hop-by-hop fields dropped. The client here is an
  h2 peer on a server connection, the upstream a raw h2 server on 127.0.0.1 that records what
  arrived; the trailers are sent only after the upstream has the first chunk, so the body was
  passed, not read whole.
- A gRPC request that announces a body past listen.max_body_bytes is answered gRPC-shaped:
  HTTP 200, trailers-only, grpc-status 8 (RESOURCE_EXHAUSTED), grpc-message naming the limit.
"""

from __future__ import annotations

import trio

from proxy.core import grpc_wire
from proxy.policy.schema import Listen
from proxy.runtime.relay import forward
from tests.runtime.test_server_h2 import LIMITS
from tests.runtime.test_server_h2 import connection as h2_connection
from tests.runtime.test_upstream_h2 import h2_upstream

GRPC = [(b"content-type", b"application/grpc"), (b"te", b"trailers")]


async def test_trailers_of_a_passed_request_stream_reach_the_upstream():
    first_chunk = trio.Event()

    async def upstream(ex) -> None:
        while not ex.body:
            await trio.sleep(0.01)
        first_chunk.set()
        body = await ex.read_body()
        await ex.start(200, [(b"content-type", b"application/grpc")])
        await ex.send(body)
        ex.conn.h2.send_headers(ex.stream_id, [(b"grpc-status", b"0")], end_stream=True)
        await ex.conn.flush()

    with trio.fail_after(20):
        async with h2_upstream(upstream) as (server, pool):

            async def relay(request, sink) -> None:
                assert not request.body.complete  # the body is still arriving: it can only be passed
                await forward(pool, 0, 10.0, request, request.body.passing(), sink, [])

            async with h2_connection(relay) as (peer, _, _, _):
                sid = await peer.request(b"/test.Echo/ClientStream", method=b"POST", headers=GRPC, end=False)
                await peer.send(sid, grpc_wire.frame(b"part-1"))
                await first_chunk.wait()  # upstream has the first chunk before the client ends its stream
                await peer.send(sid, grpc_wire.frame(b"part-2"))
                peer.conn.send_headers(sid, [(b"x-checksum", b"abc"), (b"connection", b"close")], end_stream=True)
                await peer.flush()
                await peer.until(lambda: peer.streams[sid].ended)
            exchange = server.exchanges[0]
            assert bytes(exchange.body) == grpc_wire.frame(b"part-1") + grpc_wire.frame(b"part-2")
            assert exchange.trailers == [(b"x-checksum", b"abc")]  # hop-by-hop fields never go on


async def test_a_passed_request_stream_without_trailers_ends_with_end_stream():
    async def upstream(ex) -> None:
        await ex.respond(200, await ex.read_body())

    with trio.fail_after(20):
        async with h2_upstream(upstream) as (server, pool):

            async def relay(request, sink) -> None:
                await forward(pool, 0, 10.0, request, request.body.passing(), sink, [])

            async with h2_connection(relay) as (peer, _, _, _):
                sid = await peer.request(b"/test.Echo/ClientStream", method=b"POST", headers=GRPC, end=False)
                await peer.send(sid, b"one")
                await trio.sleep(0.05)
                await peer.send(sid, b"two", end=True)
                await peer.until(lambda: peer.streams[sid].ended)
                assert peer.streams[sid].body == b"onetwo"
            assert server.exchanges[0].trailers is None


async def test_a_grpc_request_announcing_a_body_past_max_body_bytes_is_resource_exhausted(autojump_clock):
    async def never(request, sink) -> None:
        raise AssertionError("the handler must not run")

    async with h2_connection(never) as (peer, _, _, _):
        too_big = [*GRPC, (b"content-length", b"%d" % (LIMITS.max_body_bytes + 1))]
        sid = await peer.request(b"/test.Echo/Unary", method=b"POST", headers=too_big, end=False)
        await peer.until(lambda: peer.streams[sid].ended)
        answer = peer.streams[sid]
        assert answer.status == 200 and answer.body == b""
        assert answer.header(b"grpc-status") == b"8"
        assert answer.header(b"content-type") == b"application/grpc"
        message = answer.header(b"grpc-message") or b""
        assert b"larger than %d bytes" % LIMITS.max_body_bytes in message and b"max_body_bytes" in message
        assert answer.header(b"grpc-retry-pushback-ms") == b"-1"  # the same call again is as large


async def test_a_plain_request_announcing_a_body_past_max_body_bytes_is_still_413(autojump_clock):
    async def never(request, sink) -> None:
        raise AssertionError("the handler must not run")

    async with h2_connection(never) as (peer, _, _, _):
        headers = [(b"content-length", b"%d" % (LIMITS.max_body_bytes + 1))]
        sid = await peer.request(b"/v1/x", method=b"POST", headers=headers, end=False)
        await peer.until(lambda: peer.streams[sid].ended)
        assert peer.streams[sid].status == 413


def _answers_then_reads(content_type: bytes, reply: bytes):
    """A handler whose response starts (head and `reply`) before it reads the request body whole."""

    async def handler(request, sink) -> None:
        await sink.start(200, [(b"content-type", content_type)])
        await sink.send(reply)
        await request.body.read_all()  # the body passes max_body_bytes: BodyTooLarge
        raise AssertionError("the body was larger than the limit")

    return handler


SMALL = Listen(max_body_bytes=100_000, max_concurrent_streams=4)  # within the stream's first window


async def _past_the_limit(peer, sid: int) -> None:
    for _ in range(SMALL.max_body_bytes // 16_384 + 1):
        await peer.send(sid, b"z" * 16_384)
    await peer.until(lambda: peer.streams[sid].ended or peer.streams[sid].reset_code is not None)


async def test_a_grpc_stream_past_max_body_bytes_after_its_response_started_ends_resource_exhausted(autojump_clock):
    """The head went out, so no trailers-only answer is possible: the status goes in trailers after what was
    sent (here half a message: grpc-core reports the trailers' status even so), and the client is then asked
    to stop sending (RST_STREAM NO_ERROR), as for any answer that came before the request's end."""
    half = grpc_wire.frame(b"a reply")[:6]
    async with h2_connection(_answers_then_reads(b"application/grpc", half), SMALL) as (peer, _, _, _):
        sid = await peer.request(b"/test.Echo/Bidi", method=b"POST", headers=GRPC, end=False)
        await _past_the_limit(peer, sid)
        answer = peer.streams[sid]
        assert answer.status == 200 and answer.body == half and answer.ended
        trailers = dict(answer.trailers or [])
        assert trailers[b"grpc-status"] == b"8"
        assert b"larger than %d bytes" % SMALL.max_body_bytes in trailers[b"grpc-message"]
        assert trailers[b"grpc-retry-pushback-ms"] == b"-1"
        assert b"content-type" not in trailers  # a trailer section carries no head fields
        await peer.until(lambda: answer.reset_code is not None)
        assert answer.reset_code == 0  # NO_ERROR: stop sending, the answer is complete


async def test_a_plain_stream_past_max_body_bytes_after_its_response_started_is_still_reset(autojump_clock):
    async with h2_connection(_answers_then_reads(b"text/plain", b"partial"), SMALL) as (peer, _, _, _):
        sid = await peer.request(b"/v1/x", method=b"POST", end=False)
        await _past_the_limit(peer, sid)
        assert peer.streams[sid].reset_code == 2  # INTERNAL_ERROR: an HTTP client must see a broken response
        assert peer.streams[sid].trailers is None
