"""CoDel-style queue-delay shedding: a standing queue sheds arrivals, lowest class first.

Theory of operation (after Nichols & Jacobson's CoDel, Facebook's "controlled delay"
RPC queue in "Fail at Scale"/wangle, and Triton's queue policy): a queue that is
sometimes empty is doing its job (absorbing bursts); a queue whose *minimum* wait over
a whole interval stays above `target_ms` is a standing queue that only adds latency.

Samples: `observe(wait_ms, now)` takes a queue wait: the wait of each dequeued request,
and the age of the oldest queued request on each arrival (0 when the queue is empty;
an empty queue ends any standing queue). Time is cut into back-to-back intervals of
`interval_ms`, the first starting at the first sample. When an interval ends, its
minimum sample is compared to the target:
  min > target_ms  -> event ABOVE,   min <= target_ms -> event BELOW.
An interval that got no sample is judged from the next sample, back-projected: a
request that has waited w ms at `now` was already queued, w - (now - t) ms old, at every
earlier t, so the interval's minimum is taken as max(0, w - (now - interval start)).
(Only the last `max_level + 1` such empty intervals are replayed after a long idle
gap: their projected minima only grow with time, so the earlier ones cannot change
the outcome.)

States, as a `(mode, event) -> mode` table:
  NORMAL   --ABOVE--> DROPPING (level 1)
  DROPPING --ABOVE--> DROPPING (level + 1, at most max_level)
  DROPPING --BELOW--> NORMAL   (level 0)
  NORMAL   --BELOW--> NORMAL
`level` is how many classes, counted from the least important, are shed: with n
classes ranked 0 (most important) .. n-1, `sheds(rank)` is `rank >= n - level`. So
one bad interval sheds the lowest class; each further bad interval adds the next class
up; the first good interval ends dropping for all. The decision is made at arrival
only; queued requests are left to the deadline expiry rule. (`proxy.core.shedding`
keeps one CoDel per class, each with n_classes = 1: level 1 = that class's queue stands;
it sheds that class by `take_drop`, CoDel's control law, and the classes below it whole.)
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
    level: int
    interval_min_ms: float | None  # minimum so far in the running interval
    intervals_above: int  # total intervals that ended above target
    intervals_below: int


class CoDel:
    def __init__(self, target_ms: float, interval_ms: float, n_classes: int) -> None:
        if not (target_ms >= 0 and interval_ms > 0 and n_classes >= 1):
            raise ValueError("need target_ms >= 0, interval_ms > 0, n_classes >= 1")
        self.target_ms, self.n_classes = target_ms, n_classes
        self.max_level = n_classes
        self._interval_s = interval_ms / 1000.0
        self.mode = Mode.NORMAL
        self.level = 0
        self._interval_end: float | None = None
        self._min: float | None = None
        self._above = self._below = 0
        self._drops = 0  # arrivals taken by take_drop() since DROPPING began
        self._drop_next: float | None = None

    def observe(self, wait_ms: float, now: float) -> None:
        if self._interval_end is None:
            self._interval_end = now + self._interval_s
        elif now >= self._interval_end:
            self._roll(wait_ms, now)
        self._min = wait_ms if self._min is None or wait_ms < self._min else self._min

    def _roll(self, wait_ms: float, now: float) -> None:
        """Close every interval that ended at or before `now`."""
        assert self._interval_end is not None
        pending = math.floor((now - self._interval_end) / self._interval_s) + 1
        if self._min is not None:  # the interval that holds real samples
            self._close(self._min)
            pending -= 1
        skip = max(0, pending - (self.max_level + 1))
        self._interval_end += skip * self._interval_s
        for _ in range(pending - skip):
            start = self._interval_end - self._interval_s
            self._close(max(0.0, wait_ms - (now - start) * 1000.0))

    def _close(self, interval_min_ms: float) -> None:
        above = interval_min_ms > self.target_ms
        self.mode = transition(self.mode, Event.ABOVE if above else Event.BELOW)
        if above:
            self._above += 1
            self.level = min(self.max_level, self.level + 1)
        else:
            self._below += 1
            self.level = 0
            self._drops, self._drop_next = 0, None
        self._min = None
        self._interval_end += self._interval_s  # type: ignore[operator]

    def take_drop(self, now: float) -> bool:
        """CoDel's control law, for the queue that stands itself: while DROPPING, shed one
        arrival at once, then the next after interval / sqrt(drops so far). Shedding every
        arrival instead empties the queue, the next interval reads BELOW and the queue refills
        (bench/overload at 2.5x: goodput fell below unbounded queueing's)."""
        if self.mode is not Mode.DROPPING:
            return False
        if self._drop_next is not None and now < self._drop_next:
            return False
        self._drops += 1
        self._drop_next = now + self._interval_s / math.sqrt(self._drops)
        return True

    def sheds(self, rank: int) -> bool:
        """Whether an arrival of class `rank` (0 = most important) is shed now."""
        return rank >= self.n_classes - self.level

    def statistics(self) -> CoDelStatistics:
        return CoDelStatistics(self.mode, self.level, self._min, self._above, self._below)

    def __repr__(self) -> str:
        return (
            f"CoDel(target_ms={self.target_ms}, interval_ms={self._interval_s * 1000:g}, "
            f"mode={self.mode.value}, level={self.level}/{self.max_level})"
        )
