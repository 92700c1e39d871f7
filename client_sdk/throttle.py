"""Client-side adaptive throttling (Google SRE book, "Handling Overload"), with Envoy's guards.

Theory of operation: over a sliding window (60 s) the client counts `requests`
(attempts it sent) and `accepts` (attempts the server had capacity for). A new call
is refused locally, before anything is sent, with probability

    p = min(max_probability, max(0, (requests - K * accepts) / (requests + 1)))

and p = 0 while the window holds fewer than `min_requests` requests. With K = 2
nothing is refused until the server rejects more than half the traffic.

Three departures from the book's formula, each because the book's version failed
healthy traffic (issue 14: one refused call locked a client out for the whole
window):
- a refusal is not a request. The book counts it as one, so once p is high every
  refusal keeps it high, and a client that sends a few calls a minute never sends
  enough to see the server has recovered. Counting only what was sent, p follows the
  server's answers alone;
- nothing is refused until `min_requests` (20) were sent in the window, as Envoy's
  admission_control waits for `rps_threshold`: one or two failures are not a trend;
- p never exceeds `max_probability` (0.9; Envoy's max_rejection_probability is 0.8),
  so at least one call in ten still tests the server.
Which outcomes count as an accept, a failure, or nothing at all (a rejection the
client caused: an unmeetable deadline, its tenant's quota) is the engine's call
(`client_sdk.signals.THROTTLE`); this module only counts.

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
        "max_probability",
        "min_requests",
        "window_s",
    )

    def __init__(
        self,
        k: float = 2.0,
        window_s: float = 60.0,
        buckets: int = 60,
        *,
        min_requests: int = 20,
        max_probability: float = 0.9,
    ) -> None:
        if not (k >= 1 and window_s > 0 and buckets >= 1 and min_requests >= 0 and 0 <= max_probability <= 1):
            raise ValueError("need k >= 1, window_s > 0, buckets >= 1, min_requests >= 0, 0 <= max_probability <= 1")
        self.k = k
        self.window_s = window_s
        self.min_requests = min_requests
        self.max_probability = max_probability
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
        if requests < self.min_requests:
            return 0.0
        return min(self.max_probability, max(0.0, (requests - self.k * accepts) / (requests + 1)))

    def admit(self, now: float, rng: random.Random) -> Admission:
        """Flip the coin for one new call. A refusal is counted apart, never as a request."""
        p = self.probability(now)
        if p > 0.0 and rng.random() < p:
            self._refused += 1
            return Admission(False, p)
        return Admission(True, p)

    def statistics(self, now: float) -> ThrottleStatistics:
        requests, accepts = self._counts(now)
        return ThrottleStatistics(requests, accepts, self.probability(now), self._refused)

    def __repr__(self) -> str:
        return (
            f"<AdaptiveThrottle k={self.k:g} window={self.window_s:g}s min={self.min_requests} "
            f"max_p={self.max_probability:g} refused={self._refused}>"
        )
