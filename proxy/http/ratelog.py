"""One log line per event, at a rate an attacker cannot raise.

Theory of operation: events whose rate a client controls (a protocol error, a flood,
a refused connection, an accept failure) go through `RateLimitedLog.event(kind, msg,
*args)`. Each `kind` has its own token bucket (`burst` lines at once, then `per_s`
lines a second); what the bucket refuses is counted, and the next line of that kind
that is let through says how many were suppressed since the last one. So an
operator always sees the first events of a burst and a running count, and a
flood of 10,000 bad requests a second writes at most `per_s` lines a second.
`exc_info=True` adds the traceback to the lines let through: for real bugs that a
client can trigger at will.

Time is read with `time.monotonic()` at the call (logging is I/O already); tests pass
`clock`. Why hand-written: the stdlib has no rate limiting, and logging filters that
do it (e.g. in structlog add-ons) are per-message, not per kind, and count nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    updated: float
    suppressed: int = 0


class RateLimitedLog:
    """Per-kind token buckets in front of a logger; `event()` returns whether it logged."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        per_s: float = 1.0,
        burst: int = 5,
        level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.per_s, self.burst, self.level, self.clock = logger, per_s, burst, level, clock
        self._buckets: dict[str, _Bucket] = {}

    def event(self, kind: str, msg: str, *args: object, level: int | None = None, exc_info: bool = False) -> bool:
        now = self.clock()
        bucket = self._buckets.get(kind)
        if bucket is None:
            # Kinds are a small fixed set named by the code, never by the client.
            bucket = self._buckets[kind] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.per_s)
        bucket.updated = now
        if bucket.tokens < 1.0:
            bucket.suppressed += 1
            return False
        bucket.tokens -= 1.0
        if bucket.suppressed:
            msg += " (%d more %s events suppressed)"
            args = (*args, bucket.suppressed, kind)
            bucket.suppressed = 0
        self.logger.log(self.level if level is None else level, msg, *args, exc_info=exc_info)
        return True

    def statistics(self) -> dict[str, int]:
        """Suppressed lines per kind since each kind last logged."""
        return {kind: b.suppressed for kind, b in self._buckets.items()}
