"""Each attack of issue 13 at full strength beside a steady normal load: what the other clients still get.

Question: while one hostile client attacks the data port, do ordinary clients keep
being served, how fast, and what does the attack cost the sidecar in memory and
CPU? For every attack in `proxy.testing.attacks.ATTACKS`, in one run: a fresh
sidecar (default policy, pinned to CPU 0) in front of one sim pod (speed 20, CPU
1) gets a steady normal load (RATE req/s of short chat completions on a fixed
schedule, from WORKERS connections, half HTTP/1.1 keep-alive, half h2c, from this
process on CPU 1; latency counts from when a request was due) for the phase;
from a second second on, the attack runs from its own process (`python -m
proxy.testing.attacks`, CPU 1, nice +5 so that it cannot starve the load's
threads: its strength is what one core left over can send). A baseline phase with
no attack runs first and last; attacks are compared with the mean of the two.

Per phase: normal requests answered 200 (share of those sent), their p50/p99,
/readyz failures (5 Hz), the sidecar's peak RSS (10 Hz from /proc) and its CPU
(utime+stime over the phase, as % of one core), and the attacker's tally (what it
sent and was answered). Targets (issue 13): success >= 99%, p99 <= 2x the
no-attack p99, RSS <= 256 MiB, for every attack.

    python -m bench.attacks [--quick] [--only NAME ...] [--out DIR]

Full: 25 s of attack per phase (about 8 minutes in all); --quick: 3 s (about 2.5 minutes: a fresh sidecar
per phase costs its start-up).
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.common import cpu_seconds, parse_args, target, write_result
from proxy.testing.attacks import ATTACKS
from proxy.testing.procs import Proc
from proxy.testing.stack import wait_ok

NAME = "attacks"
RATE = 40.0  # normal requests per second, all threads together
WORKERS = 8  # threads, each with its own connection: half HTTP/1.1 keep-alive, half h2c
TIMEOUT_S = 5.0
LEAD_S = 1.0  # normal load alone before the attack starts
SIDECAR_CPU, OTHER_CPU = 0, 1
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
RSS_LIMIT_MIB = 256.0


@dataclass
class Phase:
    name: str
    sent: int = 0
    ok: int = 0
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    readyz_failures: int = 0
    peak_rss_bytes: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    attack: dict | None = None

    def figures(self) -> dict:
        lat = sorted(self.latencies_s)

        def q(p: float) -> float | None:
            return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else None

        return {
            "sent": self.sent,
            "ok": self.ok,
            "success": self.ok / self.sent if self.sent else 0.0,
            "p50_ms": q(0.50),
            "p99_ms": q(0.99),
            "errors": dict(sorted(self.errors.items(), key=lambda kv: -kv[1])[:6]),
            "readyz_failures": self.readyz_failures,
            "peak_rss_mib": self.peak_rss_bytes / 2**20,
            "cpu_pct": 100 * self.cpu_s / self.wall_s if self.wall_s else 0.0,
            "attack": self.attack,
        }


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Load:
    """RATE req/s of short chats on a fixed schedule (open loop), WORKERS threads (half h1, half h2c); /readyz; RSS.

    Latency counts from when a request was due, not from when a worker got to it: with
    every worker stuck behind a slow sidecar, the wait shows in the figures instead of
    hiding as requests never sent (coordinated omission).
    """

    def __init__(self, phase: Phase, url: str, admin: str, pid: int) -> None:
        self.phase, self.url, self.admin, self.pid = phase, url, admin, pid
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.due: queue.Queue[float] = queue.Queue()
        self.threads = [
            threading.Thread(target=self._requests, args=(i % 2 == 1,), daemon=True) for i in range(WORKERS)
        ]
        self.threads += [
            threading.Thread(target=self._schedule, daemon=True),
            threading.Thread(target=self._watch, daemon=True),
        ]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(TIMEOUT_S + 2)
        with self.lock:  # due but never started: the load generator could not keep up, or the sidecar could not
            while not self.due.empty():
                self.due.get_nowait()
                self.phase.sent += 1
                self.phase.errors["not started"] = self.phase.errors.get("not started", 0) + 1

    def _schedule(self) -> None:
        period, next_at = 1.0 / RATE, time.monotonic()
        while not self.stop.wait(max(0.0, next_at - time.monotonic())):
            self.due.put(next_at)
            next_at += period

    def _requests(self, h2: bool) -> None:
        with httpx.Client(http2=h2, http1=not h2, timeout=TIMEOUT_S, trust_env=False) as client:
            while not self.stop.is_set():
                try:
                    due = self.due.get(timeout=0.1)
                except queue.Empty:
                    continue
                try:
                    resp = client.post(self.url + "/v1/chat/completions", json=CHAT)
                    reason = resp.headers.get("x-rampmeter-reason", "")
                    error = None if resp.status_code == 200 else f"{resp.status_code} {reason}".strip()
                except httpx.HTTPError as exc:
                    error = type(exc).__name__
                took = time.monotonic() - due
                with self.lock:
                    self.phase.sent += 1
                    if error is None:
                        self.phase.ok += 1
                        self.phase.latencies_s.append(took)
                    else:
                        self.phase.errors[error] = self.phase.errors.get(error, 0) + 1

    def _watch(self) -> None:
        with httpx.Client(timeout=TIMEOUT_S, trust_env=False) as client:
            tick = 0
            while not self.stop.is_set():
                self.phase.peak_rss_bytes = max(self.phase.peak_rss_bytes, rss(self.pid))
                if tick % 2 == 0:
                    try:
                        good = client.get(self.admin + "/readyz").status_code == 200
                    except httpx.HTTPError:
                        good = False
                    if not good:
                        with self.lock:
                            self.phase.readyz_failures += 1
                tick += 1
                self.stop.wait(0.1)


def run_phase(name: str, pod: Proc, attack_s: float) -> Phase:
    phase = Phase(name)
    car_args = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--upstream",
        pod.url(),
        "--log-level",
        "warning",
    ]
    with Proc(car_args, cpu=SIDECAR_CPU, name="sidecar") as car:
        wait_ok(car.url("admin") + "/readyz")
        pid = car.popen.pid
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        with Load(phase, car.url(), car.url("admin"), pid):
            time.sleep(LEAD_S)
            if name == "baseline":
                time.sleep(attack_s)
            else:
                phase.attack = attacker(name, car.addresses["data"], attack_s)
        phase.cpu_s, phase.wall_s = cpu_seconds(pid) - cpu0, time.monotonic() - t0
        phase.peak_rss_bytes = max(phase.peak_rss_bytes, rss(pid))
    return phase


def attacker(name: str, address: str, duration_s: float) -> dict:
    """The attack in its own process (own GIL), on the load's CPU at a lower priority; its tally."""
    cmd = [sys.executable, "-m", "proxy.testing.attacks", name, "--target", address, "--duration-s", str(duration_s)]
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > OTHER_CPU:
        cmd = ["taskset", "-c", str(OTHER_CPU), *cmd]
    done = subprocess.run(
        ["nice", "-n", "5", *cmd], capture_output=True, text=True, timeout=duration_s + 60, env={**os.environ}
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"name": name, "error": (done.stderr or done.stdout)[-500:]}
    return json.loads(lines[-1])


