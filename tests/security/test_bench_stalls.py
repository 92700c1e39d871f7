"""bench/stalls.py, the CPU stall meter bench/attacks reports beside each window's p99.

A control for the benchmark: a stall it reports must be a real one of about the length
it says, and none where there was none. The sleeper is stopped (SIGSTOP) for a known
time, which to it is the same as a CPU given to someone else that long.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from bench.stalls import CpuStalls, worst
from proxy.testing.procs import wait_for


def _wait_for_rows(meter: CpuStalls, cpu: int, timeout_s: float = 5.0) -> list[dict]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        rows = meter.rows(cpu)
        if rows:
            return rows
        time.sleep(0.02)
    return []


def _wait_started(meter: CpuStalls, cpu: int) -> None:
    """Until the sleeper runs its loop: its output file opened and its affinity set, the last steps
    before the loop (a fixed sleep stood for this, and a slow start on a loaded machine left the
    SIGSTOP landing before the loop, so no stall was measured)."""
    pid = meter.procs[0].pid

    def pinned() -> bool:
        status = Path(f"/proc/{pid}/status").read_text()
        return (meter.dir / f"cpu{cpu}.jsonl").exists() and f"Cpus_allowed_list:\t{cpu}\n" in status

    wait_for(pinned, timeout_s=10, interval_s=0.01)
    time.sleep(0.05)  # the loop's set-up after that: a few function definitions


def test_a_sleeper_kept_off_its_cpu_reports_the_stall():
    with CpuStalls([0]) as meter:
        _wait_started(meter, 0)
        t0 = time.monotonic()
        meter.procs[0].send_signal(signal.SIGSTOP)
        time.sleep(0.25)
        meter.procs[0].send_signal(signal.SIGCONT)
        rows = _wait_for_rows(meter, 0)
        t1 = time.monotonic()
    longest = worst(rows, t0 - 0.05, t1)
    assert longest is not None, rows
    assert 200 <= longest["ms"] <= 2000, longest
    assert set(longest) == {"at", "ms", "steal_ms", "busy_ms", "irq_ms", "runq_ms"}


def test_worst_is_the_longest_stall_begun_inside_the_window():
    rows = [{"at": 1.0, "ms": 400.0}, {"at": 2.0, "ms": 50.0}, {"at": 2.5, "ms": 90.0}, {"at": 3.0, "ms": 35.0}]
    assert worst(rows, 1.5, 3.0) == {"at": 2.5, "ms": 90.0}  # the 400 ms one began before, the last at the end
    assert worst(rows, 3.5, 9.0) is None
