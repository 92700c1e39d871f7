"""Forward one admitted request upstream and relay the response as it arrives.

Theory of operation: `forward()` runs one upstream exchange inside the caller's
cancel scope (which carries the request's one deadline) plus the upstream's own
cap (`upstreams[i].timeout_s`). With `scoped=False` the caller holds no scope: the
earlier of deadline and cap is then the pool's to enforce (HTTP/1.1 upstreams:
`pool.bounds_deadlines`, no scope per request) or, for the rest, one scope here; a
request deadline that passes mid-exchange is answered 504 deadline_expired here. It returns what admission must learn: the
outcome (SUCCESS, DROPPED when the upstream itself signalled overload with
503/429, ERROR, REFUSED), the service time (first request byte to the last
response byte) and, when the upstream reported it, the tokens it used.

Failures before any response byte are answered here per the wire contract
(502 upstream_unavailable, 504 upstream_timeout). After response bytes went out
nothing can be answered any more: the result says `cut`, the request path raises
`ResponseCut` once its bookkeeping is done, and the server aborts the client's
stream, which the client sees as a truncated response. That is logged here, one
line with the upstream, the client and why, rate-limited: an upstream that dies
takes every stream it carries with it, and a traceback each said nothing more.

Release point: `on_complete(result)` is called once, as soon as the upstream's part
is over (the last response byte read from it, or the sidecar's own 502/504
decided), before the last write to the client; the request path releases the
admission slot there. So a client that reads slowly, or not at all, holds no GPU
capacity for the final write: on HTTP/2 the rest is held within the connection's
send buffer (proxy/http/h2stream.py); on HTTP/1.1 the final write still waits for
the kernel to take it, but no longer holds the slot. A streamed response still
holds it while it streams: the upstream is still working for it. The service
time is measured to the upstream's last byte too, not to the client's.

Deadline propagation: `x-request-timeout-ms` is the caller's *remaining* budget
(wire contract), so a client's `x-request-timeout-ms` / `grpc-timeout` go
upstream re-stamped with what is left of the request's deadline when it is
forwarded (time spent queueing here is gone), as gRPC and Envoy propagate
deadlines; a deadline-aware model server then knows when nobody waits any more.

Trailers: the client's request trailers (HTTP/2) follow the body to an h2c upstream; an
HTTP/2 upstream's trailer fields (gRPC's grpc-status, grpc-message,
trailing metadata) end the client's response through `sink.trailers()`, unchanged;
a trailers-only answer (one HEADERS with END_STREAM) is relayed as that one HEADERS.

Usage: a whole JSON body's `usage` is parsed (msgspec, only that field); a
stream's tokens are counted as its SSE `data:` events.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterable, Callable

import msgspec
import trio

from proxy.core import wire
from proxy.core.decisions import ExpiredAt, Observed, Outcome, Reject, deadline_expired
from proxy.core.values import Value
from proxy.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout
from proxy.http import forward as fwd
from proxy.http.messages import Headers, Request, ResponseSink, header_value
from proxy.http.pool import UpstreamResponse, Upstreams
from proxy.http.ratelog import RateLimitedLog

log = logging.getLogger("rampmeter.upstream")
_events = RateLimitedLog(log)

_CONTENT_LENGTH = b"content-length"
_USAGE_PARSE_MAX = 65_536
_USAGE_KEY = b"usage"
_SSE_EVENT = b"data:"
_SSE_DONE = b"data: [DONE]"
_TIMEOUT = wire.REQUEST_TIMEOUT_MS.encode()
_GRPC_TIMEOUT = wire.GRPC_TIMEOUT.encode()
_GRPC_MAX_MS = 99_999_999  # grpc-timeout allows 8 digits


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _WithUsage(msgspec.Struct):
    usage: _Usage | None = None


_decode_usage = msgspec.json.Decoder(_WithUsage).decode


class Forwarded(Value):
    """How one exchange ended (one per request: a plain value class, proxy/core/values.py)."""

    _FIELDS = ("outcome", "status", "service_ms", "observed", "reason", "cut")
    __slots__ = (*_FIELDS, "ended_at")  # ended_at: a reading of the clock, not part of the value (eq, repr)

    def __init__(
        self,
        outcome: Outcome,
        status: int,  # what the client was answered
        service_ms: float | None = None,
        observed: Observed | None = None,
        reason: wire.Reason | None = None,  # set when the sidecar answered for the upstream
        cut: bool = False,  # the response had started when the exchange failed: the client's stream must be aborted
        ended_at: float | None = None,  # trio time the upstream's part ended, when read for service_ms
    ) -> None:
        self.outcome = outcome
        self.status = status
        self.service_ms = service_ms
        self.observed = observed
        self.reason = reason
        self.cut = cut
        self.ended_at = ended_at


# _Completion.finished: (upstream status, usage) -> the result, once the upstream's part is over.
_Finished = Callable[[int, Observed | None], Forwarded]


class _Completion:
    """`on_complete`, called at most once, with the result it was called with kept; also what `_relay`
    calls when the upstream's answer is over (`finished`: the outcome and service time from its status,
    timed from `started`). One object a request for both (a closure and a holder were two)."""

    __slots__ = ("_callback", "_started", "result")

    def __init__(self, callback: Callable[[Forwarded], None] | None, started: float) -> None:
        self._callback = callback
        self._started = started
        self.result: Forwarded | None = None

    def __call__(self, result: Forwarded) -> Forwarded:
        if self.result is None:
            self.result = result
            if self._callback is not None:
                self._callback(result)
        return result

    def finished(self, status: int, observed: Observed | None) -> Forwarded:
        ended_at = trio.current_time()
        service_ms = (ended_at - self._started) * 1000.0
        if status in (429, 503):
            result = Forwarded(Outcome.DROPPED, status, service_ms, ended_at=ended_at)
        else:
            outcome = Outcome.ERROR if status >= 500 else Outcome.SUCCESS
            result = Forwarded(outcome, status, service_ms, observed, ended_at=ended_at)
        return self(result)


async def forward(
    pool: Upstreams,
    upstream: int,
    timeout_s: float,
    request: Request,
    body: bytes | AsyncIterable[bytes],
    sink: ResponseSink,
    extra_headers: Headers,
    deadline: float | None = None,
    on_complete: Callable[[Forwarded], None] | None = None,
    *,
    scoped: bool = True,
    restamp: bool = True,
    started: float | None = None,
) -> Forwarded:
    """One upstream exchange, relayed to `sink`; `on_complete` when the upstream's part is over (module
    doc). `restamp=False`: the caller knows the request carries no budget header (proxy/runtime/fields.py),
    so there is nothing to rewrite. `started`: the trio time the caller read in this step (no checkpoint
    since), the start of the service time; else read here."""
    headers = fwd.request_headers(request, pool.authority(upstream))
    if started is None:
        started = trio.current_time()
    if deadline is not None and restamp:
        _restamp_budget(headers, deadline - started)
    cap = started + timeout_s
    complete = _Completion(on_complete, started)
    finished = complete.finished
    try:
        if not scoped:  # ended at `bound` by the pool where it can (no scope per request), else by one scope
            bound = cap if deadline is None else min(deadline, cap)
            bounds = getattr(pool, "bounds_deadlines", None)
            if bounds is not None and bounds(upstream):
                # An HTTP/2 client's writes are not bounded by the server at the deadline (HTTP/1.1's
                # are: Request.deadline): _relay checks the clock before a single write, and holds a
                # scope only around a streamed answer.
                write_by = deadline if deadline is not None and request.http_version == "2" else None
                return await _exchange(
                    pool,
                    upstream,
                    request,
                    headers,
                    body,
                    sink,
                    extra_headers,
                    finished,
                    deadline=bound,
                    write_by=write_by,
                )
            with trio.fail_at(bound):
                return await _exchange(pool, upstream, request, headers, body, sink, extra_headers, finished)
        elif deadline is not None and deadline <= cap:
            # The caller's deadline scope already ends it first (the usual case: class
            # budgets are seconds, upstream caps minutes); a second scope costs ~9 us.
            return await _exchange(pool, upstream, request, headers, body, sink, extra_headers, finished)
        with trio.fail_at(cap):
            return await _exchange(pool, upstream, request, headers, body, sink, extra_headers, finished)
    except (UpstreamTimeout, trio.TooSlowError):
        deadline_passed = not scoped and deadline is not None and deadline <= cap
        if sink.headers_sent or complete.result is not None:
            if deadline_passed and not sink.headers_sent:  # _relay's clock check: nothing was written
                return await _answer(sink, complete, Outcome.CANCELLED, deadline_expired(ExpiredAt.UPSTREAM))
            if deadline_passed:
                raise  # the request path cuts the stream, as when its own scope fired
            return complete(_cut(upstream, request, f"took longer than {timeout_s:g}s", started))
        if deadline_passed:
            return await _answer(sink, complete, Outcome.CANCELLED, deadline_expired(ExpiredAt.UPSTREAM))
        message = f"upstream {upstream} took longer than {timeout_s:g}s"
        return await _answer(sink, complete, Outcome.DROPPED, Reject(wire.Reason.UPSTREAM_TIMEOUT, None, message))
    except UpstreamConnectError as exc:
        message = f"upstream {upstream} unavailable: {exc}"
        return await _answer(sink, complete, Outcome.REFUSED, Reject(wire.Reason.UPSTREAM_UNAVAILABLE, None, message))
    except UpstreamError as exc:
        if sink.headers_sent or complete.result is not None:
            return complete(_cut(upstream, request, str(exc), started))
        message = f"upstream {upstream} failed: {exc}"
        return await _answer(sink, complete, Outcome.ERROR, Reject(wire.Reason.UPSTREAM_UNAVAILABLE, None, message))


async def _exchange(
    pool: Upstreams,
    upstream: int,
    request: Request,
    headers: Headers,
    body: bytes | AsyncIterable[bytes],
    sink: ResponseSink,
    extra_headers: Headers,
    finished: _Finished,
    *,
    deadline: float | None = None,
    write_by: float | None = None,
) -> Forwarded:
    args: tuple[()] | tuple[float] | tuple[float, Headers] = () if deadline is None else (deadline,)
    if request.trailers:  # the client's request trailers go up after the body (rare: gRPC sends none)
        args = (math.inf if deadline is None else deadline, fwd.request_trailers(request.trailers))
    async with pool.request(upstream, request.method, request.target, headers, body, *args) as resp:
        out_headers = fwd.response_headers(resp.headers, resp.http_version)
        out_headers += extra_headers
        return await _relay(resp, sink, out_headers, finished, write_by)


def _restamp_budget(headers: Headers, remaining_s: float) -> None:
    """Replace the client's budget headers, in place, by the budget that remains (whole ms, >= 0)."""
    ms = max(0, math.floor(remaining_s * 1000.0))
    for i, (name, _) in enumerate(headers):
        if name == _TIMEOUT:
            headers[i] = (name, b"%d" % ms)
        elif name == _GRPC_TIMEOUT:
            headers[i] = (name, b"%dm" % min(ms, _GRPC_MAX_MS))


