"""What one Python call costs over the wire: the wire configuration of bench.overhead plus K extra
calls a request, each a distinct small function of policy-like shape (two attribute reads, a dict
get, arithmetic, an attribute write), K = 0, 50, 100, 200, alternated. CPU us a request of the
server process from /proc under unthrottled h2load (10 clients), HTTP/1.1 and h2c.

    python bench/results/2026-12-05-s32/scripts/slope.py [SECONDS] [PAIRS]
Child mode: slope.py --serve K ADDRESS UPSTREAM
"""
import os, subprocess, sys, time, json, statistics
sys.path.insert(0, os.getcwd())


def make_steps(k: int):
    """K distinct functions (distinct code objects), as a policy's small methods are."""
    src = []
    for i in range(k):
        src.append(
            f"def f{i}(s, d):\n"
            f"    v = s.a * {i + 1}.5 + s.b\n"
            f"    s.b = d.get({i % 7}, 0) + v - s.a * {i + 1}.5\n"
            f"    return v\n"
        )
    ns: dict = {}
    exec("\n".join(src), ns)
    return [ns[f"f{i}"] for i in range(k)]


class State:
    __slots__ = ("a", "b")

    def __init__(self) -> None:
        self.a, self.b = 1.0, 0.0


def serve(k: int, address: str, upstream_url: str) -> None:
    import trio
    from functools import partial
    from proxy.http import forward, heap
    from proxy.http.pool import UpstreamPool
    from proxy.http.server import Server
    from proxy.metrics import Metrics
    from proxy.policy.schema import Upstream
    from proxy.testing.procs import print_ready

    steps, st, d = make_steps(k), State(), {i: i for i in range(7)}

    async def main() -> None:
        metrics = Metrics()
        async with UpstreamPool([Upstream(url=upstream_url)], metrics=metrics) as pool:
            authority = pool.authority(0)

            async def relay(request, sink) -> None:
                for f in steps:
                    f(st, d)
                body = await request.body.read_all()
                headers = forward.request_headers(request, authority)
                async with pool.request(0, request.method, request.target, headers, body) as resp:
                    out = forward.response_headers(resp.headers, resp.http_version)
                    await sink.respond(resp.status, out, await resp.read())

            async with trio.open_nursery() as nursery:
                bound = await nursery.start(Server(relay, metrics=metrics).serve, address)
                heap.settle()
                print_ready({"data": bound})

    trio.run(main)


def measure(k: int, proto: str, secs: float, ng) -> tuple[float, float]:
    from bench.common import cpu_seconds
    p = ["--h1", "-m", "1"] if proto == "http1" else ["-m", "10"]
    w = subprocess.Popen(["taskset", "-c", "0", sys.executable, __file__, "--serve", str(k), "127.0.0.1:0", ng.h1_url],
                         stdout=subprocess.PIPE, text=True)
    try:
        line = w.stdout.readline()
        url = "http://" + line.split('"data": "')[1].split('"')[0] + "/"
        subprocess.run(["taskset", "-c", "1", "h2load", "-c10", *p, "-n", "3000", url], capture_output=True)
        h = subprocess.Popen(["taskset", "-c", "1", "h2load", "-c10", *p, "-D", str(int(secs) + 2), url], stdout=subprocess.PIPE, text=True)
        time.sleep(1.0); c0, t0 = cpu_seconds(w.pid), time.time()
        time.sleep(secs)
        c1, t1 = cpu_seconds(w.pid), time.time()
        o = h.communicate()[0]
        rps = float([l for l in o.splitlines() if l.startswith("finished in")][0].split(",")[1].split()[0])
        return rps, (c1 - c0) / (rps * (t1 - t0)) * 1e6
    finally:
        w.terminate(); w.wait(10)


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]), sys.argv[3], sys.argv[4]); return
    from bench.common import Nginx
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 8
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    ng = Nginx(cpu=1)
    ks = (0, 50, 100, 200)
    rows = []
    try:
        for r in range(pairs):
            for proto in ("http1", "h2c"):
                for k in (ks if r % 2 == 0 else ks[::-1]):
                    rps, us = measure(k, proto, secs, ng)
                    rows.append({"repeat": r, "proto": proto, "k": k, "rps": rps, "cpu_us": us})
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        ng.stop()
    for proto in ("http1", "h2c"):
        med = {k: statistics.median(x["cpu_us"] for x in rows if x["proto"] == proto and x["k"] == k) for k in ks}
        slopes = [(med[k] - med[0]) / k for k in ks[1:]]
        print(proto, " ".join(f"K={k}: {med[k]:.1f} us" for k in ks), "| us per call:", " ".join(f"{s:.2f}" for s in slopes))


if __name__ == "__main__":
    main()
