"""What slope.py, floor.py and interp.py share: a server process measured under h2load, and a server
built from bench.overhead's wire configuration with a handler of one's own.

`cpu_per_request(argv, proto, secs)`: start `argv` on CPU 0 (it prints the ready line with its data
address), 3,000 warm-up requests, then unthrottled h2load (10 clients; HTTP/1.1 `--h1 -m1`, h2c `-m10`)
on CPU 1 for `secs`: (req/s, CPU us a request of the server from /proc). `record(rows, argv, proto, secs,
**labels)`: that, appended to `rows` with its labels and printed as a JSON line. `pairwise(xs, ys)`: the
medians of two alternated series and of their pairwise differences (min and max too), as one line.
"""
import json
import statistics
import subprocess
import time

from bench.common import cpu_seconds

H2LOAD = {"http1": ["--h1", "-m", "1"], "h2c": ["-m", "10"]}


def cpu_per_request(argv: list[str], proto: str, secs: int) -> tuple[float, float]:
    w = subprocess.Popen(["taskset", "-c", "0", *argv], stdout=subprocess.PIPE, text=True)
    try:
        line = w.stdout.readline()
        url = "http://" + line.split('"data": "')[1].split('"')[0] + "/"
        load = ["taskset", "-c", "1", "h2load", "-c10", *H2LOAD[proto]]
        subprocess.run([*load, "-n", "3000", url], capture_output=True)
        h = subprocess.Popen([*load, "-D", str(secs + 2), url], stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        c0, t0 = cpu_seconds(w.pid), time.time()
        time.sleep(secs)
        c1, t1 = cpu_seconds(w.pid), time.time()
        out = h.communicate()[0]
        rps = float([x for x in out.splitlines() if x.startswith("finished in")][0].split(",")[1].split()[0])
        return rps, (c1 - c0) / (rps * (t1 - t0)) * 1e6
    finally:
        w.terminate()
        w.wait(10)


def record(rows: list[dict], argv: list[str], proto: str, secs: int, **labels: object) -> None:
    rps, us = cpu_per_request(argv, proto, secs)
    rows.append({**labels, "proto": proto, "rps": rps, "cpu_us": us})
    print(json.dumps(rows[-1]), flush=True)


def pairwise(xs: list[float], ys: list[float]) -> str:
    """`ys - xs`, pair by pair (each pair from one repeat), with both medians."""
    d = [y - x for x, y in zip(xs, ys)]
    return (f"{statistics.median(xs):.1f} -> {statistics.median(ys):.1f} us; difference (pairwise) median "
            f"{statistics.median(d):.1f} min {min(d):.1f} max {max(d):.1f} us")


def serve(address: str, upstream_url: str, make_handler) -> None:
    """bench.overhead.serve_wire's server and pool, with `make_handler(pool, authority, forward)` as the
    handler (`forward`: proxy.http.forward, for the hop-by-hop headers both ways)."""
    import trio

    from proxy.http import forward, heap
    from proxy.http.pool import UpstreamPool
    from proxy.http.server import Server
    from proxy.metrics import Metrics
    from proxy.policy.schema import Upstream
    from proxy.testing.procs import print_ready

    async def main() -> None:
        metrics = Metrics()
        async with UpstreamPool([Upstream(url=upstream_url)], metrics=metrics) as pool:
            handler = make_handler(pool, pool.authority(0), forward)
            async with trio.open_nursery() as nursery:
                bound = await nursery.start(Server(handler, metrics=metrics).serve, address)
                heap.settle()
                print_ready({"data": bound})

    trio.run(main)
