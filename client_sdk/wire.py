"""The SDK's copy of the rampmeter wire contract.

Theory of operation: the SDK must not import the sidecar (`proxy`), so it keeps
its own copy of every header name, rejection reason, the status that goes with
each reason and which reasons invite a retry. `proxy/core/wire.py` is the
source of truth; `tests/contract/test_wire_contract.py` fails the build when the
two drift apart, name for name. Pure data: no parsing lives here (see
`client_sdk.signals`).
"""

from __future__ import annotations

import enum

# Request headers (all optional).
PRIORITY = "x-priority"
REQUEST_TIMEOUT_MS = "x-request-timeout-ms"
GRPC_TIMEOUT = "grpc-timeout"
IDEMPOTENCY_KEY = "idempotency-key"
COST_HINT = "x-cost-hint"
TENANT = "x-tenant"
REQUEST_ID = "x-request-id"  # sent by the caller or made by the sidecar; returned on every answer

# Response headers the sidecar adds.
QUEUE_MS = "x-rampmeter-queue-ms"
TIMEOUT_HINT_MS = "x-rampmeter-timeout-hint-ms"
IDEMPOTENT_REPLAYED = "idempotent-replayed"
RETRY_AFTER = "retry-after"
RETRY_AFTER_MS = "x-rampmeter-retry-after-ms"
REASON = "x-rampmeter-reason"
TIMEOUT_HINT_KEY = "x-rampmeter-timeout-hint-key"  # opaque: what kind of request the hint is for
RETRY_AFTER_MS_PLAIN = "retry-after-ms"  # for plain (OpenAI SDK) clients; same value as RETRY_AFTER_MS
SHOULD_RETRY = "x-should-retry"  # for plain clients: "true" / "false"
SERVED_CLASS = "x-rampmeter-class"  # the class that served the request

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

# `error.type` in the OpenAI-style JSON body of a sidecar-made answer.
ERROR_TYPE = "rampmeter_rejected"
MAX_IDEMPOTENCY_KEY_LEN = 255


class Reason(enum.StrEnum):
    """Why the sidecar answered instead of the model server."""

    QUEUE_FULL = "queue_full"
    CLASS_QUEUE_FULL = "class_queue_full"
    DEADLINE_UNMEETABLE = "deadline_unmeetable"
    DEADLINE_EXPIRED = "deadline_expired"
    OVERLOADED = "overloaded"
    GPU_PRESSURE = "gpu_pressure"
    NOT_READY = "not_ready"
    TENANT_QUOTA = "tenant_quota"
    DRAINING = "draining"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    IDEMPOTENCY_KEY_IN_FLIGHT = "idempotency_key_in_flight"
    IDEMPOTENCY_STORE_UNAVAILABLE = "idempotency_store_unavailable"
    BAD_REQUEST = "bad_request"


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

# Reasons after which the same request may be sent again later: the sidecar
# guarantees the model server never saw it. Every other reason is final, or (502,
# 504) falls under the "only when idempotent or keyed" rule in client_sdk.rules.
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

# Plain strings too, so a header value can be tested without building an enum
# (an unknown reason from a newer sidecar must not raise).
RETRYABLE_REASON_NAMES = frozenset(r.value for r in RETRYABLE_REASONS)
