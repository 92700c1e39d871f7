"""What do N processes sharing one port (SO_REUSEPORT) cost per request? A measurement, not a feature.

    .venv/bin/python -m bench.workers [--quick] [--out DIR] [--workers 1,2] [--cpus 0]

Theory of operation: nginx (a `return 200` upstream) on --client-cpu; N copies of the
`wire` configuration (bench/overhead.py: server + pool + relay, no admission), each
started with --reuse-port so the kernel spreads connections over them, all pinned to
--cpus (one core by default: this machine has two, and h2load needs the other). For
each N, interleaved over repeats, h2load (`--h1 -c C -m1`, a fixed request count)
runs unthrottled and the CPU time of all N processes (utime + stime from /proc) is
divided by the requests answered. Flat CPU per request as N grows means the
processes do not get in each other's way: on N cores throughput would scale N
times. Whether it does on a given machine needs N free cores, which the shared
two-core machine this was written on does not have (req/s is reported beside).

The sidecar does not offer `--workers`: admission (limits, queues, dedup, tenant
quotas) lives in one process's memory; docs/multicore.md says what sharing it would
take.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from bench.common import Nginx, cpu_seconds, machine, parse_args, require_tool, write_result


def start_workers(n: int, cpus: str, upstream: str) -> tuple[list[subprocess.Popen], str]:
    procs: list[subprocess.Popen] = []
    port = 0
    for _ in range(n):
        address = f"127.0.0.1:{port}"
        argv = ["taskset", "-c", cpus, sys.executable, "-m", "bench.overhead", "--serve-wire", address, upstream]
        p = subprocess.Popen([*argv, "--reuse-port"], stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        if not line.startswith("rampmeter-ready"):
            sys.exit(f"bench: a wire worker did not start: {line!r}")
        port = int(json.loads(line.split(" ", 1)[1])["data"].rsplit(":", 1)[1])  # the others join it
        procs.append(p)
    return procs, f"http://127.0.0.1:{port}"


def run_h2load(url: str, clients: int, requests: int, cpu: int) -> str:
    argv = ["taskset", "-c", str(cpu), "h2load", "--h1", "-c", str(clients), "-m", "1", "-n", str(requests), url + "/"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False).stdout


def main() -> None:
    def add(p) -> None:
        p.add_argument("--workers", default="1,2", help="process counts to compare, comma-separated")
        p.add_argument("--cpus", default="0", help="taskset list for the workers")
        p.add_argument("--client-cpu", type=int, default=1)
        p.add_argument("--clients", type=int, default=20)
        p.add_argument("--requests", type=int, default=None, help="per run (default 20000, quick 5000)")
        p.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 5, quick 2)")

    args = parse_args("workers", __doc__, add)
    args.requests = args.requests or (5000 if args.quick else 20000)
    args.repeats = args.repeats or (2 if args.quick else 5)
    for tool in ("h2load", "taskset", "nginx"):
        require_tool(tool)
    counts = [int(x) for x in args.workers.split(",")]
    raw: dict[str, list[dict]] = {str(n): [] for n in counts}
    with Nginx(cpu=args.client_cpu) as nginx:
        pools = {n: start_workers(n, args.cpus, nginx.h1_url) for n in counts}
        try:
            for _, url in pools.values():
                run_h2load(url, args.clients, 2000, args.client_cpu)  # warm up
            for rep in range(args.repeats):
                for n, (procs, url) in pools.items():
                    before = [cpu_seconds(p.pid) for p in procs]
                    t0 = time.monotonic()
                    out = run_h2load(url, args.clients, args.requests, args.client_cpu)
                    wall = time.monotonic() - t0
                    spent = [cpu_seconds(p.pid) - b for p, b in zip(procs, before, strict=True)]
                    ok = "succeeded" in out and f"{args.requests} succeeded" in out
                    fig = {
                        "cpu_us_per_request": 1e6 * sum(spent) / args.requests,
                        "rps": args.requests / wall,
                        "cpu_share": [round(s / max(sum(spent), 1e-9), 2) for s in spent],
                        "all_succeeded": ok,
                    }
                    raw[str(n)].append(fig)
                    print(
                        f"#{rep} workers={n} cpu {fig['cpu_us_per_request']:6.1f} us/req {fig['rps']:7.0f} req/s "
                        f"share {fig['cpu_share']}",
                        flush=True,
                    )
        finally:
            for procs, _ in pools.values():
                for p in procs:
                    p.terminate()
                    p.wait(10)
    summary = {
        n: {k: statistics.median(r[k] for r in runs) for k in ("cpu_us_per_request", "rps")} for n, runs in raw.items()
    }
    lines = [
        f"# bench.workers ({'quick' if args.quick else 'full'})",
        "",
        f"`{args.command}`",
        "",
        f"wire configuration x N on one port (SO_REUSEPORT), workers pinned to CPU {args.cpus}, h2load --h1 "
        f"-c{args.clients} -m1 and nginx on CPU {args.client_cpu}; {args.repeats} interleaved repeats of "
        f"{args.requests} requests; medians.",
        "",
        "| workers | CPU us/request (all workers) | req/s |",
        "|---:|---:|---:|",
        *[f"| {n} | {s['cpu_us_per_request']:.0f} | {s['rps']:.0f} |" for n, s in summary.items()],
        "",
    ]
    runs = {"summary": summary, "raw": raw, "machine": machine(), "cpus": args.cpus}
    out = write_result(args, runs, [], "\n".join(lines))
    print((out / "result.md").read_text())


if __name__ == "__main__":
    main()
