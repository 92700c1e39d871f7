"""The data port's edge: request ids, the served class, the access line, the span and the drain gate.

Theory of operation: `Edge` wraps the request path (the data listener's handler) and
does, around every request, what an operator needs to find it again:

    request id (the caller's x-request-id if well formed, else one made here; sent
    upstream) -> span (tracing, when on) -> draining? 503 draining : the request path
    -> the answer carries x-request-id and x-rampmeter-class, and a rejection body
    its "request_id" (`EdgeSink`) -> the access line (when it will be written) and
    the span's end

What only the request path knows (the ticket, queue and service time, the upstream,
the dedup outcome) it tells the `Exchange` of the running request through the
`note_*` functions below: one line each in request_path.py. They find it through a
context variable set here (trio gives each task a copy of its parent's context, so a
dedup leader started from the request's task notes into the same record), and do
nothing outside an Edge (the request path's own tests).

Drain (`POST /admin/drain`, proxy/runtime/drain.py): `draining` makes every new
request a 503 draining with Retry-After, answered here before its body is read;
`active` counts requests inside the request path, and `idle()` waits until none is.

Cost: per request one header scan (`Fields.read`, whose fields the request path reads too), one small record, two response headers and, only
when a line will be written, the line (proxy/runtime/accesslog.py). Tracing off costs
one `is None` test.
"""

from __future__ import annotations

import contextvars
import functools
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from proxy.core import request_ids, wire
from proxy.errors import BodyTooLarge, ClientGone, ProtocolError, RequestTimeout, ResponseCut
from proxy.http import h1write
from proxy.http.messages import Headers, Request, ResponseSink
from proxy.runtime import grpc_answers
from proxy.runtime.fields import Fields

if TYPE_CHECKING:  # annotations only: tracing stays unimported while it is off
    from proxy.core.decisions import Ticket
    from proxy.runtime.accesslog import AccessLog
    from proxy.runtime.tracing import RequestSpan, Tracing

_RID = wire.REQUEST_ID.encode()
_CLASS = wire.SERVED_CLASS.encode()
_REASON = wire.REASON.encode()
_CLOSE = (b"connection", b"close")
_CLIENT_CLOSED = 499  # nginx's "client closed request", as the server's metrics record it

_CURRENT: contextvars.ContextVar[Exchange | None] = contextvars.ContextVar("rampmeter_exchange", default=None)


class Exchange:
    """What is known about one request, filled in as it goes; read by the access log and the span."""

    __slots__ = (
        "bytes_out",
        "first_byte_at",
        "idempotency",
        "queue_ms",
        "reason",
        "request",
        "request_id",
        "service_ms",
        "span",
        "started",
        "status",
        "ticket",
        "upstream",
    )

    def __init__(self, request: Request, request_id: bytes, started: float) -> None:
        self.request = request
        self.request_id = request_id
        self.started = started  # trio time the head was parsed (request.received_at): no clock read per request
        self.ticket: Ticket | None = None  # once classified
        self.queue_ms: float | None = None
        self.service_ms: float | None = None
        self.upstream: int | None = None
        self.idempotency = ""  # lead / follow / replay / mismatch / in_flight / store_down, when keyed
        self.status = 0
        self.reason = ""
        self.bytes_out = 0
        self.first_byte_at: float | None = None  # trio time of the first answer bytes (kept for the span only)
        self.span: RequestSpan | None = None  # the tracing span, when tracing is on


# --- what the request path tells the running request's record (one line each there) ---------


def note_ticket(ticket: Ticket) -> None:
    """Classified: class, cost and tenant are known."""
    ex = _CURRENT.get()
    if ex is not None:
        ex.ticket = ticket


def note_admitted(upstream: int, queue_ms: float) -> None:
    """Admitted to `upstream` after `queue_ms` in the queue."""
    ex = _CURRENT.get()
    if ex is not None:
        ex.upstream, ex.queue_ms = upstream, queue_ms
        if ex.span is not None:
            ex.span.admitted(queue_ms)


