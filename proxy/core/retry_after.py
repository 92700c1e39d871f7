"""Retry-After for rejections: when the queue ahead would have drained, jittered, bounded.

Theory of operation: a rejected client should come back when there is room, not at
once (a retry storm) and not all together (a thundering herd).
  base_ms    = clamp(ceil(drain_ms), min_ms, max_ms)
  drain_ms   = work_ahead / drain_rate_per_s * 1000   (max_ms when nothing drains)
`base_ms` is monotone non-decreasing in the backlog. Jitter then spreads clients over
[lo, lo * (1 + jitter)], lo = min(base_ms, max_ms / (1 + jitter)), with u drawn from
an injected random source:
  retry_ms = clamp(ceil(lo * (1 + jitter * u)), min_ms, max_ms)
So a client is never told to come back before the queue ahead has drained (except
inside the top jitter band just below max_ms), the spread never collapses onto max_ms
(clients at the cap stay spread below it), and every answer lies in [min_ms, max_ms].

Scheduled pushback (`schedule`, for a full queue under sustained overload): the plain
drain time sends every rejected client back when the queue *now* would have drained,
but the clients rejected meanwhile are told the same, and new arrivals refill the
queue first; each retry finds it full again (bench.grpc at 2x with a 5-attempt gRPC
retry policy: ~4.5 rejected attempts per call, the sidecar's CPU going to rejections
on a shared core, goodput 0.3-0.5 of peak). So `schedule` keeps a virtual queue of the
retries already promised: the next promise starts where the last one ended, or when
the queue ahead drains if that is later, and reserves one slot interval (the backend's
service time over its parallelism: how often a slot frees):
  start_ms     = max(drain_ms, promised_until - now)
  retry_ms     = clamp(ceil(start_ms + u * slot_ms), min_ms, max_ms)   (u full jitter in one slot)
  promised_until = now + start_ms + slot_ms
Retries then come back spread at the rate slots free. A promise that would start at or
after the caller's deadline (`remaining_ms`) is not made: None, "a retry cannot help"
(gRPC -1), so under sustained overload the promises stop at the deadline horizon and
the excess calls fail at once instead of retrying into a full queue.
`proxy.core.wire.rejection` writes it as `x-rampmeter-retry-after-ms` and as whole
seconds (rounded up, at least 1) in `retry-after`.
"""

from __future__ import annotations

import math
from typing import Protocol


class RandomSource(Protocol):
    """What we need of `random.Random`: a float in [0, 1)."""

    def random(self) -> float: ...


def drain_ms(work_ahead: float, drain_rate_per_s: float) -> float:
    """ms until `work_ahead` units drain at `drain_rate_per_s`; inf when nothing drains."""
    if work_ahead <= 0:
        return 0.0
    if drain_rate_per_s <= 0:
        return math.inf
    return work_ahead / drain_rate_per_s * 1000.0


class RetryAfter:
    __slots__ = ("_jitter_floor_ms", "_promised_until", "_rng", "jitter", "max_ms", "min_ms")

    def __init__(self, min_ms: int, max_ms: int, jitter: float, rng: RandomSource) -> None:
        if not (0 <= min_ms <= max_ms and 0 <= jitter <= 1):
            raise ValueError("need 0 <= min_ms <= max_ms and 0 <= jitter <= 1")
        self.min_ms, self.max_ms, self.jitter, self._rng = min_ms, max_ms, jitter, rng
        self._jitter_floor_ms = max_ms / (1 + jitter)
        self._promised_until = -math.inf  # when the last scheduled retry's slot ends (seconds, caller's clock)

    def base_ms(self, drain: float) -> int:
        """Before jitter: the drain time, rounded up and clamped."""
        if drain >= self.max_ms:  # also inf
            return self.max_ms
        return max(self.min_ms, math.ceil(drain))

    def __call__(self, drain: float) -> int:
        """Jittered Retry-After in ms for a queue that drains in `drain` ms."""
        lo = min(self.base_ms(drain), self._jitter_floor_ms)
        ms = math.ceil(lo * (1 + self.jitter * self._rng.random()))
        return max(self.min_ms, min(self.max_ms, ms))

    def schedule(self, drain: float, now: float, slot_ms: float, remaining_ms: float = math.inf) -> int | None:
        """Pushback in ms for a full queue that drains in `drain` ms, behind the retries already
        promised, one slot of `slot_ms` each (module doc); None when it would not start before
        the caller's deadline, `remaining_ms` from `now` (no promise is recorded then)."""
        start_ms = max(0.0, drain, (self._promised_until - now) * 1000.0)
        if start_ms >= self.max_ms:  # as far as a promise goes: the cap, without growing the line
            return self.max_ms if self.max_ms < remaining_ms else None
        slot = max(0.0, slot_ms) if math.isfinite(slot_ms) else 0.0
        # (less a nanosecond: `_promised_until` is seconds, and 6.2 - 5.0 is 1.2000000000000002)
        ms = max(self.min_ms, min(self.max_ms, math.ceil(start_ms + slot * self._rng.random() - 1e-6)))
        if ms >= remaining_ms:
            return None
        self._promised_until = now + (start_ms + slot) / 1000.0
        return ms

    def __repr__(self) -> str:
        return f"RetryAfter(min_ms={self.min_ms}, max_ms={self.max_ms}, jitter={self.jitter:g})"
