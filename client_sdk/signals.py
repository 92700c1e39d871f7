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
    REJECTED_RETRYABLE = "rejected_retryable"  # sidecar: not run, come back later
    REJECTED_FINAL = "rejected_final"  # sidecar: retrying cannot help (bad request, ...)
    DEADLINE_EXPIRED = "deadline_expired"  # sidecar: the caller's budget ran out
    GATEWAY_FAILED = "gateway_failed"  # 502/504: the upstream may have run it
    OVERLOAD_UNQUALIFIED = "overload_unqualified"  # 503/429 from a server without a reason
    LOCAL_FAILURE = "local_failure"  # never reached the server usefully (pool timeout, ...)


# Outcomes that show the server had capacity for the request: the adaptive
# throttle's "accepts". Everything else is a capacity failure (or says nothing).
ACCEPTED = frozenset({Signal.ANSWERED, Signal.REJECTED_FINAL})

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
        if reason in wire.RETRYABLE_REASON_NAMES:
            return Signal.REJECTED_RETRYABLE
        if reason == wire.Reason.DEADLINE_EXPIRED:
            return Signal.DEADLINE_EXPIRED
        if status in _GATEWAY_STATUSES:
            return Signal.GATEWAY_FAILED
        return Signal.REJECTED_FINAL
    if status in _GATEWAY_STATUSES:
        return Signal.GATEWAY_FAILED
    if status in _OVERLOAD_STATUSES:
        return Signal.OVERLOAD_UNQUALIFIED
    return Signal.ANSWERED


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

    `x-rampmeter-retry-after-ms` wins over `Retry-After` (same hint, finer unit).
    `Retry-After` is delta-seconds or an HTTP-date (RFC 9110 section 10.2.3);
    a date in the past means "now" (0.0).
    """
    ms = _non_negative_float(headers.get(wire.RETRY_AFTER_MS))
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


def caller_timeout_s(headers: Mapping[str, str]) -> float | None:
    """A caller-set `x-request-timeout-ms`, in seconds (the SDK treats it as the deadline)."""
    text = headers.get(wire.REQUEST_TIMEOUT_MS)
    if text is None or not text.strip().isdigit():
        return None
    return int(text.strip()) / 1000.0