def note_service(service_ms: float | None) -> None:
    """The upstream's part is over, after `service_ms`."""
    ex = _CURRENT.get()
    if ex is not None:
        ex.service_ms = service_ms


def note_idempotency(outcome: object) -> None:
    """The dedup claim's outcome (Leader, Follower, Replay, Mismatch...)."""
    ex = _CURRENT.get()
    if ex is not None:
        ex.idempotency = _IDEMPOTENCY.get(type(outcome).__name__, type(outcome).__name__.lower())


_IDEMPOTENCY = {
    "Leader": "lead",
    "Follower": "follow",
    "Replay": "replay",
    "Mismatch": "mismatch",
    "InFlightConflict": "in_flight",
    "StoreDown": "store_down",
}


class EdgeSink:
    """The client's ResponseSink with the request's id and class on every head; counts what it sends."""

    __slots__ = ("_ex", "_sink")

    def __init__(self, sink: ResponseSink, ex: Exchange) -> None:
        self._sink, self._ex = sink, ex

    @property
    def headers_sent(self) -> bool:
        return self._sink.headers_sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)  # what a protocol's sink offers beyond the four calls (trailers)

    async def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        ex = self._ex
        if status >= 400:
            self._rejected(headers)
            body = wire.with_request_id(body, ex.request_id)
        ex.status, ex.bytes_out = status, len(body)
        if ex.span is not None:
            ex.first_byte_at = trio.current_time()
        await self._sink.respond(status, self._head(headers), body)

    async def start(self, status: int, headers: Headers) -> None:
        ex = self._ex
        if status >= 400:
            self._rejected(headers)
        ex.status = status
        if ex.span is not None:
            ex.first_byte_at = trio.current_time()
        await self._sink.start(status, self._head(headers))

    async def send(self, data: bytes) -> None:
        self._ex.bytes_out += len(data)
        await self._sink.send(data)

    async def end(self) -> None:
        await self._sink.end()

    def _rejected(self, headers: Headers) -> None:
        for name, value in headers:
            if name == _REASON:
                self._ex.reason = value.decode("latin-1")
                return

    def _head(self, headers: Headers) -> Headers:
        """A new list (a recorded dedup head is played to many clients): ours replace an upstream's."""
        ex = self._ex
        out = [h for h in headers if h[0] != _RID and h[0] != _CLASS]
        out.append((_RID, ex.request_id))
        klass = ex.request.klass
        if klass:
            out.append((_CLASS, _class_bytes(klass)))
        return out


@functools.lru_cache(maxsize=256)  # the policy's class names (Scheduler.resolve_class): a handful
def _class_bytes(klass: str) -> bytes:
    return klass.encode()


class Inner(Protocol):
    """What the edge wraps (proxy/runtime/request_path.py RequestPath): it gets the header fields
    the edge read in its one pass (proxy/runtime/fields.py), so nothing scans the headers again."""

    async def __call__(self, request: Request, sink: ResponseSink, fields: Fields) -> None: ...


