"""What one Python call costs over the wire: the wire configuration of bench.overhead plus K extra
calls a request, each a distinct small function of policy-like shape (two attribute reads, a dict
get, arithmetic, an attribute write), K = 0, 50, 100, 200, alternated. CPU us a request of the
server process from /proc under unthrottled h2load (10 clients), HTTP/1.1 and h2c.

    python bench/results/2026-12-05-s32/scripts/slope.py [SECONDS] [PAIRS]
Child mode: slope.py --serve K ADDRESS UPSTREAM
"""
import os, statistics, sys
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runs  # noqa: E402  (this directory's shared helpers)


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
    """The wire configuration's relay (bench.overhead.serve_wire), with the K calls first."""
    steps, st, d = make_steps(k), State(), {i: i for i in range(7)}

    def make_handler(pool, authority, forward):
        async def relay(request, sink) -> None:
            for f in steps:
                f(st, d)
            body = await request.body.read_all()
            headers = forward.request_headers(request, authority)
            async with pool.request(0, request.method, request.target, headers, body) as resp:
                out = forward.response_headers(resp.headers, resp.http_version)
                await sink.respond(resp.status, out, await resp.read())

        return relay

    runs.serve(address, upstream_url, make_handler)


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]), sys.argv[3], sys.argv[4]); return
    from bench.common import Nginx
    secs = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    ng = Nginx(cpu=1)
    ks = (0, 50, 100, 200)
    rows = []
    try:
        for r in range(pairs):
            for proto in ("http1", "h2c"):
                for k in (ks if r % 2 == 0 else ks[::-1]):
                    argv = [sys.executable, __file__, "--serve", str(k), "127.0.0.1:0", ng.h1_url]
                    runs.record(rows, argv, proto, secs, repeat=r, k=k)
    finally:
        ng.stop()
    for proto in ("http1", "h2c"):
        med = {k: statistics.median(x["cpu_us"] for x in rows if x["proto"] == proto and x["k"] == k) for k in ks}
        slopes = [(med[k] - med[0]) / k for k in ks[1:]]
        print(proto, " ".join(f"K={k}: {med[k]:.1f} us" for k in ks), "| us per call:", " ".join(f"{s:.2f}" for s in slopes))


if __name__ == "__main__":
    main()