def main() -> int:
    args = parse_args(NAME, __doc__, lambda p: p.add_argument("--only", nargs="*", choices=sorted(ATTACKS)))
    attack_s = 3.0 if args.quick else 25.0
    names = args.only or sorted(ATTACKS)
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > OTHER_CPU:
        os.sched_setaffinity(0, {OTHER_CPU})
    pod_args = ["sim-pod", "--listen", "127.0.0.1:0", "--profile", "llm", "--speed", "20"]
    phases: list[Phase] = []
    with Proc(pod_args, cpu=OTHER_CPU, name="sim-pod") as pod:
        wait_ok(pod.url() + "/health")
        for name in ["baseline", *names, "baseline"]:
            phase = run_phase(name, pod, attack_s)
            phases.append(phase)
            f = phase.figures()
            print(
                f"{name:20s} ok {f['ok']}/{f['sent']} p99 {f['p99_ms'] or 0:.0f} ms rss {f['peak_rss_mib']:.0f} MiB "
                f"cpu {f['cpu_pct']:.0f}% readyz-fail {f['readyz_failures']} attack {json.dumps(f['attack'])[:160]}",
                flush=True,
            )
    return report(args, phases)


def report(args, phases: list[Phase]) -> int:
    runs = {f"{i:02d}_{p.name}": p.figures() for i, p in enumerate(phases)}
    base = [p.figures() for p in phases if p.name == "baseline"]
    base_p99 = statistics.mean(b["p99_ms"] for b in base if b["p99_ms"] is not None)
    targets = []
    rows = [
        "| phase | normal ok | p50 ms | p99 ms | p99 / no-attack | readyz fails | peak RSS MiB | sidecar CPU | attacker sent | attacker answered |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in phases:
        f = p.figures()
        ratio = f["p99_ms"] / base_p99 if f["p99_ms"] is not None and base_p99 else None
        attack = f["attack"] or {}
        answered = ", ".join(
            f"{k} {v}" for k, v in sorted(attack.get("outcomes", {}).items(), key=lambda kv: -kv[1])[:3]
        )
        rows.append(
            f"| {p.name} | {100 * f['success']:.1f}% of {f['sent']} | {f['p50_ms'] or 0:.1f} | {f['p99_ms'] or 0:.1f} | "
            f"{'-' if ratio is None else f'{ratio:.1f}x'} | {f['readyz_failures']} | {f['peak_rss_mib']:.0f} | "
            f"{f['cpu_pct']:.0f}% | {attack.get('sent', '-')} | {answered or attack.get('error', '-')[:60]} |"
        )
        if p.name == "baseline":
            continue
        targets += [
            target(f"{p.name}_success", f["success"], ">=", 0.99),
            target(f"{p.name}_p99_over_no_attack", ratio, "<=", 2.0),
            target(f"{p.name}_peak_rss_mib", f["peak_rss_mib"], "<=", RSS_LIMIT_MIB),
        ]
    met = sum(t["met"] for t in targets)
    markdown = "\n".join(
        [
            f"# bench.attacks ({'quick' if args.quick else 'full'})",
            "",
            f"Normal load {RATE:g} req/s (half HTTP/1.1, half h2c) beside each attack; no-attack p99 {base_p99:.1f} ms "
            f"(mean of the first and last baseline). Sidecar pinned to CPU {SIDECAR_CPU}; sim pod, load and attacker "
            f"(nice +5) on CPU {OTHER_CPU}. Targets met: {met} of {len(targets)}.",
            "",
            *rows,
        ]
    )
    out = write_result(args, runs, targets, markdown)
    print(markdown)
    print(f"\nwritten to {out}/result.json and result.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
