"""Warm-up probe plan and success criterion: which probe next, and are we warm yet?

Theory of operation: a warm-up sends several request *shapes* (short prompt,
long prompt, ...) because a model server compiles kernels and sizes allocators
per shape; a server warmed on one size is still cold for the others. Each shape
may be sent at most `counts[i]` times. The runtime driver asks `next_probe()`
for the shape to send (the shape with the fewest probes issued, among those
still undecided: round robin, so every shape makes progress under any
concurrency), and `record()`s each result as it completes. `verdict()` is:

- passed, once the criterion holds for every shape;
- failed, once some shape has used all its probes, they have all completed,
  and the criterion does not hold for it;
- pending otherwise (the driver's overall deadline covers the rest).

Criteria, per shape, over its results in completion order:
- `StableLatency(last_n, within_pct)`: the last `last_n` probes all succeeded
  and latency has stopped falling: none of the last `last_n - 1` is more than
  `within_pct` % faster than the fastest probe before them. First requests are
  slow while kernels compile; once the newest probes no longer beat the old
  best, the shape is warm. This holds whenever the old rule did (the last
  `last_n` agree within `within_pct`: (max - min) / min) and also on servers
  whose latencies jitter by more than that (a CPU server's +-30 % kept the old
  rule failing until every probe was spent, then a retry: 29 s before ready for
  a model up after 1.2 s), while a cold penalty that is still being paid off
  (each probe faster than the last) keeps it false.
- `FixedCount(successes)`: at least `successes` probes succeeded.

Pure: latencies are measured by the caller; nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StableLatency:
    last_n: int
    within_pct: float


@dataclass(frozen=True)
class FixedCount:
    successes: int


Criterion = StableLatency | FixedCount


@dataclass(frozen=True)
class ProbeResult:
    shape: int
    ok: bool
    latency_s: float
    detail: str = ""  # "200", "503", "timeout", "connect error: ..."


@dataclass(frozen=True)
class Verdict:
    done: bool
    passed: bool
    reason: str


PENDING = Verdict(False, False, "pending")


def criterion_met(criterion: Criterion, results: Sequence[ProbeResult]) -> bool:
    """Whether one shape's results (in completion order) satisfy `criterion`."""
    if isinstance(criterion, FixedCount):
        return sum(r.ok for r in results) >= criterion.successes
    n = criterion.last_n
    tail = results[-n:]
    if len(tail) < n or not all(r.ok for r in tail):
        return False
    newest = min(r.latency_s for r in results[-(n - 1) :])
    best_before = min(r.latency_s for r in results[: len(results) - (n - 1)] if r.ok)
    return newest >= best_before * (1.0 - criterion.within_pct / 100.0)


def spread_pct(latencies: Sequence[float]) -> float:
    """(max - min) / min in percent; infinite when the fastest took no time at all."""
    low, high = min(latencies), max(latencies)
    if low <= 0:
        return 0.0 if high <= 0 else float("inf")
    return (high - low) / low * 100.0


@dataclass(frozen=True)
class ShapeStatistics:
    issued: int
    completed: int
    succeeded: int
    met: bool
    last_latency_s: float | None
    last_detail: str


class ProbePlan:
    """One warm-up attempt's bookkeeping: which probe next, and the verdict."""

    def __init__(self, counts: Sequence[int], criterion: Criterion) -> None:
        if any(c < 1 for c in counts):
            raise ValueError("every shape needs a count >= 1")
        self.counts = tuple(counts)
        self.criterion = criterion
        self._issued = [0] * len(counts)
        self._results: list[list[ProbeResult]] = [[] for _ in counts]
        self._met = [False] * len(counts)

    def __repr__(self) -> str:
        done = sum(self._met)
        return f"<ProbePlan {done}/{len(self.counts)} shapes met, issued={self._issued} {self.verdict().reason}>"

    def next_probe(self) -> int | None:
        """The shape to probe next, or None when nothing more should be sent now."""
        if self.verdict().done:
            return None
        open_shapes = [i for i, n in enumerate(self._issued) if not self._met[i] and n < self.counts[i]]
        if not open_shapes:
            return None  # the rest is in flight
        shape = min(open_shapes, key=lambda i: self._issued[i])
        self._issued[shape] += 1
        return shape

    def record(self, result: ProbeResult) -> None:
        results = self._results[result.shape]
        if len(results) >= self._issued[result.shape]:
            raise ValueError(f"result for shape {result.shape} that was never issued")
        results.append(result)
        if not self._met[result.shape]:
            self._met[result.shape] = criterion_met(self.criterion, results)

    def verdict(self) -> Verdict:
        if all(self._met):
            return Verdict(True, True, f"all {len(self.counts)} shapes warm")
        for i, results in enumerate(self._results):
            if not self._met[i] and len(results) == self.counts[i]:
                return Verdict(
                    True, False, f"shape {i}: criterion not met in {self.counts[i]} probes ({_describe(results)})"
                )
        return PENDING

    def statistics(self) -> tuple[ShapeStatistics, ...]:
        return tuple(
            ShapeStatistics(
                issued=self._issued[i],
                completed=len(rs),
                succeeded=sum(r.ok for r in rs),
                met=self._met[i],
                last_latency_s=rs[-1].latency_s if rs else None,
                last_detail=rs[-1].detail if rs else "",
            )
            for i, rs in enumerate(self._results)
        )


def _describe(results: Sequence[ProbeResult]) -> str:
    failed = [r.detail for r in results if not r.ok]
    if failed:
        return f"{len(failed)} failed, last: {failed[-1]}"
    tail = [r.latency_s for r in results[-3:]]
    return "last latencies " + ", ".join(f"{t * 1000:.0f} ms" for t in tail)
