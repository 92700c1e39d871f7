"""Every framing rule of upstream responses (proxy/http/h1parse.py, ResponseParser), one test each.

The upstream is a scripted raw server on 127.0.0.1 in the test's trio run: it reads
request heads and answers each with the next bytes of its script, on the same
connection, so both what the pool delivers and whether it reused the connection are
exact.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from proxy.errors import UpstreamProtocolError
from proxy.http.pool import UpstreamPool
from proxy.policy.schema import Upstream

HOST = [(b"host", b"upstream.test")]


class Scripted:
    """Answers the n-th request on any connection with `script[n]` (then closes if `close` says so)."""

    def __init__(self, script: list[bytes]) -> None:
        self.script = list(script)
        self.connections = 0
        self.requests = 0

    async def serve(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        buf = b""
        try:
            while self.script:
                while b"\r\n\r\n" not in buf:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buf += data
                _, _, buf = buf.partition(b"\r\n\r\n")
                self.requests += 1
                await stream.send_all(self.script.pop(0))
            await stream.receive_some(65536)  # hold the connection open until the client leaves
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


@asynccontextmanager
async def upstream(*script: bytes):
    server = Scripted(list(script))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, server.serve, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            async with UpstreamPool([Upstream(url=f"http://127.0.0.1:{port}")]) as pool:
                yield server, pool
            nursery.cancel_scope.cancel()


async def fetch(pool: UpstreamPool, method: bytes = b"GET") -> tuple[int, bytes]:
    async with pool.request(0, method, b"/", HOST) as resp:
        return resp.status, await resp.read()


OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\ncontent-length: x2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"F" * 20 + b"\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nabc",
        b"HTTP/1.1 200 OK\ncontent-length: 2\n\nok",
        b"HTTP/1.1 200 OK\r\nx-a: b\r\n c\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\nconnection: upgrade\r\n\r\n",
        b"SPDY/9 what\r\n\r\n",
    ],
    ids=[
        "cl-with-te",
        "duplicate-cl",
        "invalid-cl",
        "chunk-overflow",
        "te-gzip",
        "bare-lf",
        "obs-fold",
        "unasked-101",
        "garbage",
    ],
)
async def test_broken_framing_is_a_protocol_error_and_the_connection_is_dropped(raw):
    async with upstream(raw, OK) as (_server, pool):
        with pytest.raises(UpstreamProtocolError) as info:
            await fetch(pool)
        assert info.value.request_sent is True
        assert pool.statistics()[0].open_connections == 0


async def test_truncated_body_is_an_error_at_eof():
    raw = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\nconnection: close\r\n\r\nshort"

    async def close_after(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(raw)
        await stream.aclose()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, close_after, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
            async with (
                UpstreamPool([Upstream(url=f"http://127.0.0.1:{port}")]) as pool,
                pool.request(0, b"GET", b"/", HOST) as resp,
            ):
                assert await resp.receive() == b"short"
                with pytest.raises(UpstreamProtocolError):
                    await resp.receive()
            nursery.cancel_scope.cancel()


async def test_informational_answers_are_skipped():
    async with upstream(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: x\r\n\r\n" + OK, OK) as (
        server,
        pool,
    ):
        assert await fetch(pool) == (200, b"ok")
        assert await fetch(pool) == (200, b"ok")
        assert server.connections == 1


@pytest.mark.parametrize("code", [204, 304])
async def test_204_and_304_have_no_body_whatever_their_length_says(code):
    raw = b"HTTP/1.1 %d X\r\ncontent-length: 5\r\n\r\n" % code
    async with upstream(raw, OK) as (server, pool):
        assert await fetch(pool) == (code, b"")
        assert await fetch(pool) == (200, b"ok")  # the next answer was not taken for a body
        assert server.connections == 1


async def test_head_answer_does_not_wait_for_the_body_its_length_describes():
    async with upstream(b"HTTP/1.1 200 OK\r\ncontent-length: 5000\r\n\r\n", OK) as (server, pool):
        assert await fetch(pool, b"HEAD") == (200, b"")
        assert await fetch(pool) == (200, b"ok")
        assert server.connections == 2  # not reused after a HEAD (h1parse: llhttp cannot be told)


@pytest.mark.parametrize(
    ("raw", "reused"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok", False),
        (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", False),
        (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\nok", True),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-trailer: 1\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokUNASKED", False),
    ],
    ids=["connection-close", "http10", "http10-keep-alive", "chunked-with-trailer", "bytes-after-the-answer"],
)
async def test_keep_alive_follows_the_answer(raw, reused):
    async with upstream(raw, OK) as (server, pool):
        assert await fetch(pool) == (200, b"ok")
        assert await fetch(pool) == (200, b"ok")
        assert server.connections == (1 if reused else 2)


async def test_response_head_over_the_cap_is_an_error():
    raw = b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 70_000 + b"\r\ncontent-length: 2\r\n\r\nok"
    async with upstream(raw) as (_server, pool):
        with pytest.raises(UpstreamProtocolError, match="larger"):
            await fetch(pool)
