"""What does a streamed (SSE) answer cost the sidecar, per request and per chunk?

    .venv/bin/python -m bench.streaming [--quick] [--out DIR] [--configs wire,rampmeter]
                                        [--baseline DIR] [--cases json,paced,burst]

Theory of operation: LLM servers answer `stream: true` requests with one SSE event per token
step, and the sidecar relays each as it comes (proxy/runtime/relay.py `_stream`): per-chunk work
that a `return 200` benchmark (bench.overhead) never sees. Here the upstream is a small streaming
server (this module's `--serve-upstream`: the project's own Server, pinned to --client-cpu with
h2load) that answers every POST with one of three cases:
- json: one whole JSON body (content-length), the unstreamed baseline;
- paced: CHUNKS SSE events (`data: {...chat.completion.chunk...}`), one write each, --gap-ms apart,
  then `data: [DONE]`: token steps, each chunk alone on the wire;
- burst: the same events written back to back (a fast model, or many tokens per step): chunks the
  relay finds already waiting.
Configurations, measured interleaved per case and protocol (h2load `--h1 -c10 -m1`; h2c `-c10 -m4`,
closed loop for --seconds): direct (h2load to the upstream), wire (server, pool and the real relay,
`relay.forward`, without admission) and rampmeter (`proxy serve`, bench.overhead's BENCH_POLICY),
each pinned to --proxy-cpu. With `--baseline DIR` (a source tree of another commit, e.g.
`git archive main proxy | tar -x -C DIR`) each proxy configuration runs a second time from DIR's
`proxy` package in the same interleaving (`wire@base`, `rampmeter@base`): before and after in one run.

Figures: the proxy process's CPU per request (/proc utime+stime over the run, as bench.overhead)
and per chunk: a streamed case's CPU per request minus the json case's in the same repeat, over
the chunks it carried (CHUNKS + 1, the [DONE] event), i.e. the marginal cost of one relayed chunk.
p50/p99 of the whole response (h2load's per-request log) and req/s beside them.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import core_busy_seconds, cpu_seconds, machine, parse_args, require_tool, write_result
from bench.overhead import BENCH_POLICY

CHUNKS = 32
GAP_MS = 1.0
CASES = ("json", "paced", "burst")
PROTOCOLS = {"http1": ["--h1", "-m", "1"], "h2c": ["-m", "4"]}
CLIENTS = 10
WARMUP_S = 0.5
_EVENT = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"bench","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}\n\n'
)
_DONE = b"data: [DONE]\n\n"
_JSON = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"' + b" token" * CHUNKS + b'"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":32,"total_tokens":44}}'
)
_REQUEST = b'{"model":"bench","messages":[{"role":"user","content":"hello"}],"stream":true,"max_tokens":32}'
# Run a child from a chosen source tree: its `proxy` package first on sys.path (a -m child would
# put the working directory first), this file executed as __main__ for the servers it defines.
_LAUNCH = "import runpy, sys; sys.path.insert(0, sys.argv[1]); m = sys.argv[2]; sys.argv = sys.argv[2:]; " + (
    "runpy.run_path(m, run_name='__main__') if m.endswith('.py') else runpy.run_module(m, run_name='__main__')"
)


def serve_upstream(address: str) -> None:
    """The streaming upstream (a child): POST /json, /paced, /burst answer as the module doc says."""
    import trio

    from proxy.http import heap
    from proxy.http.server import Server
    from proxy.ready import print_ready

    sse = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]

    async def handler(request, sink) -> None:
        await request.body.read_all()
        path, _, query = request.target.partition(b"?")
        case = path.rsplit(b"/", 1)[-1]
        gap_s = float(query.removeprefix(b"gap_ms=") or GAP_MS) / 1000.0
        if case == b"json":
            await sink.respond(200, [(b"content-type", b"application/json")], _JSON)
            return
        await sink.start(200, sse)
        for _ in range(CHUNKS):
            await sink.send(_EVENT)
            if case == b"paced":
                await trio.sleep(gap_s)
        await sink.send(_DONE)
        await sink.end()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(Server(handler, metrics=None, name="stream-upstream").serve, address)
            heap.settle()
            print_ready({"data": bound})

    trio.run(main)


def serve_wire(address: str, upstream_url: str) -> None:
    """The wire with the real relay (a child): server, pool, `relay.forward`; no admission."""
    import trio

    from proxy.http import heap
    from proxy.http.pool import UpstreamPool
    from proxy.http.server import Server
    from proxy.metrics import Metrics
    from proxy.policy.schema import Upstream
    from proxy.ready import print_ready
    from proxy.runtime import relay

    async def main() -> None:
        metrics = Metrics()
        async with UpstreamPool([Upstream(url=upstream_url)], metrics=metrics) as pool:

            async def handler(request, sink) -> None:
                body = await request.body.read_all()
                await relay.forward(pool, 0, 300.0, request, body, sink, [], scoped=False, restamp=False)

            async with trio.open_nursery() as nursery:
                bound = await nursery.start(Server(handler, metrics=metrics).serve, address)
                heap.settle()
                print_ready({"data": bound})

    trio.run(main)


class Child:
    """A server child from source tree `src`, pinned to `cpu`; `url` from its ready line."""

    def __init__(self, src: str, argv: list[str], cpu: int, name: str) -> None:
        from proxy.ready import READY_PREFIX

        self.name = name
        # The child's stderr, kept for a post-mortem; closed with the child (stop()).
        self.log = tempfile.NamedTemporaryFile(prefix=f"rampmeter-bench-{name}-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = ["taskset", "-c", str(cpu), sys.executable, "-c", _LAUNCH, src, *argv]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.pid = self.proc.pid
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 30
        for line in self.proc.stdout:
            if line.startswith(READY_PREFIX):
                self.url = "http://" + line.split('"data": "')[1].split('"')[0]
                break
            if time.monotonic() > deadline:
                break
        else:
            self.stop()
            sys.exit(f"bench: {name} did not start; see {self.log.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def h2load(url: str, protocol: str, seconds: float, cpu: int, body: Path, log: Path) -> dict:
    argv = ["taskset", "-c", str(cpu), "h2load", "-c", str(CLIENTS), *PROTOCOLS[protocol]]
    argv += ["-D", f"{int(seconds * 1000)}ms", "-d", str(body), "-H", "content-type: application/json"]
    argv += ["--log-file", str(log), url]
    log.unlink(missing_ok=True)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds * 10 + 60, check=False)
    rows = [line.split("\t") for line in log.read_text().splitlines() if line] if log.exists() else []
    if not rows:
        sys.exit(f"bench: h2load got no answers from {url}: {out.stdout[-600:]} {out.stderr[-300:]}")
    start = min(int(r[0]) for r in rows)
    kept = [r for r in rows if int(r[0]) >= start + WARMUP_S * 1e6] or rows
    lat = sorted(int(r[2]) / 1000 for r in kept)
    span_us = max(int(r[0]) + int(r[2]) for r in kept) - min(int(r[0]) for r in kept)
    return {
        "requests": len(rows),
        "errors": sum(1 for r in rows if not r[1].startswith("2")),
        "rps": len(kept) / (span_us / 1e6) if span_us > 0 else 0.0,
        "p50_ms": lat[len(lat) // 2],
        "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
    }


def measure(url: str, pid: int | None, protocol: str, args, body: Path, log: Path) -> dict:
    busy0, cpu0, t0 = core_busy_seconds(args.proxy_cpu), cpu_seconds(pid) if pid else 0.0, time.monotonic()
    fig = h2load(url, protocol, args.seconds, args.client_cpu, body, log)
    wall, busy = time.monotonic() - t0, core_busy_seconds(args.proxy_cpu) - busy0
    cpu = cpu_seconds(pid) - cpu0 if pid else 0.0
    if pid:
        fig["cpu_us_per_request"] = 1e6 * cpu / max(fig["requests"], 1)
    fig["proxy_core_busy_by_others"] = max(0.0, busy - cpu) / wall
    return fig


def start(configs: list[str], args, upstream: str, stack: contextlib.ExitStack, tmp: Path) -> dict:
    """config name -> Child (every proxy configuration, from this tree and from --baseline)."""
    here = str(Path(__file__).resolve().parents[1])
    policy = tmp / "policy.toml"
    policy.write_text(BENCH_POLICY)
    trees = [("", here)] + ([("@base", args.baseline)] if args.baseline else [])
    children = {}
    for config in configs:
        for suffix, src in trees:
            if config == "wire":
                argv = [str(Path(__file__).resolve()), "--serve-wire", "127.0.0.1:0", upstream]
            else:
                argv = ["proxy", "serve", "--policy", str(policy), "--listen", "127.0.0.1:0"]
                argv += ["--admin", "127.0.0.1:0", "--upstream", upstream, "--log-level", "warning"]
            child = Child(src, argv, args.proxy_cpu, config + suffix)
            stack.callback(child.stop)
            children[config + suffix] = child
    return children


def summarise(raw: dict) -> dict:
    """raw[protocol][case][config] = [runs] -> medians (min, max), with CPU per chunk over json's."""
    out: dict = {}
    for protocol, by_case in raw.items():
        for case, by_config in by_case.items():
            for config, runs in by_config.items():
                if case != "json" and config != "direct":
                    for run, base in zip(runs, by_case["json"][config], strict=True):
                        extra = run["cpu_us_per_request"] - base["cpu_us_per_request"]
                        run["cpu_us_per_chunk"] = extra / (CHUNKS + 1)
                keys = ("rps", "p50_ms", "p99_ms", "cpu_us_per_request", "cpu_us_per_chunk", "errors")
                cell = {}
                for k in keys:
                    values = [r[k] for r in runs if k in r]
                    if values:
                        cell[k] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
                out.setdefault(protocol, {}).setdefault(case, {})[config] = cell
    return out


