"""gRPC on the wire, the parts the sidecar speaks itself: message framing, the health
protocol's two messages, and gRPC-shaped rejections.

Theory of operation: gRPC rides on HTTP/2 (PROTOCOL-HTTP2.md in grpc/grpc). A
request is a POST with `content-type: application/grpc[+proto|+json]`; each
message is framed as 1 byte compressed-flag, 4 bytes big-endian length, payload;
the status comes in trailers (`grpc-status`, `grpc-message`), or, when there is
no body at all, in the one HEADERS frame that ends the stream ("trailers-only").
A gRPC client shows an HTTP 503 with a JSON body only as an opaque UNAVAILABLE,
so `rejection()` answers what the sidecar refuses as gRPC does: HTTP 200,
trailers-only, the status code for the reason (`STATUS_FOR_REASON`), the reason
as `grpc-message` and `x-rampmeter-reason`, and the jittered wait as
`grpc-retry-pushback-ms`, which gRPC clients' retry policies honour (gRFC A6:
a pushback replaces the client's own backoff; a negative one says "do not retry").

The health protocol (grpc/grpc doc/health-checking.md) has one request message,
`HealthCheckRequest { string service = 1; }`, and one answer,
`HealthCheckResponse { ServingStatus status = 1; }` with SERVING = 1. Both are
written and read here by hand (protobuf's wire format for one field), so the
sidecar needs no protobuf runtime.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum

from proxy.core import wire

CONTENT_TYPES = (b"application/grpc", b"application/grpc+proto", b"application/grpc+json")
HEALTH_CHECK_PATH = b"/grpc.health.v1.Health/Check"
MAX_MESSAGE_BYTES = 4 << 20  # what a health answer may be; grpc's own default receive cap
_MAX_MESSAGE_CHARS = 512  # grpc-message is for people; a bound keeps a header small


class Code(enum.IntEnum):
    """gRPC status codes the sidecar sends or reads (grpc/grpc doc/statuscodes.md)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    INTERNAL = 13
    UNAVAILABLE = 14


# What each sidecar answer means to a gRPC client. UNAVAILABLE is the code gRPC clients
# retry by default and the one that says "not processed, try again"; RESOURCE_EXHAUSTED
# is the per-tenant quota (the client's own share, not the server's health);
# DEADLINE_EXCEEDED is for a budget that cannot be met or has passed.
STATUS_FOR_REASON: dict[wire.Reason, Code] = {
    wire.Reason.QUEUE_FULL: Code.UNAVAILABLE,
    wire.Reason.CLASS_QUEUE_FULL: Code.UNAVAILABLE,
    wire.Reason.OVERLOADED: Code.UNAVAILABLE,
    wire.Reason.GPU_PRESSURE: Code.UNAVAILABLE,
    wire.Reason.NOT_READY: Code.UNAVAILABLE,
    wire.Reason.DRAINING: Code.UNAVAILABLE,
    wire.Reason.UPSTREAM_UNAVAILABLE: Code.UNAVAILABLE,
    wire.Reason.IDEMPOTENCY_STORE_UNAVAILABLE: Code.UNAVAILABLE,
    wire.Reason.TENANT_QUOTA: Code.RESOURCE_EXHAUSTED,
    wire.Reason.DEADLINE_UNMEETABLE: Code.DEADLINE_EXCEEDED,
    wire.Reason.DEADLINE_EXPIRED: Code.DEADLINE_EXCEEDED,
    wire.Reason.UPSTREAM_TIMEOUT: Code.DEADLINE_EXCEEDED,
    wire.Reason.IDEMPOTENCY_KEY_REUSED: Code.FAILED_PRECONDITION,
    wire.Reason.IDEMPOTENCY_KEY_IN_FLIGHT: Code.ABORTED,
    wire.Reason.BAD_REQUEST: Code.INVALID_ARGUMENT,
}

GRPC_STATUS = b"grpc-status"
GRPC_MESSAGE = b"grpc-message"
RETRY_PUSHBACK_MS = b"grpc-retry-pushback-ms"
_REASON = wire.REASON.encode()
_CONTENT_TYPE = b"content-type"


def is_grpc(content_type: bytes | None) -> bool:
    """`application/grpc`, `+proto` or `+json` (parameters allowed), case-insensitive."""
    if content_type is None:
        return False
    base = content_type.split(b";", 1)[0].strip().lower()
    return base in CONTENT_TYPES


def percent_encode(message: str) -> bytes:
    """grpc-message encoding: UTF-8, then %XX for bytes outside 0x20-0x7e and for '%' itself."""
    out = bytearray()
    for b in message[:_MAX_MESSAGE_CHARS].encode("utf-8"):
        if 0x20 <= b <= 0x7E and b != 0x25:
            out.append(b)
        else:
            out += b"%%%02X" % b
    return bytes(out)


