"""The SDK's one error tree, and where httpx's errors map into it.

Theory of operation: app code catches `RampmeterClientError` (or one branch):

    RampmeterClientError
    +-- Rejected(reason, status, retry_after)   the sidecar answered for the server
    |   +-- Overloaded                          ... a reason that invites a retry
    +-- DeadlineExceeded                        the call's total deadline passed
    +-- RetryBudgetExhausted                    a retry was safe but the host's budget was empty
    +-- ThrottledLocally(probability)           refused here, never sent (adaptive throttle)
    +-- TransportFailed                         any other httpx transport error (.__cause__)
        +-- ConnectFailed                       could not connect
        +-- TimedOut                            one attempt timed out, not retried

The transports (used under httpx.Client / the OpenAI SDK) raise only the three
errors the SDK itself originates, and those also subclass the httpx error an
httpx user already catches: `DeadlineExceeded` is an `httpx.TimeoutException`,
`RetryBudgetExhausted` and `ThrottledLocally` are `httpx.TransportError`s (the
OpenAI SDK turns them into APITimeoutError / APIConnectionError). Everything
else a transport sees (responses, httpx errors) it hands back unchanged, so
existing clients surface a sidecar's OpenAI-style error body as they would any
other. `client_sdk.Client` then maps what is left with `error_for_response` and
`error_for_exception`.
"""

from __future__ import annotations

import json

import httpx

from client_sdk import signals, wire
from client_sdk.config import EXTENSION
from client_sdk.events import CallSummary, Stop


class RampmeterClientError(Exception):
    """Base of every error client_sdk raises."""


class Rejected(RampmeterClientError):
    """The sidecar answered instead of the model server (`x-rampmeter-reason`)."""

    def __init__(
        self,
        reason: str,
        status: int,
        retry_after: float | None,
        message: str = "",
        response: httpx.Response | None = None,
        attempts: int = 1,
    ) -> None:
        self.reason = reason
        self.status = status
        self.retry_after = retry_after  # seconds the server asked us to wait, if it said
        self.response = response
        self.attempts = attempts
        wait = f", retry after {retry_after:.3g} s" if retry_after is not None else ""
        detail = f": {message}" if message else ""
        super().__init__(f"{status} {reason}{wait} after {attempts} attempt(s){detail}")


class Overloaded(Rejected):
    """Rejected for capacity (queue full, not ready, quota, ...): it was not run; try later."""


class DeadlineExceeded(RampmeterClientError, httpx.TimeoutException):
    """The call's total deadline passed (locally, or the sidecar said deadline_expired)."""

    def __init__(self, message: str, *, request: httpx.Request | None = None, attempts: int = 0) -> None:
        httpx.TimeoutException.__init__(self, message, request=request)
        self.attempts = attempts


class RetryBudgetExhausted(RampmeterClientError, httpx.TransportError):
    """A retry was safe and wanted, but the host's retry budget had no token.

    `last` is the final attempt's outcome: the response or the exception.
    """

    def __init__(
        self,
        message: str,
        *,
        request: httpx.Request | None = None,
        last: httpx.Response | BaseException | None = None,
        attempts: int = 0,
    ) -> None:
        httpx.TransportError.__init__(self, message, request=request)
        self.last = last
        self.attempts = attempts


class ThrottledLocally(RampmeterClientError, httpx.TransportError):
    """Refused before sending: the server has been rejecting most recent requests."""

    def __init__(self, host: str, probability: float, *, request: httpx.Request | None = None) -> None:
        httpx.TransportError.__init__(
            self,
            f"{host}: refused locally (adaptive throttle, p={probability:.2f}): "
            "the server rejected most recent requests",
            request=request,
        )
        self.host = host
        self.probability = probability


class TransportFailed(RampmeterClientError):
    """An httpx transport error the SDK did not retry (or ran out of attempts on)."""


class ConnectFailed(TransportFailed):
    """Could not connect (refused, unreachable, connect timeout)."""


class TimedOut(TransportFailed):
    """One attempt timed out (read/write/pool) and was not retried."""


def error_for_exception(exc: Exception) -> RampmeterClientError | None:
    """The tree's error for an httpx exception; None when it is not an httpx one."""
    if isinstance(exc, RampmeterClientError):
        return exc
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return ConnectFailed(str(exc) or type(exc).__name__)
    if isinstance(exc, httpx.TimeoutException):
        return TimedOut(str(exc) or type(exc).__name__)
    if isinstance(exc, httpx.TransportError):
        return TransportFailed(str(exc) or type(exc).__name__)
    return None


def _sidecar_message(response: httpx.Response) -> str:
    """`error.message` from the OpenAI-style body, if the body was read and has one."""
    try:
        detail = json.loads(response.content).get("error", {})
        return str(detail.get("message", "")) if isinstance(detail, dict) else ""
    except (httpx.ResponseNotRead, ValueError, AttributeError):
        return ""


def needs_error(response: httpx.Response) -> bool:
    """Whether `error_for_response` would raise (so the caller reads the body first)."""
    summary = response.extensions.get(EXTENSION)
    stopped = isinstance(summary, CallSummary) and summary.stop is not None
    return stopped or signals.reason_of(response.status_code, response.headers) is not None


def error_for_response(response: httpx.Response, wall_now: float) -> RampmeterClientError | None:
    """The tree's error for a final response; None for an answer the caller should get.

    A sidecar-made answer (it carries `x-rampmeter-reason`) is an error; so is a
    retryable failure the SDK stopped retrying for lack of budget or time. Any
    other response, 4xx and 5xx from the model server included, is returned as
    httpx would (call `raise_for_status()` as usual).
    """
    summary = response.extensions.get(EXTENSION)
    stop = summary.stop if isinstance(summary, CallSummary) else None
    attempts = summary.attempts if isinstance(summary, CallSummary) else 1
    reason = signals.reason_of(response.status_code, response.headers)
    where = f"{response.request.method} {response.request.url}"
    if stop is Stop.BUDGET:
        return RetryBudgetExhausted(
            f"{where}: retry budget exhausted, last answer {response.status_code}",
            request=response.request,
            last=response,
            attempts=attempts,
        )
    if stop is Stop.DEADLINE or reason == wire.Reason.DEADLINE_EXPIRED:
        return DeadlineExceeded(
            f"{where}: deadline exceeded, last answer {response.status_code}",
            request=response.request,
            attempts=attempts,
        )
    if reason is None:
        return None
    retry_after = signals.retry_after_s(response.headers, wall_now)
    kind = Overloaded if reason in wire.RETRYABLE_REASON_NAMES else Rejected
    return kind(
        reason,
        response.status_code,
        retry_after,
        _sidecar_message(response),
        response=response,
        attempts=attempts,
    )
