"""The policy path's CPU per request in one process, without sockets: issue 16's cost over the wire.

    .venv/bin/python -m bench.policy_path [--quick] [--out DIR] [--requests N] [--profile FILE]

Theory of operation: bench.overhead measures the whole proxy under h2load, where the
policy's share is the difference of two noisy figures (full minus the wire alone) on a
shared machine. This benchmark isolates that share: the real `App` (bench.overhead's
policy: admission never queues) serves requests handed to its edge in-process, with an
upstream pool and a client sink that do nothing but answer (a 200 with a small JSON
body), so the CPU time per request is the policy path's alone plus a fixed few
microseconds of stand-ins; the `wire` configuration runs the same stand-ins through
bench.overhead's plain relay (body, hop-by-hop headers, pool, response headers, respond),
so `full - wire` is the policy over the wire, the figure issue 16 bounds (<= 50 us on
HTTP/1.1). Configurations interleave (wire, full, wire, full, ...) and each figure is the
median over repeats of `time.process_time()` per request. `--profile FILE` writes a
cProfile of the full path instead (pstats).
"""

from __future__ import annotations

import cProfile
import random
import statistics
import time

import trio

from bench.common import parse_args, target, write_result
from bench.overhead import BENCH_POLICY, POLICY_CPU_US

_BODY = b'{"ok":true}'
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(_BODY))]
# What h2load sends (HTTP/1.1: host first; h2 has :authority, not in the list).
_REQUEST_HEADERS = [(b"host", b"127.0.0.1:8080"), (b"user-agent", b"h2load nghttp2/1.59.0"), (b"accept", b"*/*")]


class _Body:
    content_length = 0

    async def read_all(self) -> bytes:
        return b""

    def chunks(self):
        raise NotImplementedError


class _Response:
    __slots__ = ("_parts",)
    status = 200
    headers = _HEADERS
    http_version = "1.1"

    def __init__(self) -> None:
        self._parts = [b"", _BODY]

    async def receive(self) -> bytes:
        return self._parts.pop()

    async def read(self) -> bytes:
        return _BODY

    @property
    def all_received(self) -> bool:
        # As upstream_h1's for a small answer that came whole with its head: once receive() handed
        # the body out, nothing is left (the relay then skips the last, empty receive).
        return len(self._parts) < 2


class _Exchange:
    __slots__ = ()

    async def __aenter__(self) -> _Response:
        return _Response()

    async def __aexit__(self, *exc) -> None:
        return None


class Pool:
    """The pool's interface, answering at once (what relay.forward and the app use of it)."""

    def authority(self, upstream: int) -> bytes:
        return b"127.0.0.1:9000"

    def bounds_deadlines(self, upstream: int) -> bool:
        return True

    def request(self, upstream, method, target, headers, body, *args) -> _Exchange:
        return _Exchange()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        return None


class Sink:
    __slots__ = ("headers_sent", "status")

    def __init__(self) -> None:
        self.headers_sent = False
        self.status = 0

    async def respond(self, status, headers, body=b"") -> None:
        self.status, self.headers_sent = status, True


class _Ready:
    ready = True
    warmers = ()

    def report_result(self, index: int, ok: bool, now: float | None = None) -> None:
        pass

    def limit_factor(self, index: int) -> float:
        return 1.0


def _policy():
    """bench.overhead's BENCH_POLICY over the defaults, with one upstream (the stand-in pool's)."""
    import msgspec

    from proxy.policy.load import policy_from_builtins
    from proxy.policy.schema import Policy

    data = msgspec.to_builtins(Policy())
    for table, values in msgspec.toml.decode(BENCH_POLICY.encode()).items():
        data[table].update(values)
    data["upstreams"] = [{"url": "http://127.0.0.1:9000"}]
    return policy_from_builtins(data, "bench")


def full_handler():
    from proxy.app import App
    from proxy.runtime.reload import PolicyVersion

    app = App(_policy(), PolicyVersion("bench", 1, "", 0.0), rng=random.Random(0), pool=Pool(), lifecycles=_Ready())
    return app.edge, app


def wire_handler():
    from proxy.http import forward

    pool = Pool()
    authority = pool.authority(0)

    async def relay(request, sink) -> None:  # bench.overhead.serve_wire's relay
        body = await request.body.read_all()
        headers = forward.request_headers(request, authority)
        async with pool.request(0, request.method, request.target, headers, body) as resp:
            out = forward.response_headers(resp.headers, resp.http_version)
            await sink.respond(resp.status, out, await resp.read())

    return relay, None


async def _drive(handler, n: int, http_version: str) -> float:
    from proxy.http.messages import Request

    body = _Body()
    t0 = time.process_time()
    for _ in range(n):
        request = Request(
            b"GET",
            b"/v1/x",
            list(_REQUEST_HEADERS),
            body,
            http_version=http_version,
            client="127.0.0.1",
            received_at=trio.current_time(),
        )
        sink = Sink()
        await handler(request, sink)
        if sink.status != 200:
            raise SystemExit(f"bench: the handler answered {sink.status}")
    return (time.process_time() - t0) / n * 1e6


def run(n: int, repeats: int, profile: str | None) -> dict:
    async def main() -> dict:
        full, app = full_handler()
        wire, _ = wire_handler()
        out: dict = {}
        for version in ("1.1", "2"):
            await _drive(full, 2000, version)  # warm: caches, first-use paths
            await _drive(wire, 2000, version)
            if profile:
                prof = cProfile.Profile()
                prof.enable()
                await _drive(full, n, version)
                prof.disable()
                prof.dump_stats(f"{profile}.{version}")
                continue
            figures: dict = {"wire": [], "full": []}
            for _ in range(repeats):
                figures["wire"].append(await _drive(wire, n, version))
                figures["full"].append(await _drive(full, n, version))
            out[version] = figures
        return out

    return trio.run(main)


def main() -> None:
    def add(p) -> None:
        p.add_argument("--requests", type=int, default=None, help="per run (default 50000, quick 20000)")
        p.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 7, quick 3)")
        p.add_argument("--profile", help="write cProfile stats of the full path to FILE.1.1 and FILE.2")

    args = parse_args("policy_path", __doc__, add)
    n = args.requests or (20000 if args.quick else 50000)
    repeats = args.repeats or (3 if args.quick else 7)
    raw = run(n, repeats, args.profile)
    if args.profile:
        print(f"profiles in {args.profile}.1.1 and {args.profile}.2")
        return
    summary, targets, lines = (
        {},
        [],
        ["| protocol | wire us/req | full us/req | policy over wire |", "|---|---:|---:|---:|"],
    )
    for version, figures in raw.items():
        protocol = "http1" if version == "1.1" else "h2c"
        wire, full = statistics.median(figures["wire"]), statistics.median(figures["full"])
        diffs = [f - w for f, w in zip(figures["full"], figures["wire"], strict=True)]
        summary[protocol] = {"wire_us": wire, "full_us": full, "policy_us": statistics.median(diffs)}
        targets.append(
            target(f"policy_cpu_us_in_process_{protocol}", statistics.median(diffs), "<=", POLICY_CPU_US[protocol])
        )
        lines.append(f"| {protocol} | {wire:.1f} | {full:.1f} | {statistics.median(diffs):.1f} |")
    md = "\n".join(["# policy path in process (CPU us per request)", "", *lines, ""])
    out = write_result(args, {"summary": summary, "raw": raw, "requests": n, "repeats": repeats}, targets, md)
    print((out / "result.md").read_text())


if __name__ == "__main__":
    main()
