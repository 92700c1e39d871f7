"""Requests/s of the upstream client alone (pool or bare connections) against a fast server.

Usage (nginx answering `return 200 "ok"` on 127.0.0.1, h2c with `listen ... http2`):
    taskset -c 1 python -m bench.upstream_client --url http://127.0.0.1:18081 --mode pool --concurrency 16 --seconds 5
    taskset -c 1 python -m bench.upstream_client --url http://127.0.0.1:18082 --protocol h2c --mode conn
    ... --profile  (cProfile, top 25 by own time)

Modes: `pool` drives UpstreamPool.request (what the sidecar does); `conn` drives
H1UpstreamConnection/H2UpstreamConnection directly (what the load generator does), one h1
connection per task or one shared h2 connection.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import trio

from proxy.http.pool import UpstreamPool, parse_url
from proxy.http.upstream_h1 import H1UpstreamConnection
from proxy.http.upstream_h2 import H2UpstreamConnection
from proxy.policy.schema import Upstream

HEADERS = [
    (b"host", b"bench"),
    (b"user-agent", b"rampmeter-bench"),
    (b"accept", b"*/*"),
    (b"x-forwarded-for", b"127.0.0.1"),
    (b"x-forwarded-proto", b"http"),
    (b"via", b"1.1 rampmeter"),
]


async def run(args: argparse.Namespace) -> None:
    host, port, _ = parse_url(args.url)
    latencies: list[float] = []
    deadline = trio.current_time() + args.seconds
    cpu0 = time.process_time()

    async def timed(send) -> None:
        while trio.current_time() < deadline:
            t0 = trio.current_time()
            await send()
            latencies.append(trio.current_time() - t0)

    async with trio.open_nursery() as nursery:
        if args.mode == "pool":
            pool = await nursery.start(_pool_task, Upstream(url=args.url, protocol=args.protocol))

            async def send() -> None:
                async with pool.request(0, b"GET", b"/", HEADERS) as resp:
                    while await resp.receive():
                        pass

            async with trio.open_nursery() as workers:
                for _ in range(args.concurrency):
                    workers.start_soon(timed, send)
            nursery.cancel_scope.cancel()
        elif args.protocol == "h2c":
            conn = await H2UpstreamConnection.open(host, port, nursery=nursery)

            async def send() -> None:
                resp = await conn.send_request(b"GET", b"/", HEADERS)
                await resp.read()
                await resp.aclose()

            async with trio.open_nursery() as workers:
                for _ in range(args.concurrency):
                    workers.start_soon(timed, send)
            conn.close()
        else:

            async def worker() -> None:
                conn = await H1UpstreamConnection.open(host, port)

                async def send() -> None:
                    resp = await conn.send_request(b"GET", b"/", HEADERS)
                    await resp.read()
                    await resp.aclose()

                await timed(send)
                conn.close()

            async with trio.open_nursery() as workers:
                for _ in range(args.concurrency):
                    workers.start_soon(worker)
    cpu = time.process_time() - cpu0
    latencies.sort()
    n = len(latencies)
    # On a shared machine wall-clock req/s depends on the neighbours; CPU per request does not.
    print(
        f"{args.mode} {args.protocol} c={args.concurrency}: {n / args.seconds:,.0f} req/s wall, "
        f"{cpu / n * 1e6:.0f} us CPU/request = {n / cpu:,.0f} req/s per core, "
        f"p50 {latencies[n // 2] * 1e3:.2f} ms, p99 {latencies[int(n * 0.99)] * 1e3:.2f} ms ({n} requests)"
    )


async def _pool_task(upstream: Upstream, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with UpstreamPool([upstream]) as pool:
        task_status.started(pool)
        await trio.sleep_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:18081")
    p.add_argument("--protocol", choices=("http1", "h2c"), default="http1")
    p.add_argument("--mode", choices=("pool", "conn"), default="pool")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--repeat", type=int, default=1, help="runs; on a shared machine read the best")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(trio.run, run, args)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    else:
        for _ in range(args.repeat):
            trio.run(run, args)


if __name__ == "__main__":
    main()
