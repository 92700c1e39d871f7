"""Retry budget: a token bucket per host that caps retries at a ratio of calls.

Theory of operation (after gRPC retry throttling, gRFC A6, and the Finagle /
Linkerd retry budgets): every retry costs one token. Tokens come from two
sources: each new call deposits `ratio` tokens (0.1: one retry per ten calls),
and time adds `floor_per_s` tokens per second (10/s), so a client with little
traffic can still retry a blip. The bucket holds at most `max_tokens` (10), which
bounds the burst of retries that a long quiet spell could otherwise bank.

Invariant (tested): over any interval [t0, t1], retries granted <=
tokens(t0) + ratio * calls + floor_per_s * (t1 - t0) <= max_tokens + ratio *
calls + floor_per_s * (t1 - t0). So under a sustained failure at R calls/s the
load on the server is at most R * (1 + ratio) + floor_per_s attempts/s, instead of
R * max_attempts: the retry storm cannot multiply load.

Pure: `now` (monotonic seconds) is an argument. Not thread-safe on its own; the
owner (`client_sdk.hosts`) holds a lock. Hand-written because the maintained
Python rate limiters (token buckets of requests/s) have no ratio-of-requests
deposit, which is the whole point of a retry budget.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BudgetStatistics:
    tokens: float
    deposits: int
    withdrawals: int
    refusals: int


class RetryBudget:
    __slots__ = (
        "_deposits",
        "_grants",
        "_last",
        "_refusals",
        "_tokens",
        "floor_per_s",
        "max_tokens",
        "ratio",
    )

    def __init__(self, ratio: float = 0.1, floor_per_s: float = 10.0, max_tokens: float = 10.0) -> None:
        if not (ratio >= 0 and floor_per_s >= 0 and max_tokens >= 1):
            raise ValueError("need ratio >= 0, floor_per_s >= 0 and max_tokens >= 1")
        self.ratio = ratio
        self.floor_per_s = floor_per_s
        self.max_tokens = max_tokens
        self._tokens = float(max_tokens)  # start full: the first failures may retry
        self._last: float | None = None
        self._deposits = 0
        self._grants = 0
        self._refusals = 0

    def _refill(self, now: float) -> None:
        if self._last is not None and now > self._last:
            self._tokens = min(self.max_tokens, self._tokens + self.floor_per_s * (now - self._last))
        # A clock that steps back (it should not: monotonic) refills nothing.
        if self._last is None or now > self._last:
            self._last = now

    def deposit(self, now: float) -> None:
        """A new call started: it earns `ratio` of a retry."""
        self._refill(now)
        self._tokens = min(self.max_tokens, self._tokens + self.ratio)
        self._deposits += 1

    def try_withdraw(self, now: float) -> bool:
        """Spend one token for a retry; False (and nothing spent) if there is none."""
        self._refill(now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            self._grants += 1
            return True
        self._refusals += 1
        return False

    def refund(self) -> None:
        """Give back a token `try_withdraw` granted for a retry that did not happen."""
        self._tokens = min(self.max_tokens, self._tokens + 1.0)
        self._grants -= 1

    def tokens(self, now: float) -> float:
        self._refill(now)
        return self._tokens

    def statistics(self, now: float) -> BudgetStatistics:
        return BudgetStatistics(self.tokens(now), self._deposits, self._grants, self._refusals)

    def __repr__(self) -> str:
        return (
            f"<RetryBudget tokens={self._tokens:.2f}/{self.max_tokens:g} ratio={self.ratio:g} "
            f"floor={self.floor_per_s:g}/s granted={self._grants} refused={self._refusals}>"
        )
