"""Figures of one run: amplification, goodput before/during/after the fault, recovery time.

Theory of operation: a logical request is *good* when it got a 2xx within
`SLA_S` of its intended send time (3 s: the SDK's deadline, and about what the
naive client's three 1 s attempts add up to). Goodput is binned by intended
send time: "of the requests issued at time t, how many were served well", so
a backlog that drains after the fault cannot pass for recovery, and every
population is judged on exactly the same arrivals (same trace). Attempts are
binned by the time each was sent: what the server saw.

- amplification: attempts per logical request (0 for a call refused locally by
  the SDK's throttle), over the measured run and per phase;
- goodput per phase: good requests per second, by phase of intended time;
- recovery_s: from the fault's end to the first instant t from which the
  requests issued in [t, t + RECOVERY_WINDOW_S) succeed at >= 90% of the
  pre-fault success ratio (None: not within the run). Using the ratio to the
  same trace's offered requests, not a count, keeps Poisson noise out of it.

Pure: takes the calls and attempt times, returns plain dicts.
"""

from __future__ import annotations

from collections import Counter

from bench.retry_storm.populations import Call
from bench.retry_storm.scenario import Timeline

SLA_S = 3.0
BIN_S = 0.5
RECOVERY_WINDOW_S = 2.0
RECOVERY_STEP_S = 0.1
RECOVERED_FRACTION = 0.9
LAST_S = 5.0


def good(call: Call) -> bool:
    return call.ok and call.end is not None and call.end - call.intended <= SLA_S


def _phase(calls: list[Call], start: float, end: float) -> dict:
    inside = [c for c in calls if start <= c.intended < end]
    n, span = len(inside), end - start
    n_good = sum(good(c) for c in inside)
    attempts = sum(c.attempts for c in inside)
    latencies = sorted(c.end - c.intended for c in inside if c.end is not None)
    p99 = latencies[int(0.99 * (len(latencies) - 1))] if latencies else None
    return {
        "calls": n,
        "offered_rps": n / span,
        "goodput_rps": n_good / span,
        "success_ratio": n_good / n if n else None,
        "amplification": attempts / n if n else None,
        "p99_latency_s": p99,
    }


def _series(calls: list[Call], attempt_times, total_s: float) -> dict:
    bins = int((total_s + SLA_S) / BIN_S) + 1
    offered, goodput, attempts = [0] * bins, [0] * bins, [0] * bins
    for c in calls:
        i = int(c.intended / BIN_S)
        offered[i] += 1
        goodput[i] += good(c)
    for t in attempt_times:
        if 0 <= t < bins * BIN_S:
            attempts[int(t / BIN_S)] += 1
    per_s = 1.0 / BIN_S
    return {
        "bin_s": BIN_S,
        "t": [i * BIN_S for i in range(bins)],
        "offered_rps": [x * per_s for x in offered],
        "goodput_rps": [x * per_s for x in goodput],
        "attempts_rps": [x * per_s for x in attempts],
    }


def recovery_s(calls: list[Call], fault_end: float, run_end: float, baseline: float | None) -> float | None:
    """Seconds from `fault_end` until the success ratio is back at 90% of `baseline` (see module doc)."""
    if not baseline:
        return None
    ordered = sorted(calls, key=lambda c: c.intended)
    k = 0
    while k * RECOVERY_STEP_S + RECOVERY_WINDOW_S <= run_end - fault_end + 1e-9:
        start = fault_end + k * RECOVERY_STEP_S
        window = [c for c in ordered if start <= c.intended < start + RECOVERY_WINDOW_S]
        if window and sum(good(c) for c in window) / len(window) >= RECOVERED_FRACTION * baseline:
            return round(k * RECOVERY_STEP_S, 3)
        k += 1
    return None


def analyze(calls: list[Call], attempt_times, timeline: Timeline, fault_at: float | None) -> dict:
    fault_at = timeline.fault_at if fault_at is None else fault_at
    fault_end = fault_at + timeline.fault_s
    end = timeline.total_s
    measured = [c for c in calls if c.intended >= timeline.warmup_s]
    before = _phase(calls, timeline.warmup_s, fault_at)
    outcomes = Counter(c.outcome for c in measured)
    return {
        "calls": len(measured),
        "amplification": sum(c.attempts for c in measured) / max(1, len(measured)),
        "before": before,
        "during": _phase(calls, fault_at, fault_end),
        "after": _phase(calls, fault_end, end),
        "last": _phase(calls, end - LAST_S, end),
        "recovery_s": recovery_s(calls, fault_end, end, before["success_ratio"]),
        "fault_window": [fault_at, fault_end],
        "outcomes": dict(outcomes.most_common()),
        "series": _series(calls, attempt_times, end),
    }
