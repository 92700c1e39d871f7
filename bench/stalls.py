"""The machine's own stalls during a benchmark: how long each CPU kept a waiting task off it.

Theory of operation: `CpuStalls(cpus)` starts one tiny process per CPU, pinned there, that
sleeps 10 ms in a loop and writes one JSON line each time a sleep overshoots by more than
STALL_MS: when (monotonic), how long, and how that time was spent by the CPU (the host's
steal, the guest's user+system, irq+softirq, from /proc/stat) and by the sleeper itself (its
run-queue wait, /proc/self/schedstat). The sleeper does no work, so an overshoot is time it
was ready to run and the CPU gave to something else: every process pinned to that CPU (the
sidecar, the pod, the load) lost that time too. `worst(cpu, t0, t1)` answers the longest
stall in a window; a window's p99 that matches it is the machine's, not the process's.

Why: on the shared 2-core VM, bench.attacks' ~0.5 s outliers (docs/security.md) were such
stalls: 0.1-0.7 s waits with no steal, while other sessions' jobs (their own autogroups)
loaded the same CPU, seen by this sleeper with nothing of ours running. Costs ~2% of a core
per CPU measured (100 wake-ups a second and two /proc reads each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Self

STALL_MS = 30.0  # an overshoot of the 10 ms sleep past this is a stall (timer slack and a busy core stay below)

_SLEEPER = r"""
import json, os, sys, time
cpu, out, floor = int(sys.argv[1]), open(sys.argv[2], "w"), float(sys.argv[3]) / 1000
os.sched_setaffinity(0, {cpu})
tag = f"cpu{cpu} "
def cpu_times():
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(tag):
                v = [int(x) for x in line.split()[1:9]]
                return v[7], v[0] + v[1] + v[2], v[5] + v[6]  # steal, user+nice+system, irq+softirq
    return 0, 0, 0
def run_delay():
    with open("/proc/self/schedstat") as f:
        return int(f.read().split()[1])
tick = 1000 / os.sysconf("SC_CLK_TCK")  # ms per /proc/stat unit
while True:
    c0, r0, t0 = cpu_times(), run_delay(), time.monotonic()
    time.sleep(0.01)
    over = time.monotonic() - t0 - 0.01
    if over > floor:
        c1, r1 = cpu_times(), run_delay()
        row = {"at": t0, "ms": over * 1000, "steal_ms": (c1[0] - c0[0]) * tick, "busy_ms": (c1[1] - c0[1]) * tick,
               "irq_ms": (c1[2] - c0[2]) * tick, "runq_ms": (r1 - r0) / 1e6}
        out.write(json.dumps(row) + "\n")
        out.flush()
"""


def worst(rows: list[dict], t0: float, t1: float) -> dict | None:
    """The longest stall that began inside [t0, t1) (monotonic seconds), or None."""
    inside = [r for r in rows if t0 <= r["at"] < t1]
    return max(inside, key=lambda r: r["ms"], default=None)


class CpuStalls:
    """One pinned sleeper per CPU for the life of the `with` block (module doc)."""

    def __init__(self, cpus: list[int]) -> None:
        self.cpus = [c for c in cpus if hasattr(os, "sched_setaffinity") and c < (os.cpu_count() or 1)]
        self.dir = Path(tempfile.mkdtemp(prefix="rampmeter-bench-stalls-"))
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Self:
        for cpu in self.cpus:
            path = self.dir / f"cpu{cpu}.jsonl"
            self.procs.append(subprocess.Popen([sys.executable, "-c", _SLEEPER, str(cpu), str(path), str(STALL_MS)]))
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()

    def rows(self, cpu: int) -> list[dict]:
        path = self.dir / f"cpu{cpu}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]

    def worst(self, t0: float, t1: float) -> dict[int, dict | None]:
        """CPU -> its longest stall in [t0, t1)."""
        return {cpu: worst(self.rows(cpu), t0, t1) for cpu in self.cpus}
