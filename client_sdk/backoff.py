"""Exponential backoff with full jitter, and a server-given floor.

Theory of operation: before retry number n (n = 1 for the wait after the first
attempt) the ceiling is `min(cap_s, base_s * multiplier ** (n - 1))` and the wait
is drawn uniformly from `[0, ceiling)` ("full jitter", AWS Architecture Blog,
"Exponential Backoff And Jitter"): of the jitter schemes it spreads a herd of
clients that failed together the most, which is the point when a pod is slow.

When the server said how long to stay away (`Retry-After`,
`x-rampmeter-retry-after-ms`) that is a floor: the wait is `floor + jitter`, so
clients told "1 s" do not all come back in the same millisecond.

Pure: the randomness is an injected `random.Random` (only `.random()` is called,
once per wait), so tests are exact with a seeded or stubbed generator.
tenacity ships `wait_random_exponential`, but it draws from the global `random`
module (no injected RNG) and has no notion of a per-attempt floor, so the
arithmetic is here and tenacity's `wait=` hook calls it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """The backoff schedule. Defaults: base 100 ms, cap 5 s, multiplier 2."""

    base_s: float = 0.1
    cap_s: float = 5.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not (self.base_s >= 0 and self.cap_s >= 0 and self.multiplier >= 1):
            raise ValueError(f"need base_s >= 0, cap_s >= 0, multiplier >= 1: {self!r}")

    def ceiling(self, retry_number: int) -> float:
        """Upper bound of the jitter before retry `retry_number` (1-based)."""
        if retry_number < 1:
            raise ValueError(f"retry_number is 1-based, got {retry_number}")
        # Compare exponents rather than computing base * mult**n for large n:
        # the power overflows a float long before anyone retries that often.
        exponent = retry_number - 1
        if self.multiplier > 1 and exponent > 1000:
            return self.cap_s
        return min(self.cap_s, self.base_s * self.multiplier**exponent)

    def delay(self, retry_number: int, rng: random.Random, floor_s: float = 0.0) -> float:
        """Seconds to wait before retry `retry_number`: floor + U[0, ceiling)."""
        return max(0.0, floor_s) + rng.random() * self.ceiling(retry_number)
