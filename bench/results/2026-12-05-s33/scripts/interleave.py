"""Does interleaving requests make the policy dearer? bench.policy_path's loop, with the stand-in upstream's
first receive (the full path) or read (the wire's relay) yielding to the scheduler once (a trio checkpoint,
as a real socket read waits) and K requests in
flight at a time (K tasks in one nursery, each its own requests), for the wire and the full sidecar alike:
the policy's CPU a request (full - wire) with K = 1 (one request at a time, as bench.policy_path) and K = 10
(h2load's 10 clients over the wire), alternated.

    python bench/results/2026-12-05-s33/scripts/interleave.py [REPEATS]
"""
import os
import statistics
import sys
import time

import trio

sys.path.insert(0, os.getcwd())
import bench.policy_path as pp  # noqa: E402
from proxy.http.messages import Request  # noqa: E402

_real_receive, _real_read = pp._Response.receive, pp._Response.read


async def _receive(self):
    if len(self._parts) == 2:  # the first receive: the upstream's answer is waited for, as on a socket
        await trio.lowlevel.checkpoint()
    return await _real_receive(self)


async def _read(self):  # the wire configuration's relay reads the body whole
    await trio.lowlevel.checkpoint()
    return await _real_read(self)


pp._Response.receive, pp._Response.read = _receive, _read


async def drive(handler, n: int, k: int) -> float:
    async def one_client(count: int) -> None:
        body = pp._Body()
        for _ in range(count):
            request = Request(b"GET", b"/v1/x", list(pp._REQUEST_HEADERS), body, http_version="1.1",
                              client="127.0.0.1", received_at=trio.current_time())
            sink = pp.Sink()
            await handler(request, sink)
            if sink.status != 200:
                raise SystemExit(f"answered {sink.status}")

    t0 = time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(k):
            nursery.start_soon(one_client, n // k)
    return (time.process_time() - t0) / n * 1e6


async def main(repeats: int) -> None:
    full, _app = pp.full_handler()
    wire, _ = pp.wire_handler()
    n = 20000
    figures = {(k, c): [] for k in (1, 10) for c in ("wire", "full")}
    for k in (1, 10):
        await drive(full, 2000, k)
        await drive(wire, 2000, k)
    for r in range(repeats):
        for k in (1, 10) if r % 2 == 0 else (10, 1):
            for c, h in (("wire", wire), ("full", full)):
                figures[(k, c)].append(await drive(h, n, k))
    for k in (1, 10):
        w, f = figures[(k, "wire")], figures[(k, "full")]
        pol = [b - a for a, b in zip(w, f)]
        print(f"K={k:2d}: wire {statistics.median(w):.1f} full {statistics.median(f):.1f} us a request; "
              f"policy (pairwise) median {statistics.median(pol):.1f} min {min(pol):.1f} max {max(pol):.1f}", flush=True)


trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 5)