def pushback_within(retry_after_ms: int | None, remaining_ms: float | None) -> int | None:
    """The pushback to send a caller with `remaining_ms` left of its deadline (None: no deadline).

    A retry that a client's policy would start after its deadline cannot succeed: gRPC
    waits out the pushback and the call ends DEADLINE_EXCEEDED at its deadline, having
    held its place in the client the whole time (bench.grpc at 2x with a 5-attempt policy:
    200-640 of 1,280 calls ended so). So when the wait is not shorter than what is left, the
    answer is "do not retry" (None here, -1 on the wire) and the call fails fast with
    UNAVAILABLE instead."""
    if retry_after_ms is None or remaining_ms is None or retry_after_ms < remaining_ms:
        return retry_after_ms
    return None


def rejection(
    reason: wire.Reason, message: str, retry_after_ms: int | None, content_type: bytes = CONTENT_TYPES[0]
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and body of a gRPC trailers-only answer for a sidecar rejection.

    `retry_after_ms` is the jittered Retry-After of the HTTP answer; without one
    (a retry as it stands cannot help, wire.should_retry) the pushback is -1, which
    tells a gRPC client's retry policy not to retry (gRFC A6)."""
    code = STATUS_FOR_REASON[reason]
    headers = [
        (_CONTENT_TYPE, content_type),
        (GRPC_STATUS, b"%d" % code),
        (GRPC_MESSAGE, percent_encode(f"rampmeter {reason.value}: {message}")),
        (_REASON, reason.value.encode()),
    ]
    if retry_after_ms is not None:
        headers.append((RETRY_PUSHBACK_MS, b"%d" % max(0, int(retry_after_ms))))
    elif reason not in _CLIENTS_CALL:
        headers.append((RETRY_PUSHBACK_MS, b"-1"))
    return 200, headers, b""


def too_large(detail: str, content_type: bytes | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The gRPC form of 413 (a request past listen.max_body_bytes): HTTP 200, trailers-only.

    RESOURCE_EXHAUSTED is what a gRPC server says for a message past its receive limit
    (grpc's own "Received message larger than max"); the pushback is -1, since the same
    call sent again is as large. `detail`: the 413's own words (the limit in bytes);
    `content_type`: the request's, echoed when it is a gRPC one."""
    base = (content_type or b"").split(b";", 1)[0].strip().lower()
    return 200, [(_CONTENT_TYPE, base if base in CONTENT_TYPES else CONTENT_TYPES[0]), *too_large_status(detail)], b""


def too_large_status(detail: str) -> list[tuple[bytes, bytes]]:
    """The status fields of `too_large`: alone, they are the trailers that end a response already
    started (a bidi call whose replies were flowing when its request stream passed the limit)."""
    return [
        (GRPC_STATUS, b"%d" % Code.RESOURCE_EXHAUSTED),
        (GRPC_MESSAGE, percent_encode(f"rampmeter: {detail} (listen.max_body_bytes)")),
        (RETRY_PUSHBACK_MS, b"-1"),
    ]


# Upstream failures: whether the call may be retried is the client's policy (its
# retryableStatusCodes, the method's idempotency), as for the HTTP answer's x-should-retry.
_CLIENTS_CALL = frozenset({wire.Reason.UPSTREAM_UNAVAILABLE, wire.Reason.UPSTREAM_TIMEOUT})


# --- message framing -------------------------------------------------------------------


def frame(message: bytes) -> bytes:
    """One uncompressed length-prefixed message."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def unframe(data: bytes) -> bytes:
    """The first message of a response body; ValueError if it is cut, compressed or too large."""
    if len(data) < 5:
        raise ValueError(f"gRPC message frame cut short ({len(data)} bytes)")
    if data[0] != 0:
        raise ValueError("compressed gRPC message (the sidecar asks for none)")
    size = int.from_bytes(data[1:5], "big")
    if size > MAX_MESSAGE_BYTES or len(data) < 5 + size:
        raise ValueError(f"gRPC message of {size} bytes cut short or too large")
    return data[5 : 5 + size]


# --- grpc.health.v1 --------------------------------------------------------------------

SERVING = 1
SERVING_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(data) and shift < 64:
        b = data[at]
        value |= (b & 0x7F) << shift
        at += 1
        if not b & 0x80:
            return value, at
        shift += 7
    raise ValueError("truncated varint")


def health_request(service: str) -> bytes:
    """HealthCheckRequest{service}, serialized (field 1, length-delimited; empty: the whole server)."""
    name = service.encode("utf-8")
    return b"\x0a" + _varint(len(name)) + name if name else b""


def health_status(message: bytes) -> int:
    """The `status` of a serialized HealthCheckResponse (0 UNKNOWN when absent); unknown fields skipped."""
    at, status = 0, 0
    while at < len(message):
        key, at = _read_varint(message, at)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, at = _read_varint(message, at)
            if number == 1:
                status = value
        elif kind == 2:
            size, at = _read_varint(message, at)
            at += size
        elif kind == 5:
            at += 4
        elif kind == 1:
            at += 8
        else:
            raise ValueError(f"unsupported protobuf wire type {kind}")
    if at > len(message):
        raise ValueError("truncated field")
    return status


def status_of(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The grpc-status in a header or trailer block, or None."""
    for k, v in headers:
        if k == GRPC_STATUS:
            try:
                return int(v)
            except ValueError:
                return None
    return None
