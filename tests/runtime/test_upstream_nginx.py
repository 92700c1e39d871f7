"""The upstream pool against a real server: nginx on loopback, HTTP/1.1 and h2c (prior knowledge).

nginx answers `/` with `$connection` (its connection serial number), so a test
can tell which connection served each request.
"""

from __future__ import annotations

import trio

from proxy.http.pool import UpstreamPool
from proxy.policy.schema import Upstream
from tests.runtime.raw_servers import nginx

HOST = [(b"host", b"nginx.test")]
TEN_MB = 10 * 1024 * 1024


async def fetch(pool: UpstreamPool, target=b"/") -> tuple[int, bytes]:
    async with pool.request(0, b"GET", target, HOST) as resp:
        return resp.status, await resp.read()


def pool_for(port: int, protocol: str) -> UpstreamPool:
    return UpstreamPool([Upstream(url=f"http://127.0.0.1:{port}", protocol=protocol)])


async def test_keep_alive_and_multiplexing_use_one_nginx_connection(tmp_path):
    with nginx(tmp_path) as ports, trio.fail_after(60):
        async with pool_for(ports["h1"], "http1") as pool:
            seen = {await fetch(pool) for _ in range(10)}
            assert len(seen) == 1 and next(iter(seen))[0] == 200
        async with pool_for(ports["h2"], "h2c") as pool:
            results: list = []

            async def one() -> None:
                results.append(await fetch(pool))

            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(one)
            assert len(results) == 20 and len(set(results)) == 1
            assert pool.statistics()[0].open_connections == 1


async def test_ten_megabyte_download_on_both_protocols(tmp_path):
    expected = bytes(range(256)) * (TEN_MB // 256)
    with nginx(tmp_path, big_bytes=TEN_MB) as ports, trio.fail_after(60):
        for port, protocol in ((ports["h1"], "http1"), (ports["h2"], "h2c")):
            async with pool_for(port, protocol) as pool:
                assert await fetch(pool, b"/big") == (200, expected)


async def test_nginx_closing_after_keepalive_requests(tmp_path):
    """h1: `connection: close` on the last response; h2: GOAWAY. Every request still succeeds."""
    with nginx(tmp_path, keepalive_requests=3) as ports, trio.fail_after(60):
        for port, protocol in ((ports["h1"], "http1"), (ports["h2"], "h2c")):
            async with pool_for(port, protocol) as pool:
                results = [await fetch(pool) for _ in range(10)]
                assert {status for status, _ in results} == {200}
                assert len({body for _, body in results}) == 4  # 3 + 3 + 3 + 1 requests per connection
                assert pool.statistics()[0].open_connections <= 1


async def test_h2_goaway_churn_under_concurrency_loses_no_request(tmp_path):
    """40 streams at once, 10 requests per connection: a refused stream's retry is refused again (one retry lost 20)."""
    with nginx(tmp_path, keepalive_requests=10) as ports, trio.fail_after(60):
        async with pool_for(ports["h2"], "h2c") as pool:
            statuses: list[int] = []

            async def one() -> None:
                statuses.append((await fetch(pool))[0])

            async with trio.open_nursery() as nursery:
                for _ in range(40):
                    nursery.start_soon(one)
            assert statuses == [200] * 40
