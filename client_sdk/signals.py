"""What one attempt's outcome tells the client.

Theory of operation: every attempt ends in a response or an httpx exception.
`classify_response` / `classify_exception` reduce it to a `Signal`, the one
input the retry decision table (`client_sdk.rules`) and the adaptive throttle
need. The header readers turn the sidecar's hints into numbers: the rejection
reason, the server's requested wait (`x-rampmeter-retry-after-ms` first, as it
is exact; else `Retry-After` in seconds or as an HTTP-date) and the
recommended per-attempt timeout.

Pure: no I/O, no clock reads. The HTTP-date form needs the wall clock, so it is
an argument (`wall_now`, seconds since the epoch). Malformed header values are
ignored (treated as absent): a bad hint must never fail a call.
"""

from __future__ import annotations

import email.utils
import enum
import math
from collections.abc import Mapping

import httpx

from client_sdk import wire


class Signal(enum.Enum):
    """One attempt's outcome, as far as retrying and throttling care."""

    ANSWERED = "answered"  # the server answered (any status not listed below)
    CONNECT_FAILED = "connect_failed"  # no byte of the request left this host
    READ_TIMEOUT = "read_timeout"  # sent, no answer in time: it may be running
    BROKEN_AFTER_SEND = "broken_after_send"  # read/write error, broken HTTP: may have run
    REJECTED_RETRYABLE = "rejected_retryable"  # sidecar: not run, come back later (it is busy)
    REJECTED_BY_CALLER = "rejected_by_caller"  # sidecar: not run, come back later; this caller's doing
    REJECTED_UNMEETABLE = "rejected_unmeetable"  # sidecar: the service time alone exceeds the deadline
    REJECTED_FINAL = "rejected_final"  # sidecar: retrying cannot help (bad request, ...)
    DEADLINE_EXPIRED = "deadline_expired"  # sidecar: the caller's budget ran out
    GATEWAY_FAILED = "gateway_failed"  # 502/504: the upstream may have run it
    OVERLOAD_UNQUALIFIED = "overload_unqualified"  # 503/429 from a server without a reason
    LOCAL_FAILURE = "local_failure"  # never reached the server usefully (pool timeout, ...)


class Verdict(enum.Enum):
    """What an outcome tells the adaptive throttle about the server's capacity."""

    ACCEPT = "accept"  # it had capacity (any answer, a 4xx included: fewer requests would not change it)
    FAILURE = "failure"  # a capacity failure: rejected for load, timed out, unreachable
    NEUTRAL = "neutral"  # nothing about capacity: not counted at all


THROTTLE: dict[Signal, Verdict] = {
    Signal.ANSWERED: Verdict.ACCEPT,
    Signal.REJECTED_FINAL: Verdict.ACCEPT,  # 400, 422: the server had time to say the request is wrong
    # The caller caused these (its deadline, its tenant's quota, its own key in flight):
    # counting them as overload let one too-short deadline lock the client out (issue 14).
    Signal.REJECTED_BY_CALLER: Verdict.NEUTRAL,
    Signal.REJECTED_UNMEETABLE: Verdict.NEUTRAL,
    Signal.LOCAL_FAILURE: Verdict.NEUTRAL,  # pool timeout and the like: our side, not the server's
    Signal.CONNECT_FAILED: Verdict.FAILURE,
    Signal.READ_TIMEOUT: Verdict.FAILURE,
    Signal.BROKEN_AFTER_SEND: Verdict.FAILURE,
    Signal.REJECTED_RETRYABLE: Verdict.FAILURE,
    Signal.DEADLINE_EXPIRED: Verdict.FAILURE,
    Signal.GATEWAY_FAILED: Verdict.FAILURE,
    Signal.OVERLOAD_UNQUALIFIED: Verdict.FAILURE,  # a bare 429 may be a quota, but a server that says it wants less
}

# Sidecar reasons that invite a retry but say nothing about the server's load: the
# request itself (its deadline with the queue ahead) or its caller (quota, key) caused them.
_CALLER_REASONS = frozenset(
    {
        wire.Reason.DEADLINE_UNMEETABLE.value,
        wire.Reason.TENANT_QUOTA.value,
        wire.Reason.IDEMPOTENCY_KEY_IN_FLIGHT.value,
    }
)

_GATEWAY_STATUSES = frozenset({502, 504})
_OVERLOAD_STATUSES = frozenset({503, 429})


def reason_of(status: int, headers: Mapping[str, str]) -> str | None:
    """The sidecar's `x-rampmeter-reason`, only on an error status."""
    if status < 400:
        return None
    return headers.get(wire.REASON)