class Edge:
    """The data listener's handler: the request path inside the edge (module doc)."""

    def __init__(
        self,
        inner: Inner,
        *,
        access_log: AccessLog | None = None,
        tracing: Tracing | None = None,
        rng: random.Random | None = None,
        draining_retry_after_ms: int = 1000,
        on_draining: Callable[[], None] | None = None,
    ) -> None:
        self.inner = inner
        self.access_log = access_log
        self.tracing = tracing  # None: off, and nothing of OpenTelemetry imported
        self._bits = (rng or random.Random()).getrandbits
        self.draining = False
        self.draining_retry_after_ms = draining_retry_after_ms
        self._on_draining = on_draining  # counts a draining answer (rampmeter_rejections_total)
        self.active = 0  # requests inside the request path
        self.refused_draining = 0
        self._idle: trio.Event | None = None

    async def __call__(self, request: Request, sink: ResponseSink) -> None:
        fields = Fields.read(request.headers)  # the one pass over the headers (proxy/runtime/fields.py)
        if fields.request_id is None:  # the usual case, _request_id's made branch inline: one is made here
            rid = fields.request_id = request_ids.make(self._bits(128))
            request.headers.append((_RID, rid))  # sent upstream with the request
        else:
            rid = self._request_id(request, fields)
        # Made or kept, the id is a valid field value (request_ids.py's alphabet): vouched for to the
        # HTTP/1.1 writer for this request's heads, up and down, instead of checked on each (h1write).
        field = (_RID, rid)
        h1write.vouch(field)
        ex = Exchange(request, rid, request.received_at)
        if self.tracing is not None:
            ex.span = self.tracing.start(request, ex)
        out = EdgeSink(sink, ex)
        token = _CURRENT.set(ex)
        error: BaseException | None = None
        try:
            if self.draining:
                await self._refuse(grpc_answers.for_request(request, out))  # gRPC-shaped for gRPC callers
                return
            self.active += 1
            try:
                await self.inner(request, out, fields)
            finally:
                self.active -= 1
                if not self.active and self._idle is not None:
                    self._idle.set()
        except BaseException as exc:
            error = exc
            raise
        finally:
            h1write.forget(field)
            _CURRENT.reset(token)
            self._finish(ex, error)
            # The exception's traceback holds this frame, and this frame held the exception: a
            # reference cycle per failed request (~50 objects), which only the cyclic GC frees.
            # Under a stalled-body flood (every eviction a Cancelled through here) it made gen-1
            # passes of 15-35 ms 5 times a second and full ones of ~250 ms every 3 s.
            error = None

    def _request_id(self, request: Request, fields: Fields) -> bytes:
        given = fields.request_id
        if given is not None:
            kept = request_ids.accept(given)
            if kept is None:  # malformed: replaced, here and upstream
                kept = request_ids.make(self._bits(128))
                request.headers[fields.request_id_at] = (_RID, kept)
            fields.request_id = kept
            return kept
        made = fields.request_id = request_ids.make(self._bits(128))
        request.headers.append((_RID, made))  # sent upstream with the request
        return made

    async def _refuse(self, out: ResponseSink) -> None:
        self.refused_draining += 1
        if self._on_draining is not None:
            self._on_draining()
        message = "this replica is draining (shutting down); retry, another one will serve it"
        status, headers, body = wire.rejection(wire.Reason.DRAINING, message, self.draining_retry_after_ms)
        # Close the connection (HTTP/1.1; h2 drops the field): the body may not be read to its end, and
        # a client kept on an idle keep-alive connection would race its closing; a new connection finds
        # another replica once the endpoint is gone.
        headers.append(_CLOSE)
        await out.respond(status, headers, body)

    def _finish(self, ex: Exchange, error: BaseException | None) -> None:
        if not ex.status or error is not None:
            ex.status = _failed_status(ex, error)
        log = self.access_log
        if log is not None and log.wants(ex.status, ex.reason):
            log.write(ex, trio.current_time(), error)
        if ex.span is not None:
            ex.span.end(ex, error)

    async def idle(self) -> None:
        """Until no request is inside the request path (several callers share one event)."""
        while self.active:
            if self._idle is None or self._idle.is_set():
                self._idle = trio.Event()
            await self._idle.wait()


def _failed_status(ex: Exchange, error: BaseException | None) -> int:
    """The status the server answers for a request the request path ended without one (exchange.py's rules)."""
    if ex.request.client_gone or isinstance(error, trio.Cancelled | ClientGone):
        return _CLIENT_CLOSED
    if isinstance(error, ResponseCut):
        ex.reason = ex.reason or "cut"
        return ex.status or 500  # the head went out; the stream was cut
    if isinstance(error, BodyTooLarge):
        return 413
    if isinstance(error, RequestTimeout):
        return 408
    if isinstance(error, ProtocolError):
        return 400
    return ex.status or 500
