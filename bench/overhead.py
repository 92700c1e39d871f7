"""What does rampmeter add to a request? Direct vs rampmeter vs HAProxy, HTTP/1.1 and h2c.

    .venv/bin/python -m bench.overhead [--quick] [--out DIR] [--configs direct,rampmeter,haproxy,wire]

Theory of operation: nginx (a `return 200` upstream, bench.common.Nginx) answers on
the client core. The configurations are measured in the same run, interleaved
(direct, rampmeter, haproxy, direct, ...) so that drift on a shared machine hits
all of them alike:
- direct: h2load straight to nginx (its HTTP/1.1 port, or its h2c port);
- rampmeter: `python -m proxy serve` (BENCH_POLICY: admission never queues) in
  front of nginx's HTTP/1.1 port, the sidecar's usual upstream protocol;
- haproxy: HAProxy, 1 thread, `mode http`, `proto h2` on its h2c bind, same upstream;
- wire: the wire layer alone (proxy/http server, pool and a plain relay, no
  admission), to split rampmeter's cost between the wire and the request path.
Proxies are pinned to --proxy-cpu (`taskset`); h2load and nginx share
--client-cpu. For each protocol (h2load `--h1 -c10 -m1`; h2c `-c10 -m10`) each
configuration runs at fixed rates of 500, 1000 and 2000 req/s and unthrottled.
Fixed rates use `--rps` (per client; `--rate` paces connections, not requests),
with the clients started STAGGER_MS apart (`-r 1 --rate-period`): otherwise every
client fires at the same instant and the "rate" is bursts of ten. p50/p99 come
from h2load's `--log-file` (per-request times; the first WARMUP_S of a run left
out); "added" is a proxy's figure minus direct's in the same repeat, and every
figure is the median over repeats (min and max in result.json). Each proxy's CPU
time per request comes from /proc/PID/stat, the figure that survives a noisy
shared machine, and is also given as a ratio to HAProxy's in the same cell
("x HAProxy"); the load average before and after, and how busy the proxy's core
was with other work (/proc/stat), say how quiet the machine was.

`--keep-awake`: a busy loop at SCHED_IDLE priority (`chrt -i 0`) on the proxies' core
for the whole run, so that core never halts between requests. On this project's VMs
waking a halted vCPU is slow now and then: at 1,000 req/s HAProxy's own p99 was
1.3-1.6 ms over direct's 0.2 ms with the core allowed to idle, 0.33 ms with it kept
awake (2026-12-04, quiet). The loop takes only time nobody else wants (SCHED_IDLE
yields to any runnable task at once), its CPU is not counted as "busy with other
work", and the proxies' CPU per request is their own /proc figure either way. It
measures what the proxies add where the core does not sleep (a loaded node, or
bare metal with shallow C-states); run without it too and give both.

Caveat: h2load's --rps is closed-loop within a client (HTTP/1.1: one request at a
time), so at a rate a proxy cannot sustain the achieved rate falls short (it is
reported) and latency leaves out the time requests waited to be sent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from bench.common import (
    Nginx,
    core_busy_seconds,
    cpu_seconds,
    free_port,
    keep_awake,
    machine,
    parse_args,
    require_tool,
    stop_server,
    target,
    write_result,
)
from proxy.testing.procs import Proc

RATES = (500, 1000, 2000, None)  # None: unthrottled
CLIENTS = 10
WARMUP_S = 1.0
STAGGER_MS = 1  # h2load's --rate-period takes whole milliseconds
PROTOCOLS = {"http1": ["--h1", "-m", "1"], "h2c": ["-m", "10"]}
# Issue #15's targets on one core with the full default policy (unthrottled CPU per request), the
# transport alone (the wire configuration), and issue #16's cost of the policy path over the transport.
ADDED_P99_MS_AT_1000 = {"http1": 1.0, "h2c": 2.0}
MAX_RPS = {"http1": 6000.0, "h2c": 3500.0}
CPU_US = {"http1": 150.0, "h2c": 300.0}
WIRE_CPU_US = {"http1": 80.0, "h2c": 180.0}
POLICY_CPU_US = {"http1": 50.0, "h2c": 60.0}
FIGURES = ("rps", "p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms", "cpu_us_per_request", "errors")

# Admission that never holds a request back: this benchmark measures the data path's cost, not
# the limits' effect (a gradient limit or a slow-start ramp would queue requests to a 0.3 ms
# upstream and measure the policy instead). No GPU sampling: there is none here.
BENCH_POLICY = """
[limits]
kind = "fixed"
initial_limit = 100000
max_limit = 100000
[slow_start]
window_s = 0
[gpu]
enabled = false
"""

_HAPROXY_CFG = """global
  nbthread 1
  maxconn 4096
