"""CoDel-style queue-delay detection for one queue, with CoDel's drop schedule.

Theory of operation (after Nichols & Jacobson's CoDel, Facebook's "controlled delay"
RPC queue in "Fail at Scale"/wangle, and Triton's queue policy): a queue that is
sometimes empty is doing its job (absorbing bursts); a queue whose *minimum* wait over
a whole interval stays above `target_ms` is a standing queue that only adds latency.
`proxy.core.shedding` keeps one per class, as fq_codel keeps one per queue.

Samples: `observe(wait_ms, now)` takes a queue wait: the wait of each dequeued request,
and the age of the oldest queued request on each arrival (0 when the queue is empty;
an empty queue ends any standing queue). Time is cut into back-to-back intervals of
`interval_ms`, the first starting at the first sample. When an interval ends, its
minimum sample is compared to the target:
  min > target_ms  -> event ABOVE,   min <= target_ms -> event BELOW.
An interval that got no sample is judged from the next sample, back-projected: a
request that has waited w ms at `now` was already queued, w - (now - t) ms old, at every
earlier t, so the interval's minimum is taken as max(0, w - (now - interval start)).
Those projections grow by `interval_ms` from one empty interval to the next, so the
empty intervals read BELOW up to some point and ABOVE after it; each run is judged at
once (O(1) after any idle gap) and counted in full.

States, as a `(mode, event) -> mode` table:
  NORMAL   --ABOVE--> DROPPING
  DROPPING --ABOVE--> DROPPING
  DROPPING --BELOW--> NORMAL
  NORMAL   --BELOW--> NORMAL
While DROPPING, `take_drop(now)` is CoDel's control law: it answers True for one
arrival at once, then for the next after interval / sqrt(drops so far); the first
BELOW interval ends it and starts the count over. The decision is made at arrival
only; queued requests are left to the deadline expiry rule.

Retuning (`retune(target_ms, interval_ms, now)`): the shedder scales target and
interval with the backend's observed service time. A new target applies from
the next judged interval; a new interval restarts the grid at the start of the
running interval (its samples so far are kept), so no interval is judged twice
or skipped. Changes under 10% are ignored: quantile noise must not re-grid.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class Mode(enum.Enum):
    NORMAL = "normal"
    DROPPING = "dropping"


class Event(enum.Enum):
    ABOVE = "above"  # an interval's minimum wait stayed above target
    BELOW = "below"


_TRANSITIONS: dict[tuple[Mode, Event], Mode] = {
    (Mode.NORMAL, Event.BELOW): Mode.NORMAL,
    (Mode.NORMAL, Event.ABOVE): Mode.DROPPING,
    (Mode.DROPPING, Event.ABOVE): Mode.DROPPING,
    (Mode.DROPPING, Event.BELOW): Mode.NORMAL,
}


def transition(mode: Mode, event: Event) -> Mode:
    try:
        return _TRANSITIONS[(mode, event)]
    except KeyError:
        raise RuntimeError(f"CoDel: no transition from {mode} on {event}") from None


@dataclass(frozen=True, slots=True)
class CoDelStatistics:
    mode: Mode
    interval_min_ms: float | None  # minimum so far in the running interval
    intervals_above: int  # total intervals that ended above target
    intervals_below: int
    drops: int  # arrivals take_drop() answered True for since DROPPING began


class CoDel:
    def __init__(self, target_ms: float, interval_ms: float) -> None:
        if not (target_ms >= 0 and interval_ms > 0):
            raise ValueError("need target_ms >= 0 and interval_ms > 0")
        self.target_ms = target_ms
        self._interval_s = interval_ms / 1000.0
        self.mode = Mode.NORMAL
        self._t0: float | None = None  # interval k is [t0 + k * interval, t0 + (k + 1) * interval)
        self._closed = 0  # intervals judged so far
        self._next_end = math.inf  # end of the running interval, _end(_closed): the hot path's one compare
        self._min: float | None = None
        self._above = self._below = 0
        self._drops = 0  # arrivals taken by take_drop() since DROPPING began
        self._drop_next: float | None = None

    @property
    def dropping(self) -> bool:
        return self.mode is Mode.DROPPING

    @property
    def interval_end(self) -> float:
        """When the running interval ends (inf before the first sample): until then a sample at or
        above the interval's minimum changes nothing (Shedder.passes_quiet skips re-observing 0)."""
        return self._next_end

    def _end(self, k: int) -> float:
        return self._t0 + (k + 1) * self._interval_s  # type: ignore[operator]

    def observe(self, wait_ms: float, now: float) -> None:
        if now >= self._next_end:
            self._roll(wait_ms, now)
        elif self._t0 is None:
            self._t0 = now
            self._next_end = self._end(0)
        self._min = wait_ms if self._min is None or wait_ms < self._min else self._min

    def _roll(self, wait_ms: float, now: float) -> None:
        """Judge every interval that ended at or before `now`."""
        ended = math.floor((now - self._t0) / self._interval_s)  # type: ignore[operator]
        while self._end(ended) <= now:  # the division's rounding, either way, by the same formula
            ended += 1
        while ended > 0 and self._end(ended - 1) > now:
            ended -= 1
        pending = ended - self._closed
        if self._min is not None:  # the interval that holds real samples
            self._close(self._min, 1)
            pending -= 1
        if pending <= 0:
            return
        # Empty intervals j = 0..pending-1 start at `start` + j * interval; projected minimum
        # max(0, first + j * interval_ms): BELOW for j < below, ABOVE after.
        start = self._end(self._closed - 1) if self._closed else self._t0
        first = wait_ms - (now - start) * 1000.0  # type: ignore[operator]
        interval_ms = self._interval_s * 1000.0
        below = 0 if first > self.target_ms else min(pending, math.floor((self.target_ms - first) / interval_ms) + 1)
        if below:
            self._close(0.0, below)
        if pending > below:
            self._close(math.inf, pending - below)

    def _close(self, interval_min_ms: float, count: int) -> None:
        """Judge `count` intervals in a row, each with this minimum."""
        above = interval_min_ms > self.target_ms
        self.mode = transition(self.mode, Event.ABOVE if above else Event.BELOW)
        if above:
            self._above += count
        else:
            self._below += count
            self._drops, self._drop_next = 0, None
        self._min = None
        self._closed += count
        self._next_end = self._end(self._closed)

    def retune(self, target_ms: float, interval_ms: float, now: float) -> bool:
        """New target and interval (see the module doc); True when anything changed."""
        if not (target_ms >= 0 and interval_ms > 0):
            raise ValueError("need target_ms >= 0 and interval_ms > 0")
        interval_s = interval_ms / 1000.0
        same_target = abs(target_ms - self.target_ms) <= 0.1 * max(self.target_ms, 1e-9)
        same_interval = abs(interval_s - self._interval_s) <= 0.1 * self._interval_s
        if same_target and same_interval:
            return False
        self.target_ms = target_ms
        if not same_interval:
            if self._t0 is not None:
                start = self._end(self._closed - 1) if self._closed else self._t0
                self._t0, self._closed = min(start, now), 0
            self._interval_s = interval_s
            if self._t0 is not None:
                self._next_end = self._end(0)
        return True

    def take_drop(self, now: float) -> bool:
        """CoDel's control law: while DROPPING, shed one arrival at once, then the next after
        interval / sqrt(drops so far). Shedding every arrival instead empties the queue, the
        next interval reads BELOW and the queue refills (bench/overload at 2.5x: goodput fell
        below unbounded queueing's)."""
        if self.mode is not Mode.DROPPING:
            return False
        if self._drop_next is not None and now < self._drop_next:
            return False
        self._drops += 1
        self._drop_next = now + self._interval_s / math.sqrt(self._drops)
        return True

    def statistics(self) -> CoDelStatistics:
        return CoDelStatistics(self.mode, self._min, self._above, self._below, self._drops)

    def __repr__(self) -> str:
        return (
            f"CoDel(target_ms={self.target_ms}, interval_ms={self._interval_s * 1000:g}, "
            f"mode={self.mode.value}, drops={self._drops})"
        )
