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
Child mode: floor.py --serve ADDRESS UPSTREAM (the floor configuration)
"""
import os, random, sys
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runs  # noqa: E402  (this directory's shared helpers)


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


def serve(address: str, upstream_url: str) -> None:
    """The floor configuration (module doc); the wire one is bench.overhead's own (--serve-wire)."""
    import trio

    from proxy.core import request_ids
    from proxy.runtime.fields import Fields

    bits = random.Random().getrandbits
    limit = Counter(100000)

    def make_handler(pool, authority, forward):
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
            finally:  # released once the upstream's part is over, before the write (as the sidecar does)
                limit.release(trio.current_time() - started)
            out = forward.response_headers(resp.headers, resp.http_version)
            out.append((b"x-request-id", rid))
            out.append((b"x-rampmeter-class", b"interactive"))
            await sink.respond(resp.status, out, data)

        return floor

    runs.serve(address, upstream_url, make_handler)


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], sys.argv[3]); return
    from bench.common import Nginx
    secs = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    ng = Nginx(cpu=1)
    rows = []
    try:
        for r in range(reps):
            for proto in ("http1", "h2c"):
                for mode in (("wire", "floor") if r % 2 == 0 else ("floor", "wire")):
                    argv = {
                        "wire": [sys.executable, "-m", "bench.overhead", "--serve-wire", "127.0.0.1:0", ng.h1_url],
                        "floor": [sys.executable, __file__, "--serve", "127.0.0.1:0", ng.h1_url],
                    }[mode]
                    runs.record(rows, argv, proto, secs, repeat=r, mode=mode)
    finally:
        ng.stop()
    for proto in ("http1", "h2c"):
        pick = lambda m: [x["cpu_us"] for x in rows if x["proto"] == proto and x["mode"] == m]
        print(f"{proto}: wire -> floor {runs.pairwise(pick('wire'), pick('floor'))}")


if __name__ == "__main__":
    main()