defaults
  mode http
  option forwardfor
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend fe_h1
  bind 127.0.0.1:{h1}
  default_backend be
frontend fe_h2c
  bind 127.0.0.1:{h2} proto h2
  default_backend be
backend be
  server nginx 127.0.0.1:{upstream}
"""


class HAProxy:
    """HAProxy in front of nginx's HTTP/1.1 port: one thread, pinned, no logging."""

    def __init__(self, upstream_port: int, cpu: int) -> None:
        binary = require_tool("haproxy")
        self.dir = tempfile.mkdtemp(prefix="rampmeter-bench-haproxy-")
        self.h1_port, self.h2_port = free_port(), free_port()
        cfg = Path(self.dir) / "haproxy.cfg"
        cfg.write_text(_HAPROXY_CFG.format(h1=self.h1_port, h2=self.h2_port, upstream=upstream_port))
        self.proc = subprocess.Popen(
            ["taskset", "-c", str(cpu), binary, "-db", "-f", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.pid = self.proc.pid
        deadline = time.monotonic() + 10
        while not (_listening(self.h1_port) and _listening(self.h2_port)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"bench: haproxy did not start: {self.proc.stderr.read().decode(errors='replace')}")
            time.sleep(0.05)

    def urls(self) -> dict[str, str]:
        return {"http1": f"http://127.0.0.1:{self.h1_port}", "h2c": f"http://127.0.0.1:{self.h2_port}"}

    def stop(self) -> None:
        stop_server(self.proc, signal.SIGTERM, self.dir)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def serve_wire(address: str, upstream_url: str, reuse_port: bool = False) -> None:
    """The `wire` configuration: server, pool and a plain relay, no admission (run in a child).

    `reuse_port`: bind with SO_REUSEPORT (bench/workers.py runs several of these on one port).
    """
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
            authority = pool.authority(0)

            async def relay(request, sink) -> None:
                body = await request.body.read_all()
                headers = forward.request_headers(request, authority)
                async with pool.request(0, request.method, request.target, headers, body) as resp:
                    out = forward.response_headers(resp.headers, resp.http_version)
                    await sink.respond(resp.status, out, await resp.read())  # nginx's answer is small

            async with trio.open_nursery() as nursery:
                serve = partial(Server(relay, metrics=metrics).serve, reuse_port=reuse_port)
                bound = await nursery.start(serve, address)
                heap.settle()  # as `rampmeter serve` does once started
                print_ready({"data": bound})

    trio.run(main)


def h2load(url: str, protocol: str, rate: int | None, seconds: float, cpu: int, log: Path) -> dict:
    """One h2load run; figures from its per-request log."""
    if rate is None:
        pacing = ["-D", f"{seconds:g}"]
    else:  # -r excludes -D: a request count sets the length instead
        pacing = [
            "--rps",
            f"{rate / CLIENTS:g}",
            "-r",
            "1",
            "--rate-period",
            f"{STAGGER_MS}ms",
            "-n",
            str(int(rate * seconds)),
        ]
    argv = [
        "taskset",
        "-c",
        str(cpu),
        "h2load",
        "-c",
        str(CLIENTS),
        *PROTOCOLS[protocol],
        *pacing,
        "--log-file",
        str(log),
        url + "/",
    ]
    log.unlink(missing_ok=True)  # h2load appends to an existing log
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
        "max_ms": lat[-1],
    }


def measure(url: str, pid: int | None, protocol: str, rate: int | None, args, log: Path) -> dict:
    spinner = getattr(args, "spinner_pid", None)  # --keep-awake's loop: its time is not other work
    spun0 = cpu_seconds(spinner) if spinner else 0.0
    busy0, cpu0, t0 = core_busy_seconds(args.proxy_cpu), cpu_seconds(pid) if pid else 0.0, time.monotonic()
    fig = h2load(url, protocol, rate, args.seconds, args.client_cpu, log)
    wall, busy = time.monotonic() - t0, core_busy_seconds(args.proxy_cpu) - busy0
    if spinner:
        busy -= cpu_seconds(spinner) - spun0
    cpu = cpu_seconds(pid) - cpu0 if pid else 0.0
    if pid:
        fig["cpu_us_per_request"] = 1e6 * cpu / max(fig["requests"], 1)
    fig["proxy_core_busy_by_others"] = max(0.0, busy - cpu) / wall
    return fig


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(raw: dict) -> dict:
    """raw[protocol][rate][config] = [runs] -> {figure: spread}, with added latency over direct."""
    out: dict = {}
    for protocol, by_rate in raw.items():
        for rate, by_config in by_rate.items():
            direct = by_config.get("direct")
            haproxy = by_config.get("haproxy")
            for config, runs in by_config.items():
                if direct is not None and config != "direct":
                    for run, base in zip(runs, direct, strict=True):
                        run["added_p50_ms"] = run["p50_ms"] - base["p50_ms"]
                        run["added_p99_ms"] = run["p99_ms"] - base["p99_ms"]
                if haproxy is not None and config not in ("direct", "haproxy"):
                    for run, ref in zip(runs, haproxy, strict=True):
                        if ref.get("cpu_us_per_request"):
                            run["cpu_x_haproxy"] = run["cpu_us_per_request"] / ref["cpu_us_per_request"]
                cell = {k: spread([r[k] for r in runs]) for k in FIGURES if runs and k in runs[0]}
                if runs and "cpu_x_haproxy" in runs[0]:
                    cell["cpu_x_haproxy"] = spread([r["cpu_x_haproxy"] for r in runs])
                cell["proxy_core_busy_by_others"] = spread([r["proxy_core_busy_by_others"] for r in runs])
                out.setdefault(protocol, {}).setdefault(rate, {})[config] = cell
    return out


def markdown(summary: dict, args, load: dict) -> str:
    others = [
        c["proxy_core_busy_by_others"]["median"] for r in summary.values() for cs in r.values() for c in cs.values()
    ]
    setup = (
        f"{args.repeats} interleaved repeat(s) of {args.seconds:g} s per cell; proxies pinned to CPU "
        f"{args.proxy_cpu}, h2load + nginx on CPU {args.client_cpu}; h2load -c{CLIENTS} (HTTP/1.1 -m1, h2c "
        f"-m10).{' The proxies core kept awake (--keep-awake: a SCHED_IDLE busy loop).' if args.keep_awake else ''}"
        f" Machine load: load average {load['before']} before, {load['after']} after; the proxy's core "
        f"was busy with other work {100 * statistics.median(others):.0f}% of the time (median over runs)."
    )
    legend = (
        "Medians over repeats. Added = proxy minus direct at the same offered rate, ms. CPU = the proxy's "
        "CPU time per request, us; x HAProxy = that over HAProxy's CPU per request in the same cell. "
        "`max` = unthrottled."
    )
    lines = [
        f"# bench.overhead ({'quick' if args.quick else 'full'})",
        "",
        f"`{args.command}`",
        "",
        setup,
        "",
        legend,
        "",
    ]
    for protocol, by_rate in summary.items():
        header = "| rate | config | achieved req/s | p50 ms | p99 ms | added p50 | added p99 | CPU us/req | x HAProxy |"
        lines += [f"## {protocol}", "", header, "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for rate, by_config in by_rate.items():
            for config, cell in by_config.items():
                values = [_fmt(cell.get(k)) for k in FIGURES[:-1]]
                ratio = cell.get("cpu_x_haproxy")
                values.append(f"{ratio['median']:.1f}" if ratio else "-")
                lines.append(f"| {rate} | {config} | " + " | ".join(values) + " |")
        lines.append("")
    return "\n".join(lines)


def _fmt(s: dict | None) -> str:
    if s is None:
        return "-"
    m = s["median"]
    return f"{m:.0f}" if abs(m) >= 100 else f"{m:.2f}"


def targets_of(summary: dict, configs: list[str]) -> list[dict]:
    out = []
    if "rampmeter" not in configs:
        return out
    for protocol in PROTOCOLS:
        top = summary[protocol]["max"]
        if "direct" in configs:
            added = summary[protocol]["1000"]["rampmeter"]["added_p99_ms"]["median"]
            out.append(target(f"added_p99_ms_at_1000rps_{protocol}", added, "<=", ADDED_P99_MS_AT_1000[protocol]))
        out.append(target(f"max_rps_{protocol}", top["rampmeter"]["rps"]["median"], ">=", MAX_RPS[protocol]))
        cpu = top["rampmeter"]["cpu_us_per_request"]["median"]
        out.append(target(f"cpu_us_per_request_{protocol}", cpu, "<=", CPU_US[protocol]))
        if "wire" in configs:
            wire = top["wire"]["cpu_us_per_request"]["median"]
            out.append(target(f"wire_cpu_us_per_request_{protocol}", wire, "<=", WIRE_CPU_US[protocol]))
            out.append(target(f"policy_cpu_us_over_wire_{protocol}", cpu - wire, "<=", POLICY_CPU_US[protocol]))
    return out


@contextlib.contextmanager
def _awake(args):
    """--keep-awake: a busy loop at SCHED_IDLE on the proxies' core for the run (module doc)."""
    with keep_awake(args.proxy_cpu) as args.spinner_pid:
        try:
            yield
        finally:
            args.spinner_pid = None


def start_proxies(configs: list[str], nginx: Nginx, args, stack: contextlib.ExitStack, tmp: Path) -> dict:
    """config -> ({protocol: url}, pid or None), every process stopped by `stack`."""
    urls: dict = {"direct": ({"http1": nginx.h1_url, "h2c": nginx.h2_url}, None)}
    if "rampmeter" in configs:
        policy = args.policy or str(tmp / "bench-policy.toml")
        if not args.policy:
            Path(policy).write_text(BENCH_POLICY)
        rm = stack.enter_context(
            Proc(
                [
                    "serve",
                    "--policy",
                    policy,
                    "--listen",
                    "127.0.0.1:0",
                    "--admin",
                    "127.0.0.1:0",
                    "--upstream",
                    nginx.h1_url,
                    "--log-level",
                    "warning",
                ],
                cpu=args.proxy_cpu,
                name="rampmeter",
            )
        )
        urls["rampmeter"] = ({"http1": rm.url(), "h2c": rm.url()}, rm.popen.pid)
    if "wire" in configs:
        wire = subprocess.Popen(
            [
                "taskset",
                "-c",
                str(args.proxy_cpu),
                sys.executable,
                "-m",
                "bench.overhead",
                "--serve-wire",
                "127.0.0.1:0",
                nginx.h1_url,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        stack.callback(lambda: (wire.terminate(), wire.wait(10)))
        line = wire.stdout.readline()
        if '"data": "' not in line:
            sys.exit(f"bench: the wire-only proxy did not start: {line!r}")
        url = "http://" + line.split('"data": "')[1].split('"')[0]
        urls["wire"] = ({"http1": url, "h2c": url}, wire.pid)
    if "haproxy" in configs:
        hap = HAProxy(nginx.h1_port, args.proxy_cpu)
        stack.callback(hap.stop)
        urls["haproxy"] = (hap.urls(), hap.pid)
    return urls


def main() -> None:
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--serve-wire":
        serve_wire(sys.argv[2], sys.argv[3], reuse_port=sys.argv[4:] == ["--reuse-port"])
        return

    def add(p) -> None:
        p.add_argument("--proxy-cpu", type=int, default=0, help="core for the proxies")
        p.add_argument("--client-cpu", type=int, default=1, help="core for h2load and nginx")
        p.add_argument("--seconds", type=float, default=None, help="per run (default 6, quick 2)")
        p.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3, quick 1)")
        p.add_argument(
            "--configs",
            default="direct,rampmeter,haproxy,wire",
            help="comma-separated, from direct,rampmeter,haproxy,wire",
        )
        p.add_argument("--policy", help="rampmeter policy file (default: BENCH_POLICY, admission never queues)")
        p.add_argument(
            "--keep-awake",
            action="store_true",
            help="a SCHED_IDLE busy loop on the proxies' core, so it never halts between requests (module doc)",
        )

    args = parse_args("overhead", __doc__, add)
    args.seconds = args.seconds or (2.0 if args.quick else 6.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    configs = args.configs.split(",")
    for tool in ("h2load", "taskset", "nginx", *(["haproxy"] if "haproxy" in configs else [])):
        require_tool(tool)
    load = {"before": [round(x, 2) for x in os.getloadavg()]}
    raw: dict = {p: {str(r or "max"): {c: [] for c in configs} for r in RATES} for p in PROTOCOLS}
    tmp = Path(tempfile.mkdtemp(prefix="rampmeter-bench-overhead-"))
    with Nginx(cpu=args.client_cpu) as nginx, contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        urls = start_proxies(configs, nginx, args, stack, tmp)
        if args.keep_awake:
            stack.enter_context(_awake(args))
        for config in configs:  # warm up: connections, pools, caches
            h2load(urls[config][0]["http1"], "http1", None, 2.0, args.client_cpu, tmp / "warm.tsv")
        for protocol in PROTOCOLS:
            for rate in RATES:
                for rep in range(args.repeats):
                    for config in configs:
                        (by_protocol, pid) = urls[config]
                        fig = measure(by_protocol[protocol], pid, protocol, rate, args, tmp / "run.tsv")
                        raw[protocol][str(rate or "max")][config].append(fig)
                        print(
                            f"{protocol:5s} {rate or 'max'!s:>5} #{rep} {config:9s} {fig['rps']:7.0f} req/s "
                            f"p50 {fig['p50_ms']:6.2f} p99 {fig['p99_ms']:6.2f} ms "
                            f"cpu {fig.get('cpu_us_per_request', 0):5.0f} us/req",
                            flush=True,
                        )
    load["after"] = [round(x, 2) for x in os.getloadavg()]
    summary = summarise(raw)
    runs = {
        "summary": summary,
        "raw": raw,
        "load_average": load,
        "policy": args.policy or BENCH_POLICY,
        "layout": {
            "proxy_cpu": args.proxy_cpu,
            "client_cpu": args.client_cpu,
            "clients": CLIENTS,
            "seconds": args.seconds,
            "repeats": args.repeats,
            "warmup_s_dropped": WARMUP_S,
            "stagger_ms": STAGGER_MS,
            "keep_awake": args.keep_awake,
            "machine": machine(),
        },
    }
    out = write_result(args, runs, targets_of(summary, configs), markdown(summary, args, load))
    print((out / "result.md").read_text())


if __name__ == "__main__":
    main()
