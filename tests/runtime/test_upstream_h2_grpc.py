"""The upstream h2 client against a real grpcio server on 127.0.0.1: trailers kept (issue 17)."""

from __future__ import annotations

import pytest

from proxy.core import grpc_wire
from proxy.http.upstream_h2 import H2UpstreamConnection
from proxy.testing import grpc_servicer as gs


@pytest.fixture
def echo():
    with gs.serve(workers=4) as server:
        yield server


def block(port: int, path: bytes) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":authority", b"127.0.0.1:%d" % port),
        (b":path", path),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]


async def test_a_unary_answer_ends_with_its_trailers(echo):
    async with H2UpstreamConnection.connect("127.0.0.1", echo.port) as conn:
        resp = await conn.send(block(echo.port, b"/test.Echo/Unary"), grpc_wire.frame(b"hi"))
        async with resp:
            assert grpc_wire.unframe(await resp.read()) == b"hi"
            assert (b"x-echo-initial", b"yes") in resp.headers
            assert resp.trailers is not None
            assert grpc_wire.status_of(resp.trailers) == 0
            assert (b"x-echo-trailer", b"done") in resp.trailers


async def test_a_trailers_only_answer_has_its_status_in_the_head_and_no_trailers(echo):
    async with H2UpstreamConnection.connect("127.0.0.1", echo.port) as conn:
        resp = await conn.send(block(echo.port, b"/test.Echo/Fail"), grpc_wire.frame(b"x"))
        async with resp:
            assert await resp.read() == b""
            assert resp.trailers is None
            assert grpc_wire.status_of(resp.headers) == grpc_wire.Code.INVALID_ARGUMENT