def markdown(summary: dict, args, load: dict) -> str:
    lines = [
        f"# bench.streaming ({'quick' if args.quick else 'full'})",
        "",
        f"`{args.command}`",
        "",
        f"{args.repeats} interleaved repeat(s) of {args.seconds:g} s per cell; proxies pinned to CPU "
        f"{args.proxy_cpu}, h2load + the streaming upstream on CPU {args.client_cpu}; h2load -c{CLIENTS} "
        f"(HTTP/1.1 -m1, h2c -m4), POST with a JSON body. Streamed cases: {CHUNKS} SSE events + [DONE] "
        f"(paced: {args.gap_ms:g} ms apart; burst: back to back). Load average {load['before']} before, "
        f"{load['after']} after.",
        "",
        "Medians over repeats (min-max where repeated). CPU = the proxy's CPU per request, us; per chunk = "
        "(streamed case - json case) / chunks, same repeat.",
        "",
    ]
    for protocol, by_case in summary.items():
        lines += [f"## {protocol}", "", "| case | config | req/s | p50 ms | p99 ms | CPU us/req | CPU us/chunk |"]
        lines.append("|---|---|---:|---:|---:|---:|---:|")
        for case, by_config in by_case.items():
            for config, cell in by_config.items():
                vals = [_fmt(cell.get(k)) for k in ("rps", "p50_ms", "p99_ms", "cpu_us_per_request")]
                vals.append(_fmt(cell.get("cpu_us_per_chunk"), spread=True))
                lines.append(f"| {case} | {config} | " + " | ".join(vals) + " |")
        lines.append("")
    return "\n".join(lines)


