"""The floor of any per-request policy over this wire: the wire configuration of bench.overhead plus
the least a sidecar of this kind does to every request, with the project's own pieces where they
exist: one pass over the headers (proxy/runtime/fields.py Fields.read), a request id made
(proxy/core/request_ids.make) and sent up and down, a concurrency limit as a counter (admit: a
compare and an increment; release: a decrement), the service time appended to a sample list (folded
elsewhere), a queue-ms header upstream, a class header down, two plain counters. No classification,
cost, SJF, deadline, gate, lease object, hint, usage parse, readiness or access log: what issue 16's
target would have to hold all of those in besides. Alternated with the wire alone; CPU us a request
from /proc under unthrottled h2load (10 clients; h1 -m1, h2c -m10).

    python bench/results/2026-12-05-s32/scripts/floor.py [SECONDS] [REPEATS]
Child mode: floor.py --serve wire|floor ADDRESS UPSTREAM
"""
import json, os, random, statistics, subprocess, sys, time
sys.path.insert(0, os.getcwd())


class Counter:
    __slots__ = ("used", "limit", "samples", "admitted", "released")

    def __init__(self, limit: int) -> None:
        self.used, self.limit, self.samples, self.admitted, self.released = 0, limit, [], 0, 0

    def admit(self) -> bool:
        if self.used >= self.limit:
            return False
        self.used += 1
        self.admitted += 1
        return True

    def release(self, service_s: float) -> None:
        self.used -= 1
        self.released += 1
        samples = self.samples
        samples.append(service_s)
        if len(samples) >= 64:
            samples.clear()  # a fold would go here


def serve(mode: str, address: str, upstream_url: str) -> None:
    import trio
    from proxy.core import request_ids
    from proxy.http import forward, heap
    from proxy.http.pool import UpstreamPool
    from proxy.http.server import Server
    from proxy.metrics import Metrics
    from proxy.policy.schema import Upstream
    from proxy.runtime.fields import Fields
    from proxy.testing.procs import print_ready

    bits = random.Random().getrandbits
    limit = Counter(100000)

    async def main() -> None:
        metrics = Metrics()
        async with UpstreamPool([Upstream(url=upstream_url)], metrics=metrics) as pool:
            authority = pool.authority(0)

            async def wire(request, sink) -> None:
                body = await request.body.read_all()
                headers = forward.request_headers(request, authority)
                async with pool.request(0, request.method, request.target, headers, body) as resp:
                    out = forward.response_headers(resp.headers, resp.http_version)
                    await sink.respond(resp.status, out, await resp.read())

            async def floor(request, sink) -> None:
                fields = Fields.read(request.headers)
                rid = fields.request_id or request_ids.make(bits(128))
                request.headers.append((b"x-request-id", rid))
                body = await request.body.read_all()
                if not limit.admit():
                    await sink.respond(503, [(b"x-request-id", rid)], b"")
                    return
                started = trio.current_time()
                headers = forward.request_headers(request, authority)
                headers.append((b"x-rampmeter-queue-ms", b"0"))
                try:
                    async with pool.request(0, request.method, request.target, headers, body) as resp:
                        data = await resp.read()
                        limit.release(trio.current_time() - started)
                        out = forward.response_headers(resp.headers, resp.http_version)
                        out.append((b"x-request-id", rid))
                        out.append((b"x-rampmeter-class", b"interactive"))
                        await sink.respond(resp.status, out, data)
                except BaseException:
                    if limit.used > 0:
                        limit.used -= 1
                    raise

            handler = wire if mode == "wire" else floor
            async with trio.open_nursery() as nursery:
                bound = await nursery.start(Server(handler, metrics=metrics).serve, address)
                heap.settle()
                print_ready({"data": bound})

    trio.run(main)


def measure(mode: str, proto: str, secs: int, ng) -> tuple[float, float]:
    from bench.common import cpu_seconds
    p = ["--h1", "-m", "1"] if proto == "http1" else ["-m", "10"]
    w = subprocess.Popen(["taskset", "-c", "0", sys.executable, __file__, "--serve", mode, "127.0.0.1:0", ng.h1_url],
                         stdout=subprocess.PIPE, text=True)
    try:
        line = w.stdout.readline()
        url = "http://" + line.split('"data": "')[1].split('"')[0] + "/"
        subprocess.run(["taskset", "-c", "1", "h2load", "-c10", *p, "-n", "3000", url], capture_output=True)
        h = subprocess.Popen(["taskset", "-c", "1", "h2load", "-c10", *p, "-D", str(secs + 2), url], stdout=subprocess.PIPE, text=True)
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
        serve(sys.argv[2], sys.argv[3], sys.argv[4]); return
    from bench.common import Nginx
    secs = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    ng = Nginx(cpu=1)
    rows = []
    try:
        for r in range(reps):
            for proto in ("http1", "h2c"):
                for mode in (("wire", "floor") if r % 2 == 0 else ("floor", "wire")):
                    rps, us = measure(mode, proto, secs, ng)
                    rows.append({"repeat": r, "proto": proto, "mode": mode, "rps": rps, "cpu_us": us})
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        ng.stop()
    for proto in ("http1", "h2c"):
        pick = lambda m: [x["cpu_us"] for x in rows if x["proto"] == proto and x["mode"] == m]
        wire, floor = pick("wire"), pick("floor")
        d = [f - w for f, w in zip(floor, wire)]
        print(f"{proto}: wire {statistics.median(wire):.1f} floor {statistics.median(floor):.1f} us; "
              f"floor - wire (pairwise) median {statistics.median(d):.1f} min {min(d):.1f} max {max(d):.1f} us")


if __name__ == "__main__":
    main()
