"""Exact percentiles and per-group figures from the rows of a run.

Theory of operation: every figure is computed from the raw rows after the run
(`records.py`), never from a sketch: a step's latencies are sorted and read at
nearest rank, so p99 of [1..100] ms is exactly 99 ms and tests can check the
arithmetic on hand-made samples.

Definitions (also in docs/loadtest.md):
- measured requests: rows whose intended send time lies in the step's measured
  window (warm-up excluded).
- latency: end - intended send time, over rows that got a response (any
  status) or hit the client timeout (censored at the timeout: a request that
  never answered is slower than the SLA, not absent). Connect and protocol
  errors are counted apart and carry no latency.
- good: 2xx, a body that parsed, and latency within the row's own bound (its
  shape's deadline, else the global SLA bound); goodput = good / window.
- achieved: HTTP responses (any status) whose end falls in the window, from any
  step, per second of window; offered: measured requests per second.
- TTFT: first streamed event - intended send time; TPOT: (end - first event) /
  (tokens - 1) for streams of at least two tokens.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from math import isnan

from proxy.loadtest.records import ERROR_NAMES, NON_JSON, OK, TIMEOUT, ReasonTable, Records

QUANTILES = (50.0, 95.0, 99.0, 99.9)


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending, non-empty sequence; q in (0, 100]."""
    if not ordered:
        raise ValueError("percentile of no samples")
    if not 0 < q <= 100:
        raise ValueError(f"percentile {q} outside (0, 100]")
    rank = math.ceil(q / 100.0 * len(ordered) - 1e-9)
    return ordered[max(1, rank) - 1]


@dataclass(frozen=True)
class Summary:
    """Latency-like figures in milliseconds."""

    count: int
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float

    def at(self, q: float) -> float:
        """The figure for percentile q (50, 95, 99, 99.9 or 100), ms."""
        table = {50.0: self.p50_ms, 95.0: self.p95_ms, 99.0: self.p99_ms, 99.9: self.p999_ms, 100.0: self.max_ms}
        if q not in table:
            raise ValueError(f"no figure for p{q:g}; reported: p50 p95 p99 p99.9 max")
        return table[q]


def summarize(values_s: Iterable[float]) -> Summary | None:
    """Exact summary of samples in seconds (None when there are none)."""
    ordered = sorted(values_s)
    if not ordered:
        return None
    ms = [percentile(ordered, q) * 1000.0 for q in QUANTILES]
    p50, p95, p99, p999 = ms  # QUANTILES
    return Summary(len(ordered), sum(ordered) / len(ordered) * 1000.0, p50, p95, p99, p999, ordered[-1] * 1000.0)


@dataclass(frozen=True)
class Figures:
    requests: int  # measured requests
    responses: int  # got an HTTP response, any status
    ok: int  # 2xx
    good: int  # 2xx within its SLA
    offered_rps: float
    achieved_rps: float
    goodput_rps: float
    latency: Summary | None
    ttft: Summary | None = None
    tpot: Summary | None = None
    status: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)  # timeout, connect_error, protocol_error, non_json, not_sent

    @property
    def failed_fraction(self) -> float:
        """Share of measured requests that did not come back 2xx with a usable body."""
        return 0.0 if not self.requests else 1.0 - self.ok / self.requests


Rows = list[tuple[Records, list[int]]]  # (records, row indices) pairs of one group


def figures(
    rows: Rows, window_s: float, bound_s: Callable[[int], float | None], reasons: ReasonTable, achieved: int
) -> Figures:
    """Figures of one group. `bound_s(shape)` is a row's latency bound; `achieved` counts responses in window."""
    latencies, ttfts, tpots = [], [], []
    status: dict[str, int] = {}
    why: dict[str, int] = {}
    errors: dict[str, int] = {}
    n = responses = ok = good = 0
    for rec, idx in rows:
        for i in idx:
            n += 1
            err, code = rec.error[i], rec.status[i]
            if err != OK:
                errors[ERROR_NAMES[err]] = errors.get(ERROR_NAMES[err], 0) + 1
            if code:
                responses += 1
                key = str(code)
                status[key] = status.get(key, 0) + 1
                if rec.reason[i]:
                    name = reasons.names[rec.reason[i]]
                    why[name] = why.get(name, 0) + 1
            if err not in (OK, NON_JSON, TIMEOUT):
                continue
            lat = rec.end[i] - rec.intended[i]
            latencies.append(lat)
            if err == OK and 200 <= code < 300:
                ok += 1
                bound = bound_s(rec.shape[i])
                good += bound is None or lat <= bound
            first = rec.ttft[i]
            if not isnan(first):  # a stream that produced an event
                ttfts.append(first)
                if rec.tokens[i] > 1:
                    tpots.append((lat - first) / (rec.tokens[i] - 1))
    per_s = 1.0 / window_s if window_s > 0 else 0.0
    return Figures(
        n,
        responses,
        ok,
        good,
        n * per_s,
        achieved * per_s,
        good * per_s,
        summarize(latencies),
        summarize(ttfts),
        summarize(tpots),
        dict(sorted(status.items())),
        dict(sorted(why.items())),
        dict(sorted(errors.items())),
    )


def in_window(rec: Records, start: float, stop: float, by: str = "intended") -> list[int]:
    """Indices of rows whose `by` time (intended or end) lies in [start, stop)."""
    if by == "end":
        status = rec.status
        return [i for i, t in enumerate(rec.end) if start <= t < stop and status[i]]
    return [i for i, t in enumerate(rec.intended) if start <= t < stop]
