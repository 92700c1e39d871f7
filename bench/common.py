"""Helpers every benchmark shares: arguments, machine facts, result.json/result.md, tools, pinning.

Theory of operation: a benchmark module calls `args = parse_args(NAME, doc)`,
measures, then `write_result(args, runs, targets, markdown)`; the files follow
docs/bench-conventions.md (`result.json` with bench/quick/command/machine/runs/
targets, `result.md` beside it). `target(name, value, op, goal)` builds one
target entry with its `met` flag. `require_tool(name)` exits with a message
naming the apt package when a tool is missing (conventions: non-zero only when
the benchmark could not measure). `Nginx` runs a trivial `return 200` upstream
(HTTP/1.1 and h2c ports) from a temporary config, pinned to a CPU if asked.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import operator
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

from proxy.core.wire import Reason

# The sidecar's answers at arrival that turn a request away with Retry-After (a shed), one list for every
# benchmark: each had its own, and each missed one (class_queue_full, deadline_unmeetable). A 504
# deadline_expired is not one: the request waited first.
SHED_REASONS = frozenset(
    r.value
    for r in (
        Reason.QUEUE_FULL,
        Reason.CLASS_QUEUE_FULL,
        Reason.DEADLINE_UNMEETABLE,
        Reason.OVERLOADED,
        Reason.GPU_PRESSURE,
        Reason.TENANT_QUOTA,
    )
)

_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq}
APT = {
    "nginx": "nginx",
    "h2load": "nghttp2-client",
    "wrk": "wrk",
    "haproxy": "haproxy",
    "redis-server": "redis-server",
    "taskset": "util-linux",
}


def parse_args(name: str, doc: str, add: object = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=doc.strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="about a minute, every target still measured")
    p.add_argument("--out", default=f"bench/results/{name}", help="directory for result.json, result.md, plots")
    if callable(add):
        add(p)
    args = p.parse_args()
    args.name = name
    args.command = "python -m bench." + name + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else "")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return args


class _Tally:
    __slots__ = ("n", "seen", "total")

    def __init__(self) -> None:
        self.n, self.total, self.seen = 0, 0.0, {}

    def add(self, key: str, value: float) -> float:
        self.n += 1
        self.total += value
        seen = self.seen
        seen[key] = seen.get(key, 0) + 1
        return self.total / self.n


def python_step_ns(steps: int = 50_000, repeats: int = 5) -> float:
    """How fast this interpreter runs code like the request path's, here: ns per step of a small mix
    (a method call, attribute updates, a dict get and set, a float log and division, a list append;
    best of `repeats`).

    The data path's CPU figures are mostly such Python steps, so they scale with this, and it differs
    between machines and between builds of one version: on one VM, pyenv's 3.11.7 (no PGO) ~870 ns
    against Debian's PGO-built 3.11.2 ~570-700, where bench.policy_path's loop took 107-117 against
    83-90 us. Recorded with every result so that figures from two machines or interpreters can be
    told apart; compare across them as ratios to it, or A/B on one machine."""
    keys = ("a", "b", "c", "d")
    log = math.log
    best = float("inf")
    for _ in range(repeats):
        tally, out = _Tally(), []
        t0 = time.perf_counter()
        for i in range(steps):
            v = tally.add(keys[i & 3], log(i + 1.0))
            if v > 0.0:
                out.append(v)
        best = min(best, time.perf_counter() - t0)
    return best / steps * 1e9


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "python_step_ns": round(python_step_ns()),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def target(name: str, value: float | None, op: str, goal: float) -> dict:
    met = value is not None and _OPS[op](value, goal)
    return {"name": name, "value": value, "op": op, "target": goal, "met": bool(met)}


def write_result(args: argparse.Namespace, runs: dict, targets: list[dict], markdown: str) -> Path:
    out = Path(args.out)
    facts = machine()
    doc = {
        "bench": args.name,
        "quick": bool(args.quick),
        "command": args.command,
        "machine": facts,
        "runs": runs,
        "targets": targets,
    }
    (out / "result.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    load = facts["loadavg_1m"]
    lines = [
        markdown.rstrip(),
        "",
        (
            f"Machine: {facts['cpus']} CPUs; Python {facts['python']} ({facts['python_executable']}), "
            f"{facts['python_step_ns']} ns a step of bench.common.python_step_ns (CPU figures scale with it)"
            + ("" if load is None else f"; load average {load:.2f} at the end")
            + "."
        ),
        "",
        "| target | value | goal | met |",
        "|---|---:|---|---|",
    ]
    for t in targets:
        value = "-" if t["value"] is None else f"{t['value']:.4g}"
        lines.append(f"| {t['name']} | {value} | {t['op']} {t['target']:g} | {'yes' if t['met'] else 'NO'} |")
    (out / "result.md").write_text("\n".join(lines) + "\n")
    return out


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        sys.exit(f"bench: {name} is not installed; `make bench-deps` or `apt-get install {APT.get(name, name)}`")
    return path


def pin(cpu: int | None) -> str:
    """Pin this process to one CPU when the machine has it; says what was done, for the output."""
    if cpu is None or not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) <= cpu:
        return "not pinned"
    os.sched_setaffinity(0, {cpu})
    return f"pinned to CPU {cpu}"


@contextlib.contextmanager
def keep_awake(cpu: int) -> Iterator[int]:
    """A busy loop at SCHED_IDLE priority (`chrt -i 0`) on `cpu` while the block runs; yields its pid.

    On this project's VMs waking a halted vCPU is slow now and then (bench.overhead's doc has the
    figures): the loop keeps the core from halting between requests, taking only time nobody else
    wants (SCHED_IDLE yields to any runnable task at once). A proxy's CPU per request is its own
    /proc figure either way; subtract the loop's own CPU from whole-core busy time."""
    require_tool("chrt")
    loop = subprocess.Popen(["taskset", "-c", str(cpu), "chrt", "-i", "0", sys.executable, "-c", "while True: pass"])
    try:
        yield loop.pid
    finally:
        loop.kill()
        loop.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 75s;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  http2_max_concurrent_streams 1024;
  server {{ listen 127.0.0.1:{h1}; location / {{ default_type application/json; return 200 '{{"ok":true}}'; }} }}
  server {{ listen 127.0.0.1:{h2} http2; location / {{ default_type application/json; return 200 '{{"ok":true}}'; }} }}
}}
"""


class Nginx:
    """A trivial upstream answering 200 {"ok":true} on an HTTP/1.1 port and an h2c port."""

    def __init__(self, cpu: int | None = None) -> None:
        binary = require_tool("nginx")
        self.dir = tempfile.mkdtemp(prefix="rampmeter-bench-nginx-")
        self.h1_port, self.h2_port = free_port(), free_port()
        conf = Path(self.dir) / "nginx.conf"
        conf.write_text(_NGINX_CONF.format(dir=self.dir, h1=self.h1_port, h2=self.h2_port))
        cmd = [binary, "-c", str(conf), "-p", self.dir]
        if cpu is not None and shutil.which("taskset") and (os.cpu_count() or 1) > cpu:
            cmd = ["taskset", "-c", str(cpu), *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_listening()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.proc.stderr.read().decode(errors='replace')}")
            try:
                for port in (self.h1_port, self.h2_port):
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start listening within 10 s")

    @property
    def h1_url(self) -> str:
        return f"http://127.0.0.1:{self.h1_port}"

    @property
    def h2_url(self) -> str:
        return f"http://127.0.0.1:{self.h2_port}"

    def stop(self) -> None:
        stop_server(self.proc, signal.SIGQUIT, self.dir)  # nginx's graceful stop

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used (from /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def core_busy_seconds(cpu: int) -> float:
    """Seconds core `cpu` spent not idle, whoever ran (from /proc/stat)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                ticks = [int(x) for x in line.split()[1:]]
                return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    return 0.0


def stop_server(proc: subprocess.Popen, sig: signal.Signals, workdir: str | Path) -> None:
    """`sig` (the server's graceful stop), SIGKILL after 5 s, then remove its work directory."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)
