"""gRPC-shaped answers for gRPC requests: the sidecar's own rejections as trailers-only responses.

Theory of operation: a gRPC client shows an HTTP 503 with a JSON body only as an
opaque UNAVAILABLE ("Received http2 header with status: 503") and never reads its
Retry-After. So for a request whose content-type is application/grpc (or +proto,
+json) the request path writes through `GrpcAnswers`, a ResponseSink in front of
the client's: every answer the sidecar makes itself, wherever it is decided
(arrival gate, queue, readiness, deadline, dedup, the relay's 502/504), is one
`respond()` carrying `x-rampmeter-reason` (proxy/core/wire.py `rejection()`), and
that one is rewritten here into `proxy.core.grpc_wire.rejection()`: HTTP 200,
trailers-only, grpc-status for the reason, grpc-message, grpc-retry-pushback-ms
with the same wait as the HTTP answer's x-rampmeter-retry-after-ms (jittered, or scheduled
behind the retries already promised: proxy/core/retry_after.py), or -1
(do not retry) when that wait would end past the call's deadline (its grpc-timeout,
counted from when the request was read: `grpc_wire.pushback_within`).
The upstream's own responses pass untouched (a gRPC server answers 200 with its
own status; a reason header from an upstream only counts on an error status,
which a gRPC server does not send).

The rewrite happens where the answer is written, not where it is decided, so the
deciding code stays one shape (decisions as values) and no path can forget it.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import msgspec
import trio

from proxy.core import grpc_wire, wire
from proxy.http.messages import Headers, Request, ResponseSink, header_value

_CONTENT_TYPE = b"content-type"
_REASON = wire.REASON.encode()
_RETRY_AFTER_MS = wire.RETRY_AFTER_MS.encode()
_GRPC_TIMEOUT = wire.GRPC_TIMEOUT.encode()
_MAX_BODY = 16_384  # the sidecar's own JSON answers are a few hundred bytes


class _Detail(msgspec.Struct):
    message: str = ""


class _Body(msgspec.Struct):
    error: _Detail | None = None


_decode = msgspec.json.Decoder(_Body).decode


def for_request(request: Request, sink: ResponseSink) -> ResponseSink:
    """`sink` itself, or `GrpcAnswers` around it when the request is gRPC.

    One pass over the headers for the content-type and grpc-timeout (first of each), where
    `request.header` twice and `grpc_wire.is_grpc` made three; called for every gRPC call."""
    content_type = timeout = None
    for name, value in request.headers:
        if name == _CONTENT_TYPE:
            if content_type is None:
                content_type = value
        elif name == _GRPC_TIMEOUT and timeout is None:
            timeout = value
    if content_type is None:
        return sink
    base = content_type.split(b";", 1)[0].strip().lower()
    if base not in grpc_wire.CONTENT_TYPES:
        return sink
    deadline = None
    if timeout is not None:
        try:
            deadline = trio.current_time() + wire.parse_grpc_timeout_ms(timeout) / 1000.0
        except wire.HeaderError:
            pass  # the request path answers the malformed header itself (bad_request)
    return GrpcAnswers(sink, base, deadline)


def reshape(
    status: int, headers: Headers, body: bytes, content_type: bytes, remaining_ms: float | None = None
) -> tuple[int, Headers, bytes] | None:
    """The gRPC form of a sidecar answer, or None when it is not one (the upstream's response)."""
    if status < 400:
        return None
    value = header_value(headers, _REASON)
    if value is None:
        return None
    try:
        reason = wire.Reason(value.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    retry = header_value(headers, _RETRY_AFTER_MS)
    retry_after_ms = int(retry) if retry is not None and retry.isdigit() else None
    retry_after_ms = grpc_wire.pushback_within(retry_after_ms, remaining_ms)
    return grpc_wire.rejection(reason, _message(body) or reason.value, retry_after_ms, content_type)


def _message(body: bytes) -> str:
    if not body or len(body) > _MAX_BODY:
        return ""
    try:
        detail = _decode(body).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        return ""
    return "" if detail is None else detail.message


class GrpcAnswers:
    """A ResponseSink that writes the sidecar's rejections gRPC-shaped and passes the rest as it is.

    Only `respond` is its own: `start`, `send`, `end` and `trailers` are the wrapped sink's bound
    methods, so a relayed answer (head, message, trailers: three calls per unary call) costs no
    forwarding coroutine each."""

    __slots__ = ("_content_type", "_deadline", "_sink", "end", "send", "start", "trailers")

    start: Callable[[int, Headers], Coroutine[Any, Any, None]]
    send: Callable[[bytes], Coroutine[Any, Any, None]]
    end: Callable[[], Coroutine[Any, Any, None]]
    trailers: Callable[[Headers], Coroutine[Any, Any, None]]

    def __init__(self, sink: ResponseSink, content_type: bytes, deadline: float | None = None) -> None:
        self._sink = sink
        self._content_type = content_type
        self._deadline = deadline  # trio time the call's grpc-timeout ends; None without one
        self.start, self.send, self.end, self.trailers = sink.start, sink.send, sink.end, sink.trailers

    @property
    def headers_sent(self) -> bool:
        return self._sink.headers_sent

    async def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        remaining = None if self._deadline is None else (self._deadline - trio.current_time()) * 1000.0
        shaped = reshape(status, headers, body, self._content_type, remaining)
        if shaped is None:
            await self._sink.respond(status, headers, body)
        else:
            await self._sink.respond(*shaped)