def classify_response(status: int, headers: Mapping[str, str]) -> Signal:
    reason = reason_of(status, headers)
    if reason is not None:
        if reason == wire.Reason.DEADLINE_UNMEETABLE and not _has_retry_after(headers):
            # "Raise your timeout" (docs/rejections.md): the budget only shrinks on a retry,
            # so no retry can succeed. Final, with an error that says so.
            return Signal.REJECTED_UNMEETABLE
        if reason in _CALLER_REASONS:
            return Signal.REJECTED_BY_CALLER
        if reason in wire.RETRYABLE_REASON_NAMES:
            return Signal.REJECTED_RETRYABLE
        if reason == wire.Reason.DEADLINE_EXPIRED:
            return Signal.DEADLINE_EXPIRED
        if status in _GATEWAY_STATUSES:
            return Signal.GATEWAY_FAILED
        return Signal.REJECTED_FINAL
    if status >= 400 and headers.get(wire.SHOULD_RETRY) == "false":
        return Signal.ANSWERED  # a server (OpenAI's API, say) that says a retry cannot help
    if status in _GATEWAY_STATUSES:
        return Signal.GATEWAY_FAILED
    if status in _OVERLOAD_STATUSES:
        return Signal.OVERLOAD_UNQUALIFIED
    return Signal.ANSWERED


def _has_retry_after(headers: Mapping[str, str]) -> bool:
    return any(name in headers for name in (wire.RETRY_AFTER_MS, wire.RETRY_AFTER_MS_PLAIN, wire.RETRY_AFTER))


def classify_exception(exc: BaseException) -> Signal:
    # Order matters: ConnectError is a NetworkError, every timeout a TransportError.
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return Signal.CONNECT_FAILED
    if isinstance(exc, httpx.ReadTimeout):
        return Signal.READ_TIMEOUT
    if isinstance(exc, httpx.PoolTimeout):
        # No connection was free locally. Retrying would queue behind ourselves.
        return Signal.LOCAL_FAILURE
    if isinstance(exc, (httpx.WriteTimeout, httpx.NetworkError, httpx.RemoteProtocolError)):
        return Signal.BROKEN_AFTER_SEND
    if isinstance(exc, httpx.TimeoutException):
        # The async transport's whole-attempt bound (DeadlineExceeded): no answer in time.
        return Signal.READ_TIMEOUT
    return Signal.LOCAL_FAILURE


def _non_negative_float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def retry_after_s(headers: Mapping[str, str], wall_now: float) -> float | None:
    """The wait the server asked for, in seconds, or None when it named none.

    `x-rampmeter-retry-after-ms`, then `retry-after-ms` (what OpenAI's API and
    the sidecar send for plain clients), win over `Retry-After` (same hint, finer
    unit). `Retry-After` is delta-seconds or an HTTP-date (RFC 9110 section
    10.2.3); a date in the past means "now" (0.0).
    """
    for name in (wire.RETRY_AFTER_MS, wire.RETRY_AFTER_MS_PLAIN):
        ms = _non_negative_float(headers.get(name))
        if ms is not None:
            return ms / 1000.0
    text = headers.get(wire.RETRY_AFTER)
    if text is None:
        return None
    seconds = _non_negative_float(text)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(text.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; obsolete forms may lack a zone
        return None
    return max(0.0, when.timestamp() - wall_now)


def timeout_hint_s(headers: Mapping[str, str]) -> float | None:
    """`x-rampmeter-timeout-hint-ms` in seconds; None when absent, malformed or 0."""
    ms = _non_negative_float(headers.get(wire.TIMEOUT_HINT_MS))
    return ms / 1000.0 if ms else None


def timeout_hint_key(headers: Mapping[str, str]) -> str:
    """`x-rampmeter-timeout-hint-key` (opaque, at most 256 characters); "" when absent."""
    return headers.get(wire.TIMEOUT_HINT_KEY, "")[:256]


def failure_name(status: int | None, headers: Mapping[str, str] | None, exc: BaseException | None) -> str:
    """A short name for a capacity failure, for the throttle's message: the sidecar's reason if any."""
    if status is not None and headers is not None:
        return reason_of(status, headers) or str(status)
    return type(exc).__name__ if exc is not None else "unknown"


def caller_timeout_s(headers: Mapping[str, str]) -> float | None:
    """A caller-set `x-request-timeout-ms`, in seconds (the SDK treats it as the deadline)."""
    text = headers.get(wire.REQUEST_TIMEOUT_MS)
    if text is None or not text.strip().isdigit():
        return None
    return int(text.strip()) / 1000.0