def _cut(upstream: int, request: Request, why: str, started: float) -> Forwarded:
    after_s = trio.current_time() - started
    target = request.target[:200].decode("latin-1")
    _events.event(
        "upstream_failed_mid_response",
        "upstream %d failed mid-response after %.1fs (%s); response to %s for %s %s cut",
        upstream,
        after_s,
        why,
        request.client or "?",
        request.method.decode("latin-1"),
        target,
    )
    return Forwarded(Outcome.ERROR, 0, cut=True)


async def _answer(sink: ResponseSink, complete: _Completion, outcome: Outcome, reject: Reject) -> Forwarded:
    status, headers, body = reject.response()
    result = complete(Forwarded(outcome, status, reason=reject.reason))
    await sink.respond(status, headers, body)
    return result


async def _relay(
    resp: UpstreamResponse, sink: ResponseSink, headers: Headers, finished: _Finished, write_by: float | None = None
) -> Forwarded:
    """Copy the response to the client as it arrives; `finished(status, usage)` before the last write.

    Fast path: a response whose whole body came with its first read (the common
    small JSON answer; a unary gRPC answer with its trailers; a short stream whose
    every chunk is already here) goes out at once, once the upstream's end of message
    is seen (no wait: it is parsed already) and the upstream's part declared over:
    one write, or head, body and trailers back to back, with no scope (HTTP/2: the
    clock check below). Everything else streams: what has arrived is sent on as soon
    as it arrives (SSE tokens included), chunks that arrived together in one write.

    `write_by` (an HTTP/2 client without a scope of its own, see `forward`): the deadline is
    checked on the clock before the one write (passed: TooSlowError, nothing written), and a
    streamed answer runs in a `trio.fail_at(write_by)` scope; a scope costs ~10-17 us, a
    clock read well under one.
    """
    first = await resp.receive()
    length = header_value(resp.headers, _CONTENT_LENGTH)
    if not first or resp.all_received or (length is not None and len(first) == int(length)):
        while await resp.receive():  # lets the pool see the end and reuse the connection
            pass
        trailers = getattr(resp, "trailers", None)  # h2 only; a trailers-only gRPC answer has none
        result = finished(resp.status, _usage(first))
        if write_by is not None and trio.current_time() >= write_by:
            raise trio.TooSlowError  # as the request's scope would have cancelled the write
        if trailers is None:
            await sink.respond(resp.status, headers, first)
        else:  # a whole body and then trailers: they can only follow a streamed head
            await sink.start(resp.status, headers)
            await sink.send(first)
            await sink.trailers(trailers)
        return result
    if write_by is None:
        return await _stream(resp, sink, headers, finished, first)
    with trio.fail_at(write_by):
        return await _stream(resp, sink, headers, finished, first)


