"""The wire contract between rampmeter, its clients and client_sdk.

Theory of operation: every header name, rejection reason and the status code that
goes with it lives here and only here, so the sidecar cannot drift from what it
documents. `client_sdk/wire.py` holds the SDK's copy (the SDK must not import the
proxy); `tests/contract/` checks that the two agree name for name.

Pure: no I/O, no clock. Parsing helpers return values or raise `HeaderError`
naming the offending header, which the server turns into a 400.
"""

from __future__ import annotations

import enum
import math

import msgspec

# Request headers (all optional).
PRIORITY = "x-priority"
REQUEST_TIMEOUT_MS = "x-request-timeout-ms"
GRPC_TIMEOUT = "grpc-timeout"
IDEMPOTENCY_KEY = "idempotency-key"
COST_HINT = "x-cost-hint"
TENANT = "x-tenant"
# Request and response: the caller's id for the request (kept when well formed, proxy/core/request_ids.py),
# else one the sidecar made; sent upstream, returned on every answer and inside every rejection body.
REQUEST_ID = "x-request-id"

# Response headers the sidecar adds.
QUEUE_MS = "x-rampmeter-queue-ms"
TIMEOUT_HINT_MS = "x-rampmeter-timeout-hint-ms"
IDEMPOTENT_REPLAYED = "idempotent-replayed"
RETRY_AFTER = "retry-after"
RETRY_AFTER_MS = "x-rampmeter-retry-after-ms"
REASON = "x-rampmeter-reason"
# What the timeout hint is for: an opaque "route#cost bucket", the key the sidecar's
# latency windows use, so a client applies a hint only to requests of the same kind.
TIMEOUT_HINT_KEY = "x-rampmeter-timeout-hint-key"
# For clients that know no rampmeter header: the OpenAI (Stainless) SDKs read both.
# `retry-after-ms` carries the same jittered wait as x-rampmeter-retry-after-ms;
# `x-should-retry` says whether retrying can succeed (see should_retry()).
RETRY_AFTER_MS_PLAIN = "retry-after-ms"
SHOULD_RETRY = "x-should-retry"
# The class that served the request (a caller whose x-priority was unknown learns which it got).
SERVED_CLASS = "x-rampmeter-class"

REQUEST_HEADERS = (PRIORITY, REQUEST_TIMEOUT_MS, GRPC_TIMEOUT, IDEMPOTENCY_KEY, COST_HINT, TENANT, REQUEST_ID)
RESPONSE_HEADERS = (
    QUEUE_MS,
    TIMEOUT_HINT_MS,
    IDEMPOTENT_REPLAYED,
    RETRY_AFTER,
    RETRY_AFTER_MS,
    REASON,
    TIMEOUT_HINT_KEY,
    RETRY_AFTER_MS_PLAIN,
    SHOULD_RETRY,
    REQUEST_ID,
    SERVED_CLASS,
)

ERROR_TYPE = "rampmeter_rejected"
MAX_IDEMPOTENCY_KEY_LEN = 255