def _fmt(s: dict | None, spread: bool = False) -> str:
    if s is None:
        return "-"
    m = s["median"]
    text = f"{m:.0f}" if abs(m) >= 100 else f"{m:.2f}" if abs(m) < 10 else f"{m:.1f}"
    if spread and s["min"] != s["max"]:
        text += f" ({s['min']:.1f}-{s['max']:.1f})"
    return text


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-upstream":
        serve_upstream(sys.argv[2])
        return
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-wire":
        serve_wire(sys.argv[2], sys.argv[3])
        return

    def add(p) -> None:
        p.add_argument("--proxy-cpu", type=int, default=0, help="core for the proxies")
        p.add_argument("--client-cpu", type=int, default=1, help="core for h2load and the upstream")
        p.add_argument("--seconds", type=float, default=None, help="per run (default 5, quick 2)")
        p.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3, quick 1)")
        p.add_argument("--configs", default="direct,wire,rampmeter", help="from direct,wire,rampmeter")
        p.add_argument("--cases", default=",".join(CASES), help="from json,paced,burst (json is needed per chunk)")
        p.add_argument("--protocols", default="http1,h2c", help="from http1,h2c")
        p.add_argument("--gap-ms", type=float, default=GAP_MS, help="paced: ms between events")
        p.add_argument("--baseline", help="a source tree whose `proxy` package runs beside this one's (@base)")

    args = parse_args("streaming", __doc__, add)
    args.seconds = args.seconds or (2.0 if args.quick else 5.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    for tool in ("h2load", "taskset"):
        require_tool(tool)
    configs = args.configs.split(",")
    cases = args.cases.split(",")
    protocols = args.protocols.split(",")
    load = {"before": [round(x, 2) for x in os.getloadavg()]}
    tmp = Path(tempfile.mkdtemp(prefix="rampmeter-bench-streaming-"))
    body = tmp / "request.json"
    body.write_bytes(_REQUEST)
    here = str(Path(__file__).resolve().parents[1])
    with contextlib.ExitStack() as stack:
        up = Child(here, [str(Path(__file__).resolve()), "--serve-upstream", "127.0.0.1:0"], args.client_cpu, "up")
        stack.callback(up.stop)
        children = start([c for c in configs if c != "direct"], args, up.url, stack, tmp)
        names = (["direct"] if "direct" in configs else []) + list(children)
        urls = {"direct": (up.url, None), **{n: (c.url, c.pid) for n, c in children.items()}}
        for name in names:  # warm up: connections, pools, caches
            h2load(urls[name][0] + "/v1/json", "http1", 1.0, args.client_cpu, body, tmp / "warm.tsv")
        raw: dict = {p: {c: {n: [] for n in names} for c in cases} for p in protocols}
        for protocol in protocols:
            for rep in range(args.repeats):
                for case in cases:
                    for name in names:
                        url, pid = urls[name]
                        path = f"/v1/{case}?gap_ms={args.gap_ms:g}" if case == "paced" else f"/v1/{case}"
                        fig = measure(url + path, pid, protocol, args, body, tmp / "run.tsv")
                        raw[protocol][case][name].append(fig)
                        print(
                            f"{protocol:5s} #{rep} {case:6s} {name:14s} {fig['rps']:7.0f} req/s "
                            f"p50 {fig['p50_ms']:6.2f} p99 {fig['p99_ms']:6.2f} ms "
                            f"cpu {fig.get('cpu_us_per_request', 0):6.0f} us/req",
                            flush=True,
                        )
    load["after"] = [round(x, 2) for x in os.getloadavg()]
    summary = summarise(raw)
    runs = {
        "summary": summary,
        "raw": raw,
        "load_average": load,
        "layout": {
            "proxy_cpu": args.proxy_cpu,
            "client_cpu": args.client_cpu,
            "clients": CLIENTS,
            "chunks": CHUNKS,
            "gap_ms": args.gap_ms,
            "seconds": args.seconds,
            "repeats": args.repeats,
            "baseline": args.baseline,
            "machine": machine(),
        },
    }
    out = write_result(args, runs, [], markdown(summary, args, load))
    print((out / "result.md").read_text())


if __name__ == "__main__":
    main()