async def _stream(
    resp: UpstreamResponse, sink: ResponseSink, headers: Headers, finished: _Finished, first: bytes
) -> Forwarded:
    """The streamed answer: head, then each upstream chunk as it comes, then the end or trailers."""
    await sink.start(resp.status, headers)
    send, receive = sink.send, resp.receive  # bound once: the loop runs once per chunk
    events = 0
    chunk = last = first
    while chunk:
        await send(chunk)
        events += chunk.count(_SSE_EVENT)
        last = chunk
        chunk = await receive()  # whatever has arrived, joined (upstream_h1 / upstream_h2 receive)
    events -= last.count(_SSE_DONE)  # [DONE] ends a stream: looked for in its last piece only
    result = finished(resp.status, Observed(output_tokens=events) if events > 0 else None)
    trailers = getattr(resp, "trailers", None)
    if trailers is None:
        await sink.end()
    else:
        await sink.trailers(trailers)  # gRPC's grpc-status / grpc-message, as the upstream sent them
    return result


def _usage(body: bytes) -> Observed | None:
    """What a whole answer says it used: a JSON body's `usage`, or an SSE body's events (as `_stream`)."""
    if body[:5] == _SSE_EVENT:
        events = body.count(_SSE_EVENT) - body.count(_SSE_DONE)
        return Observed(output_tokens=events) if events > 0 else None
    return _json_usage(body)


def _json_usage(body: bytes) -> Observed | None:
    if not body or len(body) > _USAGE_PARSE_MAX or body[:1] != b"{":
        return None
    if _USAGE_KEY not in body and b"\\u" not in body:  # no "usage" key, not even \u-escaped: no parse
        return None
    try:
        usage = _decode_usage(body).usage
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if usage is None:
        return None
    return Observed(usage.prompt_tokens, usage.completion_tokens)
