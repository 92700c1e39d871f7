"""Every store call goes through one guard: bounded, timed, counted, and a breaker.

Theory of operation: `call(op, fn, *args)` runs one store operation under a
deadline of store_timeout_ms (the caller's own deadline still applies), records
its latency per operation, and turns a timeout into `StoreUnavailable`. A
failure opens a breaker for store_retry_ms: until then calls fail at once
instead of each request waiting out the timeout against a dead Redis, and the
engine applies on_store_error. The outage is logged once when it starts and once
when it ends, never per request. A call whose own caller was cancelled meanwhile
is not a store failure (the cancellation goes on, the breaker stays shut).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from proxy.metrics import Metrics
from proxy.policy.dedup import Dedup as DedupPolicy
from proxy.runtime.dedup.store import StoreUnavailable

log = logging.getLogger("rampmeter.dedup")

OPS = ("claim", "complete", "release", "refresh", "get", "watch")


class StoreGuard:
    def __init__(self, policy: DedupPolicy, metrics: Metrics, clock: Callable[[], float], bounded: bool = True) -> None:
        self.policy = policy
        self._bounded = bounded  # False for an in-process store: a cancel scope per call would be pure cost
        self._clock = clock
        self._errors = {op: metrics.dedup_store_errors.labels(op) for op in OPS}
        self._seconds = {op: metrics.dedup_store_duration_seconds.labels(op) for op in OPS}
        self._down_until = float("-inf")
        self._outage_errors = 0
        self._skipped = 0

    @property
    def down(self) -> bool:
        return self._clock() < self._down_until

    async def call(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        if not self._bounded:
            return await fn(*args)
        start = self._clock()
        if start < self._down_until:
            self._skipped += 1
            raise StoreUnavailable("skipped: the store failed moments ago")
        try:
            with trio.fail_at(start + self.policy.store_timeout_ms / 1000):
                result = await fn(*args)
        except (StoreUnavailable, trio.TooSlowError) as exc:
            # A caller cancelled mid-call (its client left) can see coredis turn that into a
            # connection error ("Unable to establish a connection" when it interrupted a
            # handshake). That is the caller's end, not the store's: re-raise the cancellation
            # rather than open the breaker, which would send the next store_retry_ms of
            # requests to on_store_error (fail_open: a duplicate execution on another replica).
            await trio.lowlevel.checkpoint_if_cancelled()
            self._failed(op, exc)
            raise StoreUnavailable(str(exc) or "timed out") from None
        self._seconds[op].observe(self._clock() - start)
        if self._outage_errors:
            log.warning("dedup store reachable again after %d failed operations", self._outage_errors)
            self._outage_errors = 0
        return result

    def _failed(self, op: str, exc: BaseException) -> None:
        self._errors[op].inc()
        self._down_until = self._clock() + self.policy.store_retry_ms / 1000
        if not self._outage_errors:  # once per outage, not per request
            log.warning(
                "dedup store unavailable (%s: %s); on_store_error=%s",
                op,
                exc or "timed out",
                self.policy.on_store_error,
            )
        self._outage_errors += 1

    def statistics(self) -> dict[str, Any]:
        return {"down": self.down, "outage_errors": self._outage_errors, "skipped": self._skipped}

    def __repr__(self) -> str:
        return f"<StoreGuard down={self.down} outage_errors={self._outage_errors}>"
