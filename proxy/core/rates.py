"""Decayed event rates (completions, queue arrivals and departures per second).

Theory of operation: an exponentially decayed event count with time constant
`tau_s`: each event adds 1, the count decays by exp(-dt / tau_s), and
rate = count / tau_s, so a steady r events/s reads r after a few tau_s and an
old burst fades smoothly. O(1) per event and per read; time is an argument.
`BucketedRate` is the same for amounts in buckets (the work arriving per log2 size
bucket, which the SJF stretch of the wait estimate reads), with one shared decay.
"""

from __future__ import annotations

import math


class DecayedRate:
    __slots__ = ("_at", "_count", "tau_s")

    def __init__(self, tau_s: float) -> None:
        self.tau_s = tau_s
        self._count = 0.0
        self._at = 0.0

    def _decayed(self, now: float) -> float:
        dt = now - self._at
        return self._count if dt <= 0 else self._count * math.exp(-dt / self.tau_s)

    def add(self, now: float, events: float = 1.0) -> None:
        # _decayed(now) + events, inline: a rate is added to twice per request
        dt = now - self._at
        self._count = (self._count if dt <= 0 else self._count * math.exp(-dt / self.tau_s)) + events
        if dt > 0:
            self._at = now

    def rate(self, now: float) -> float:
        """Events per second around `now`."""
        return self._decayed(now) / self.tau_s

    def __repr__(self) -> str:
        return f"<DecayedRate tau={self.tau_s}s count={self._count:.2f}>"


# Past this many time constants since the epoch the stored sums are rescaled (exp(60) ~ 1e26: far from a
# float's range, and the rescale is O(buckets) once per 60 tau).
_RESCALE_AFTER = 60.0


class BucketedRate:
    """Decayed amounts per second in `n` buckets, one time constant; O(1) to add, O(b) to read the
    rate of the buckets below b (a prefix sum over a list: C speed).

    All buckets decay alike, so instead of decaying each one every add, amounts are stored scaled by
    exp((t - epoch) / tau) and the read scales the sum back by exp(-(now - epoch) / tau): the same
    figure DecayedRate gives per bucket."""

    __slots__ = ("_epoch", "_sums", "tau_s")

    def __init__(self, tau_s: float, n: int, epoch: float) -> None:
        self.tau_s = tau_s
        self._sums = [0.0] * n
        self._epoch = epoch  # the clock's reading at creation (a time of the caller's clock, like `now`)

    def add(self, now: float, bucket: int, amount: float) -> None:
        k = (now - self._epoch) / self.tau_s
        if k > _RESCALE_AFTER:
            scale = math.exp(-k)
            self._sums = [s * scale for s in self._sums]
            self._epoch, k = now, 0.0
        self._sums[bucket] += amount * math.exp(k)

    def rate_below(self, now: float, bucket: int) -> float:
        """Amount per second around `now` in the buckets below `bucket`."""
        return sum(self._sums[:bucket]) * math.exp(-(now - self._epoch) / self.tau_s) / self.tau_s

    def __repr__(self) -> str:
        return f"<BucketedRate tau={self.tau_s}s buckets={len(self._sums)}>"