class Reason(enum.StrEnum):
    """Why the sidecar answered instead of the model server. Each reason has one producer, the
    module (and function) that builds its `Reject`, named in its comment; one rule per reason."""

    # core/shedding.py Shedder.check: the queue_length rule (shedding.max_queued_requests over
    # the classes at or above this one, scaled to the class's share).
    QUEUE_FULL = "queue_full"
    # core/admission.py AdmissionController.arrive: the class's own queue is over its
    # classes.<name>.max_queue_length (a per-class cap, a different rule from queue_full's).
    CLASS_QUEUE_FULL = "class_queue_full"
    # core/shedding.py deadline_unmeetable: the deadline rule at arrival (arrival_verdict), and
    # the controller's call when a ticket must queue but its expiry has come (no time to wait).
    DEADLINE_UNMEETABLE = "deadline_unmeetable"
    # core/decisions.py deadline_expired(stage): before admission (core/admission.py arrive),
    # while queued (runtime/scheduler.py, from the controller's Expired), or upstream
    # (runtime/relay.py when the pool ended the exchange, runtime/request_path.py when the scope did).
    DEADLINE_EXPIRED = "deadline_expired"
    OVERLOADED = "overloaded"  # core/shedding.py Shedder.check (CoDel, saturation)
    GPU_PRESSURE = "gpu_pressure"  # core/shedding.py (gpu_memory_high_water)
    NOT_READY = "not_ready"  # runtime/request_path.py (readiness did not come in time)
    TENANT_QUOTA = "tenant_quota"  # core/shedding.py (core/token_bucket.py quotas)
    DRAINING = "draining"  # in the contract and understood by the SDK; not sent by this version
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"  # runtime/relay.py, runtime/dedup (a failed leader)
    UPSTREAM_TIMEOUT = "upstream_timeout"  # runtime/relay.py (upstreams[i].timeout_s)
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"  # runtime/dedup
    IDEMPOTENCY_KEY_IN_FLIGHT = "idempotency_key_in_flight"  # runtime/dedup
    IDEMPOTENCY_STORE_UNAVAILABLE = "idempotency_store_unavailable"  # runtime/dedup
    BAD_REQUEST = "bad_request"  # runtime/request_path.py (a malformed header, an uncostable body)


STATUS_FOR_REASON: dict[Reason, int] = {
    Reason.QUEUE_FULL: 503,
    Reason.CLASS_QUEUE_FULL: 503,
    Reason.DEADLINE_UNMEETABLE: 503,
    Reason.DEADLINE_EXPIRED: 504,
    Reason.OVERLOADED: 503,
    Reason.GPU_PRESSURE: 503,
    Reason.NOT_READY: 503,
    Reason.TENANT_QUOTA: 429,
    Reason.DRAINING: 503,
    Reason.UPSTREAM_UNAVAILABLE: 502,
    Reason.UPSTREAM_TIMEOUT: 504,
    Reason.IDEMPOTENCY_KEY_REUSED: 422,
    Reason.IDEMPOTENCY_KEY_IN_FLIGHT: 409,
    Reason.IDEMPOTENCY_STORE_UNAVAILABLE: 503,
    Reason.BAD_REQUEST: 400,
}

# Reasons after which a client may retry the same request later (it was not run).
RETRYABLE_REASONS = frozenset(
    {
        Reason.QUEUE_FULL,
        Reason.CLASS_QUEUE_FULL,
        Reason.DEADLINE_UNMEETABLE,
        Reason.OVERLOADED,
        Reason.GPU_PRESSURE,
        Reason.NOT_READY,
        Reason.TENANT_QUOTA,
        Reason.DRAINING,
        Reason.IDEMPOTENCY_KEY_IN_FLIGHT,
        Reason.IDEMPOTENCY_STORE_UNAVAILABLE,
    }
)


# No Retry-After on these says nothing about whether a retry helps: the model server refused
# or timed out, and whether sending again is safe depends on the request's idempotency, which
# the client knows. They get no x-should-retry; the client's own rule for 502/504 decides.
_UPSTREAM_REASONS = frozenset({Reason.UPSTREAM_UNAVAILABLE, Reason.UPSTREAM_TIMEOUT})


def should_retry(reason: Reason, retry_after_ms: int | None) -> bool | None:
    """`x-should-retry` for a rejection: True, False, or None (send no header).

    Retry-After is the sidecar's "come back then and it can work" (docs/rejections.md), so
    a rejection with one is worth retrying. Without one, a retry as it stands cannot help:
    deadline_unmeetable with no Retry-After (the service time alone exceeds the budget),
    deadline_expired (the time is gone), bad_request and idempotency_key_reused (fix the
    request). The upstream reasons are the client's call.
    """
    if retry_after_ms is not None:
        return True
    return None if reason in _UPSTREAM_REASONS else False


def hint_key(route: str, cost_bucket: int) -> bytes:
    """`x-rampmeter-timeout-hint-key` for a (route, cost bucket) latency key."""
    return f"{route}#{cost_bucket}".encode("ascii", "backslashreplace")


class HeaderError(ValueError):
    """A request header is malformed; the message names the header."""

    def __init__(self, header: str, problem: str) -> None:
        super().__init__(f"{header}: {problem}")
        self.header = header


