"""The SDK's one error tree, and where httpx's errors map into it.

Theory of operation: app code catches `RampmeterClientError` (or one branch):

    RampmeterClientError
    +-- Rejected(reason, status, retry_after)   the sidecar answered for the server
    |   +-- Overloaded                          ... a reason that invites a retry
    |   +-- DeadlineUnmeetable                  ... the deadline is shorter than the request needs
    +-- DeadlineExceeded                        the call's total deadline passed
    +-- RetryBudgetExhausted                    a retry was safe but the host's budget was empty
    +-- ThrottledLocally(probability, last_reason)  refused here, never sent (adaptive throttle)
    +-- TransportFailed                         any other httpx transport error (.__cause__)
        +-- ConnectFailed                       could not connect
        +-- TimedOut                            one attempt timed out, not retried

The transports (used under httpx.Client / the OpenAI SDK) raise only two errors
the SDK itself originates, and those also subclass the httpx error an httpx user
already catches: `DeadlineExceeded` is an `httpx.TimeoutException` and
`RetryBudgetExhausted` an `httpx.TransportError` (the OpenAI SDK turns them into
APITimeoutError / APIConnectionError). A local refusal is not a transport error:
the transports answer it with a synthetic 503 in the sidecar's OpenAI-style shape
(`ThrottledLocally.response()`, code `throttled_locally`), so the OpenAI SDK raises
an `InternalServerError` whose message says it was refused here and why, instead of
"Connection error.". Everything else a transport sees (responses, httpx errors) it
hands back unchanged, so existing clients surface a sidecar's OpenAI-style error
body as they would any other. `client_sdk.Client` then maps what is left with
`error_for_response` and `error_for_exception` (the synthetic 503 back into
`ThrottledLocally`).
"""

from __future__ import annotations

import json
from typing import Any

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


class DeadlineUnmeetable(Rejected):
    """503 deadline_unmeetable without Retry-After: the deadline is below the request's service time.

    Retrying cannot help (the remaining budget only shrinks), so the SDK made one attempt.
    Raise the deadline (`deadline_s`, `x-request-timeout-ms`) or ask for less work.
    """

    def __init__(self, status: int, message: str, budget_ms: str | None, **kwargs: Any) -> None:
        sent = f" (this attempt sent x-request-timeout-ms: {budget_ms})" if budget_ms else ""
        advice = (
            f"the deadline is shorter than this request needs{sent}; a retry cannot help. "
            "Raise the deadline (deadline_s / x-request-timeout-ms) or ask for fewer tokens"
        )
        super().__init__(
            wire.Reason.DEADLINE_UNMEETABLE.value, status, None, f"{message}: {advice}" if message else advice, **kwargs
        )
        self.budget_ms = budget_ms


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


THROTTLED_LOCALLY = "throttled_locally"  # `error.code` of the synthetic 503
_THROTTLED_EXTENSION = "rampmeter_throttled"  # response.extensions key holding the ThrottledLocally


class ThrottledLocally(RampmeterClientError, httpx.TransportError):
    """Refused before sending: the server has been rejecting most recent requests.

    `last_reason` is the last capacity failure the host answered: a sidecar reason
    (`overloaded`, `queue_full`, ...), a status code, or an error name.
    """

    def __init__(
        self,
        host: str,
        probability: float,
        *,
        last_reason: str | None = None,
        request: httpx.Request | None = None,
    ) -> None:
        last = f"; the server's last refusal: {last_reason}" if last_reason else ""
        httpx.TransportError.__init__(
            self,
            f"{THROTTLED_LOCALLY}: {host}: refused locally by client_sdk's adaptive throttle "
            f"(p={probability:.2f}), not sent: the server rejected most recent requests{last}",
            request=request,
        )
        self.host = host
        self.probability = probability
        self.last_reason = last_reason

    def response(self) -> httpx.Response:
        """The synthetic 503 the transports answer with: the sidecar's OpenAI-style body.

        `x-should-retry: false` keeps the OpenAI SDK from retrying a refusal at once (it
        retries 503s by default); the SDK's own extension marks it for `client_sdk.Client`.
        """
        body = {
            "error": {
                "type": wire.ERROR_TYPE,
                "code": THROTTLED_LOCALLY,
                "message": str(self),
                "retry_after_ms": None,
                "last_reason": self.last_reason,
                "probability": round(self.probability, 4),
            }
        }
        return httpx.Response(
            503,
            headers={wire.SHOULD_RETRY: "false"},
            json=body,
            request=self.request if self._request is not None else None,
            extensions={_THROTTLED_EXTENSION: self},
        )


def throttled_in(response: httpx.Response) -> ThrottledLocally | None:
    """The local refusal a synthetic 503 stands for, or None for a real answer."""
    found = response.extensions.get(_THROTTLED_EXTENSION)
    return found if isinstance(found, ThrottledLocally) else None


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
    reason = signals.reason_of(response.status_code, response.headers)
    return stopped or reason is not None or throttled_in(response) is not None


def error_for_response(response: httpx.Response, wall_now: float) -> RampmeterClientError | None:
    """The tree's error for a final response; None for an answer the caller should get.

    A sidecar-made answer (it carries `x-rampmeter-reason`) is an error; so is a
    retryable failure the SDK stopped retrying for lack of budget or time. Any
    other response, 4xx and 5xx from the model server included, is returned as
    httpx would (call `raise_for_status()` as usual).
    """
    throttled = throttled_in(response)
    if throttled is not None:
        return throttled
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
    if signals.classify_response(response.status_code, response.headers) is signals.Signal.REJECTED_UNMEETABLE:
        return DeadlineUnmeetable(
            response.status_code,
            _sidecar_message(response),
            response.request.headers.get(wire.REQUEST_TIMEOUT_MS),
            response=response,
            attempts=attempts,
        )
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
