"""Benchmark the front-end server alone: a trivial handler, pinned to one core.

    .venv/bin/python -m bench.server_bench [--requests 20000] [--server-cpu 0] [--client-cpu 1]

Starts `python -m bench.server_bench --serve` (the server with `handlers.hello`,
200 + 6 bytes) under `taskset -c SERVER_CPU`, then drives it from CLIENT_CPU with
h2load (HTTP/1.1 one-at-a-time and pipelined, h2c multiplexed) and wrk, and prints
for each: requests/s, latency, and the server's own CPU time per request (from
/proc/PID/stat), which is the figure that matters on a shared, noisy machine.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time

from bench.common import cpu_seconds

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def serve(address: str) -> None:
    import trio

    from proxy.http.server import Server
    from proxy.testing.handlers import hello
    from proxy.testing.procs import print_ready

    async def main() -> None:
        server = Server(hello)
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(server.serve, address)
            print_ready({"data": bound})

    trio.run(main)


def start_server(cpu: int) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "bench.server_bench", "--serve", "127.0.0.1:0"]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", str(cpu), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=HERE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r'"data": "([^"]+)"', line)
    if not match:
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    return proc, match.group(1)


def run_client(argv: list[str], cpu: int) -> str:
    if shutil.which("taskset"):
        argv = ["taskset", "-c", str(cpu), *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False).stdout


def h2load_figures(out: str) -> tuple[float, int, str]:
    rps = float(re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out).group(1))
    ok = int(re.search(r"(\d+) succeeded", out).group(1))
    lat = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", out)
    return rps, ok, f"request time min/max/mean {lat.group(1)}/{lat.group(2)}/{lat.group(3)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", metavar="ADDRESS", help="run the server (used by the benchmark itself)")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    n = str(args.requests)
    runs = [
        ("h1 h2load -c10 -m1", ["h2load", "-n", n, "-c", "10", "-m", "1", "--h1"]),
        ("h1 h2load -c10 -m10 (pipelined)", ["h2load", "-n", n, "-c", "10", "-m", "10", "--h1"]),
        ("h2c h2load -c10 -m10", ["h2load", "-n", n, "-c", "10", "-m", "10"]),
        ("h1 wrk -c10 5s", ["wrk", "-t1", "-c10", "-d5s", "--latency"]),
    ]
    proc, address = start_server(args.server_cpu)
    url = f"http://{address}/"
    try:
        run_client(["h2load", "-n", "2000", "-c", "10", url], args.client_cpu)  # warm up
        print(f"server: {address} on cpu {args.server_cpu}; clients on cpu {args.client_cpu}")
        for name, argv in runs:
            before = cpu_seconds(proc.pid)
            started = time.monotonic()
            out = run_client([*argv, url], args.client_cpu)
            cpu = cpu_seconds(proc.pid) - before
            if argv[0] == "wrk":
                rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
                done = int(re.search(r"(\d+) requests in", out).group(1))
                p99 = re.search(r"99%\s+(\S+)", out).group(1)
                detail = f"p99 {p99}"
            else:
                rps, done, detail = h2load_figures(out)
            wall = time.monotonic() - started
            print(
                f"{name:34s} {rps:8.0f} req/s  {1e6 * cpu / max(done, 1):6.1f} us server CPU/req  "
                f"(cpu busy {100 * cpu / wall:3.0f}%)  {done} ok  {detail}"
            )
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
