"""What the SDK reports: call summaries, hook events and the hooks interface.

Theory of operation: the engine describes each step of a call as a small frozen
value (`AttemptInfo` before each attempt, `RetryInfo` when a retry is scheduled,
`CallSummary` when the call ends) and hands it to a `Hooks` object. The default
`Hooks` does nothing, so there is no hard dependency on any metrics or logging
library; subclass it to count (Prometheus, StatsD) or use `LoggingHooks`. A
hook must be cheap and must not raise: it runs on the request path (an
exception from a hook propagates to the caller, loudly, rather than being
swallowed).

`CallSummary` is also attached to the final response as
`response.extensions["rampmeter"]`, which is how a benchmark counts attempts
per logical request without hooks.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass


class Stop(enum.StrEnum):
    """Why the SDK stopped retrying an outcome it would have retried."""

    ATTEMPTS = "attempts"  # max_attempts reached
    DEADLINE = "deadline"  # the next attempt could not start before the deadline
    BUDGET = "budget"  # the host's retry budget had no token
    WAIT_TOO_LONG = "wait_too_long"  # the server asked for a wait above max_wait_s


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    call_id: int
    host: str
    method: str
    attempt: int  # 1-based
    timeout_s: float | None  # this attempt's timeout (None: the request's own)


@dataclass(frozen=True, slots=True)
class RetryInfo:
    call_id: int
    host: str
    attempt: int  # the attempt that failed
    signal: str  # client_sdk.signals.Signal value
    wait_s: float


@dataclass(frozen=True, slots=True)
class CallSummary:
    call_id: int
    host: str
    method: str
    attempts: int
    outcome: str  # status code ("200") or exception class name
    stop: Stop | None  # None: the outcome was final (success or not retryable)
    elapsed_s: float


class Hooks:
    """Override any method to observe the SDK. All default to doing nothing."""

    def on_attempt(self, info: AttemptInfo) -> None:
        """Before each attempt is sent."""

    def on_retry(self, info: RetryInfo) -> None:
        """A retry was granted; the SDK now waits `info.wait_s`."""

    def on_call(self, summary: CallSummary) -> None:
        """A call ended (response or error)."""

    def on_throttled(self, host: str, probability: float) -> None:
        """A call was refused locally by the adaptive throttle."""


class LoggingHooks(Hooks):
    """Logs retries, throttling and give-ups (not every attempt) to a stdlib logger."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("client_sdk")

    def on_retry(self, info: RetryInfo) -> None:
        self.logger.info("retry %s #%d after %s in %.3fs", info.host, info.attempt, info.signal, info.wait_s)

    def on_call(self, summary: CallSummary) -> None:
        if summary.stop is not None:
            self.logger.warning(
                "gave up on %s %s after %d attempt(s): %s (%s)",
                summary.method,
                summary.host,
                summary.attempts,
                summary.outcome,
                summary.stop,
            )

    def on_throttled(self, host: str, probability: float) -> None:
        self.logger.warning("refused a call to %s locally (p=%.2f)", host, probability)


NULL_HOOKS = Hooks()
