"""Client-side adaptive throttling (Google SRE book, "Handling Overload").

Theory of operation: over a sliding window (60 s) the client counts `requests`
(every attempt it made or wanted to make, including the ones it refused
locally) and `accepts` (attempts the server had capacity for). A new call is
refused locally with probability

    p = max(0, (requests - K * accepts) / (requests + 1))

With K = 2 nothing is refused until the server rejects more than half the
traffic; when it rejects nearly everything, p approaches 1 and the client stops
sending most requests at all, yet a trickle still goes through, so acceptance
(and p) recovers within one window of the server recovering.

The window is a ring of `buckets` counters, each `window_s / buckets` wide;
bucket i counts the attempts in [i * width, (i + 1) * width). Running totals are
kept, and when time reaches a new bucket the slots that fell out of the window
are subtracted and zeroed (at most `buckets` of them), so every operation is
O(1) amortised and no timer is needed. Invariant: totals == sum of the slots.

Pure: `now` is an argument, the coin flip takes an injected `random.Random`,
and it is drawn only when p > 0, so a healthy client consumes no randomness
(tests stay exact). Hand-written: no maintained Python library implements this
formula; it is a dozen lines.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Admission:
    """The throttle's verdict on one new call."""

    admitted: bool
    probability: float  # the refusal probability it was judged with


@dataclass(frozen=True, slots=True)
class ThrottleStatistics:
    requests: int
    accepts: int
    probability: float
    refused: int


class AdaptiveThrottle:
    __slots__ = (
        "_accepts",
        "_newest",
        "_refused",
        "_requests",
        "_totals",
        "_width",
        "k",
        "window_s",
    )

    def __init__(self, k: float = 2.0, window_s: float = 60.0, buckets: int = 60) -> None:
        if not (k >= 1 and window_s > 0 and buckets >= 1):
            raise ValueError("need k >= 1, window_s > 0 and buckets >= 1")
        self.k = k
        self.window_s = window_s
        self._width = window_s / buckets
        self._requests = [0] * buckets
        self._accepts = [0] * buckets
        self._totals = [0, 0]  # requests, accepts: the sums of the two rings
        self._newest: int | None = None  # index of the newest bucket seen
        self._refused = 0

    def _advance(self, now: float) -> int:
        """Slide the window to `now`; returns the slot counting `now`."""
        index = math.floor(now / self._width)
        size = len(self._requests)
        if self._newest is None:
            self._newest = index
        elif index > self._newest:
            for i in range(max(self._newest + 1, index - size + 1), index + 1):
                slot = i % size
                self._totals[0] -= self._requests[slot]
                self._totals[1] -= self._accepts[slot]
                self._requests[slot] = self._accepts[slot] = 0
            self._newest = index
        # A clock that steps back (monotonic ones do not) counts in the newest bucket.
        return self._newest % size

    def _counts(self, now: float) -> tuple[int, int]:
        self._advance(now)
        return self._totals[0], self._totals[1]

    def record(self, now: float, accepted: bool) -> None:
        """One attempt went out; `accepted` when the server had capacity for it."""
        slot = self._advance(now)
        self._requests[slot] += 1
        self._totals[0] += 1
        if accepted:
            self._accepts[slot] += 1
            self._totals[1] += 1

    def probability(self, now: float) -> float:
        requests, accepts = self._counts(now)
        return max(0.0, (requests - self.k * accepts) / (requests + 1))

    def admit(self, now: float, rng: random.Random) -> Admission:
        """Flip the coin for one new call.

        A refusal counts as a request (not an accept), per the SRE formula.
        """
        p = self.probability(now)
        if p > 0.0 and rng.random() < p:
            self._refused += 1
            self.record(now, accepted=False)
            return Admission(False, p)
        return Admission(True, p)

    def statistics(self, now: float) -> ThrottleStatistics:
        requests, accepts = self._counts(now)
        return ThrottleStatistics(requests, accepts, self.probability(now), self._refused)

    def __repr__(self) -> str:
        return f"<AdaptiveThrottle k={self.k:g} window={self.window_s:g}s refused={self._refused}>"