class _ErrorDetail(msgspec.Struct):
    type: str
    code: str
    message: str
    retry_after_ms: int | None = None


class _ErrorBody(msgspec.Struct):
    error: _ErrorDetail


_encode = msgspec.json.Encoder().encode
_RETRY_AFTER = RETRY_AFTER.encode()
_RETRY_AFTER_MS = RETRY_AFTER_MS.encode()
_RETRY_AFTER_MS_PLAIN = RETRY_AFTER_MS_PLAIN.encode()
_SHOULD_RETRY = SHOULD_RETRY.encode()


def rejection(
    reason: Reason, message: str, retry_after_ms: int | None = None
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and OpenAI-style JSON body for a sidecar-made answer."""
    body = _encode(_ErrorBody(_ErrorDetail(ERROR_TYPE, reason.value, message, retry_after_ms)))
    headers = [
        (b"content-type", b"application/json"),
        (REASON.encode(), reason.value.encode()),
    ]
    if retry_after_ms is not None:
        retry_after_s = max(1, math.ceil(retry_after_ms / 1000))
        exact = str(int(retry_after_ms)).encode()
        headers.append((_RETRY_AFTER, str(retry_after_s).encode()))
        headers.append((_RETRY_AFTER_MS, exact))
        headers.append((_RETRY_AFTER_MS_PLAIN, exact))
    verdict = should_retry(reason, retry_after_ms)
    if verdict is not None:
        headers.append((_SHOULD_RETRY, b"true" if verdict else b"false"))
    return STATUS_FOR_REASON[reason], headers, body


REJECTION_PREFIX = b'{"error":{"type":"' + ERROR_TYPE.encode() + b'"'


def with_request_id(body: bytes, request_id: bytes) -> bytes:
    """A `rejection()` body with `"request_id"` added to its error object.

    `request_id` is of request_ids' alphabet, which needs no JSON escaping; a body that
    is not a rejection's is returned as it is.
    """
    if not body.startswith(REJECTION_PREFIX) or not body.endswith(b"}}"):
        return body
    return body[:-2] + b',"request_id":"' + request_id + b'"}}'


def parse_timeout_ms(value: bytes) -> int:
    """`x-request-timeout-ms`: a non-negative integer count of milliseconds."""
    text = value.decode("latin-1").strip()
    if not text.isdigit() or len(text) > 10:
        raise HeaderError(REQUEST_TIMEOUT_MS, f"expected a non-negative integer, got {text!r}")
    return int(text)


_GRPC_UNITS_MS = {"H": 3_600_000.0, "M": 60_000.0, "S": 1000.0, "m": 1.0, "u": 1e-3, "n": 1e-6}


def parse_grpc_timeout_ms(value: bytes) -> int:
    """`grpc-timeout`: up to 8 digits then a unit (H M S m u n), per the gRPC spec."""
    text = value.decode("latin-1").strip()
    digits, unit = text[:-1], text[-1:]
    if not (1 <= len(digits) <= 8 and digits.isdigit() and unit in _GRPC_UNITS_MS):
        raise HeaderError(GRPC_TIMEOUT, f"expected 1-8 digits and a unit of H M S m u n, got {text!r}")
    return math.ceil(int(digits) * _GRPC_UNITS_MS[unit])


def parse_cost_hint(value: bytes) -> int:
    text = value.decode("latin-1").strip()
    if not text.isdigit() or len(text) > 12:
        raise HeaderError(COST_HINT, f"expected a non-negative integer, got {text!r}")
    return int(text)


def validate_idempotency_key(value: bytes) -> bytes:
    """1-255 printable ASCII characters (0x21-0x7e and space inside)."""
    if not 1 <= len(value) <= MAX_IDEMPOTENCY_KEY_LEN:
        raise HeaderError(IDEMPOTENCY_KEY, f"must be 1-{MAX_IDEMPOTENCY_KEY_LEN} characters long")
    if any(b < 0x20 or b > 0x7E for b in value) or value != value.strip():
        raise HeaderError(IDEMPOTENCY_KEY, "must be printable ASCII without surrounding spaces")
    return value
