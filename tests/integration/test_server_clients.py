"""The front-end server on a real loopback socket, driven by real clients: curl, httpx, h2load.

The server runs in the test's own trio loop; clients are subprocesses or httpx (on
trio through anyio). Every test is bounded by trio.fail_after.
"""

from __future__ import annotations

import re
from contextlib import asynccontextmanager

import httpx
import pytest
import trio

from proxy.http.server import Server
from proxy.metrics import Metrics
from proxy.policy.schema import Listen
from proxy.testing.handlers import Gate, Router, blob, echo, hello, pattern, stream_echo
from tests.conftest import require_binary

pytestmark = pytest.mark.integration
TEN_MB = 10 * 1024 * 1024


@asynccontextmanager
async def serving(handler, limits: Listen | None = None, metrics: Metrics | None = None):
    server = Server(handler, limits or Listen(), metrics=metrics)
    async with trio.open_nursery() as nursery:
        address = await nursery.start(server.serve, "127.0.0.1:0")
        yield server, address
        nursery.cancel_scope.cancel()


async def run(*argv: str, stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
    result = await trio.run_process(list(argv), stdin=stdin, capture_stdout=True, capture_stderr=True, check=False)
    return result.returncode, result.stdout, result.stderr


ROUTES = Router(
    {
        b"/hello": hello,
        b"/echo": echo,
        b"/stream": stream_echo,
        b"/big": blob(TEN_MB, streamed=True),
    }
)


@pytest.mark.parametrize("version", ["--http1.1", "--http2-prior-knowledge"])
async def test_curl_get_and_post(version):
    curl = require_binary("curl")
    with trio.fail_after(30):
        async with serving(ROUTES) as (server, address):
            code, out, _ = await run(curl, "-sS", version, "-i", f"http://{address}/hello")
            assert code == 0
            assert re.match(rb"HTTP/(1\.1|2) 200", out) and out.endswith(b"\r\n\r\nhello\n")
            code, out, _ = await run(
                curl,
                "-sS",
                version,
                "--data-binary",
                "@-",
                f"http://{address}/echo",
                stdin=b"posted",
            )
            assert (code, out) == (0, b"posted")
            stats = server.statistics()
            assert stats.requests_total == 2 and stats.protocol_errors == 0


async def test_curl_sends_expect_100_continue_for_large_bodies_and_gets_it(tmp_path):
    curl = require_binary("curl")
    body = pattern(2 * 1024 * 1024)  # curl asks for 100-continue above 1 MB (from a file, not stdin)
    (tmp_path / "body").write_bytes(body)
    with trio.fail_after(30):
        async with serving(ROUTES) as (_, address):
            code, out, err = await run(
                curl,
                "-sS",
                "-v",
                "--http1.1",
                "--data-binary",
                f"@{tmp_path / 'body'}",
                f"http://{address}/echo",
            )
            assert code == 0 and out == body
            assert b"Expect: 100-continue" in err and b"HTTP/1.1 100 Continue" in err


async def test_curl_body_over_cap_gets_413_without_sending_it(tmp_path):
    curl = require_binary("curl")
    gate = Gate()
    (tmp_path / "body").write_bytes(pattern(2 * 1024 * 1024))
    with trio.fail_after(30):
        async with serving(gate, Listen(max_body_bytes=1024 * 1024)) as (_, address):
            code, out, err = await run(
                curl,
                "-sS",
                "-v",
                "--http1.1",
                "--data-binary",
                f"@{tmp_path / 'body'}",
                f"http://{address}/",
            )
            assert code == 0 and b"< HTTP/1.1 413" in err and b"larger than 1048576 bytes" in out
            assert b"100 Continue" not in err
            assert gate.requests == []


@pytest.mark.parametrize("http2", [False, True])
async def test_httpx_ten_megabytes_both_directions(http2):
    body = pattern(TEN_MB)
    with trio.fail_after(60):
        async with (
            serving(ROUTES) as (_, address),
            httpx.AsyncClient(http1=not http2, http2=http2, timeout=30) as client,
        ):
            up = await client.post(f"http://{address}/echo", content=body)
            assert up.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
            assert up.status_code == 200 and up.content == body
            down = await client.get(f"http://{address}/big")  # streamed: chunked on HTTP/1.1
            assert down.status_code == 200 and down.content == pattern(TEN_MB)
            # A streamed echo of a small body (a 10 MB one would deadlock: httpx writes the
            # whole request before it reads, and the echo waits for it to read).
            streamed = await client.post(f"http://{address}/stream", content=body[:100_000])
            assert streamed.content == body[:100_000]


async def test_httpx_http2_runs_streams_concurrently_on_one_connection():
    gates = [Gate() for _ in range(5)]
    routes = Router({f"/{i}".encode(): gate for i, gate in enumerate(gates)})
    with trio.fail_after(30):
        async with (
            serving(routes) as (server, address),
            httpx.AsyncClient(http1=False, http2=True, timeout=20) as client,
        ):
            results: dict[int, bytes] = {}

            async def fetch(i: int) -> None:
                results[i] = (await client.get(f"http://{address}/{i}")).content

            async with trio.open_nursery() as nursery:
                for i in range(len(gates)):
                    nursery.start_soon(fetch, i)
                for gate in gates:
                    await gate.arrived.wait()  # all five in their handlers at once
                assert server.statistics().connections_h2 == 1
                assert server.statistics().requests_in_flight == 5
                for gate in reversed(gates):
                    gate.release.set()
            assert results == {i: b"released\n" for i in range(5)}


@pytest.mark.parametrize("protocol", ["--h1", None])
async def test_h2load_all_requests_succeed(protocol):
    h2load = require_binary("h2load")
    metrics = Metrics()
    with trio.fail_after(120):
        async with serving(ROUTES, metrics=metrics) as (_, address):
            argv = [h2load, "-n", "2000", "-c", "4", "-m", "10", f"http://{address}/hello"]
            code, out, err = await run(*argv, *([protocol] if protocol else []))
            assert code == 0, err
            assert b"2000 succeeded, 0 failed, 0 errored" in out, out
    label = "http1" if protocol else "h2"
    done = {
        s.labels["code"]: s.value
        for s in metrics.requests.collect()[0].samples
        if s.name.endswith("_total") and s.labels["protocol"] == label
    }
    assert done == {"200": 2000.0}
