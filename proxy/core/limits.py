"""Concurrency limit algorithms: compute a number, never enforce it.

Theory of operation (after Netflix concurrency-limits `Limit.onSample` and Envoy
adaptive concurrency): a Limit is fed one sample per finished request,
`on_sample(now, rtt_ms, inflight, dropped)`, and answers the new limit; the
admission controller enforces it. Each change records its reason
(`last_reason`), which the runtime counts.

- `FixedLimit`: always `initial_limit`.
- `GradientLimit` (Gradient2 style): a short decayed mean of recent latency is
  compared with a reference, either `target_latency_ms` or the long-term decayed
  mean x `tolerance` (the long mean is pulled down when it runs > 2x the short
  one, so it recovers after an overload episode, as in Gradient2).
      gradient  = clamp(reference / short, 0.5, 1.0)
      estimate  = limit * gradient + allowance,  allowance = max(1, ratio * limit)
      limit     = limit * (1 - smoothing) + estimate * smoothing, within [min, max]
  With latency on target the allowance grows the limit; latency above it pulls
  the limit down by at most half per sample. A dropped request (upstream
  overload, timeout) multiplies the limit by `backoff_ratio`. While less than
  half the limit is in use the limit is not raised (an idle upstream proves
  nothing about a bigger batch).

Units: whatever the controller counts (requests or tokens); the limit is a float
internally and `int()` for enforcement, at least 1.
"""

from __future__ import annotations

from typing import Protocol


class Limit(Protocol):
    value: int
    last_reason: str

    def on_sample(self, now: float, rtt_ms: float, inflight: float, dropped: bool) -> int: ...

    def statistics(self) -> dict: ...


class FixedLimit:
    __slots__ = ("last_reason", "value")

    def __init__(self, limit: int) -> None:
        self.value = max(1, int(limit))
        self.last_reason = "initial"

    def on_sample(self, now: float, rtt_ms: float, inflight: float, dropped: bool) -> int:
        return self.value

    def statistics(self) -> dict:
        return {"kind": "fixed", "limit": self.value, "last_reason": self.last_reason}

    def __repr__(self) -> str:
        return f"<FixedLimit {self.value}>"


class GradientLimit:
    __slots__ = (
        "_allowance",
        "_backoff",
        "_limit",
        "_long_a",
        "_max",
        "_min",
        "_short_a",
        "_smoothing",
        "_target",
        "_tolerance",
        "changed_at",
        "last_reason",
        "long_ms",
        "samples",
        "short_ms",
        "value",
    )

    def __init__(
        self,
        initial: int,
        min_limit: int,
        max_limit: int,
        *,
        target_latency_ms: float = 0.0,
        tolerance: float = 1.5,
        smoothing: float = 0.2,
        queue_allowance_ratio: float = 0.1,
        backoff_ratio: float = 0.9,
        short_window_samples: int = 10,
        long_window_samples: int = 600,
    ) -> None:
        self._min, self._max = min_limit, max_limit
        self._limit = float(min(max(initial, min_limit), max_limit))
        self.value = int(self._limit)
        self.last_reason = "initial"
        self._target = target_latency_ms
        self._tolerance = tolerance
        self._smoothing = smoothing
        self._allowance = queue_allowance_ratio
        self._backoff = backoff_ratio
        self._short_a = 2.0 / (short_window_samples + 1)
        self._long_a = 2.0 / (long_window_samples + 1)
        self.short_ms: float | None = None
        self.long_ms: float | None = None
        self.changed_at: float | None = None
        self.samples = 0

    def on_sample(self, now: float, rtt_ms: float, inflight: float, dropped: bool) -> int:
        self.samples += 1
        if dropped:
            return self._set(self._limit * self._backoff, "drop", now)
        short = self.short_ms = (
            rtt_ms if self.short_ms is None else self.short_ms + self._short_a * (rtt_ms - self.short_ms)
        )
        long = self.long_ms = rtt_ms if self.long_ms is None else self.long_ms + self._long_a * (rtt_ms - self.long_ms)
        if short > 0 and long / short > 2.0:
            self.long_ms = long = long * 0.95
        reference = self._target if self._target > 0 else long * self._tolerance
        gradient = 1.0 if short <= 0 else max(0.5, min(1.0, reference / short))
        if gradient >= 1.0 and inflight < self._limit / 2:
            return self.value  # app-limited: no evidence for a bigger limit
        estimate = self._limit * gradient + max(1.0, self._allowance * self._limit)
        new = self._limit * (1.0 - self._smoothing) + estimate * self._smoothing
        return self._set(new, "latency" if gradient < 1.0 else "probe", now)

    def _set(self, new: float, reason: str, now: float) -> int:
        bounded = min(max(new, self._min), self._max)
        if bounded != new:
            reason = "min_limit" if new < self._min else "max_limit"
        self._limit = bounded
        value = max(1, int(bounded))
        if value != self.value:
            self.value, self.last_reason, self.changed_at = value, reason, now
        return self.value

    def statistics(self) -> dict:
        return {
            "kind": "gradient",
            "limit": self.value,
            "estimate": self._limit,
            "last_reason": self.last_reason,
            "short_ms": self.short_ms,
            "long_ms": self.long_ms,
            "samples": self.samples,
        }

    def __repr__(self) -> str:
        return f"<GradientLimit {self.value} [{self._min}..{self._max}] last={self.last_reason} short={self.short_ms} long={self.long_ms}>"


def make_limit(policy) -> FixedLimit | GradientLimit:
    """Build the Limit a `[limits]` section describes."""
    if policy.kind == "fixed":
        return FixedLimit(policy.initial_limit)
    return GradientLimit(
        policy.initial_limit,
        policy.min_limit,
        policy.max_limit,
        target_latency_ms=policy.target_latency_ms,
        tolerance=policy.tolerance,
        smoothing=policy.smoothing,
        queue_allowance_ratio=policy.queue_allowance_ratio,
        backoff_ratio=policy.backoff_ratio,
        short_window_samples=policy.short_window_samples,
        long_window_samples=policy.long_window_samples,
    )
