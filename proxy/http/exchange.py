"""One request/response exchange, shared by the HTTP/1.1 and HTTP/2 connections.

Theory of operation: a connection parses a request head into a `Request`, gives it
a `BufferedBody` that its reader feeds, and calls `run_exchange()`, which runs the
handler in the request's own cancel scope and turns every way a handler can end
into an answer on the wire:

    returned, response complete          -> nothing to do
    raised BodyTooLarge / RequestTimeout
      / ProtocolError                     -> 413 / 408 / 400 if nothing was sent
                                             (BodyTooLarge with a gRPC response under way
                                             on HTTP/2: RESOURCE_EXHAUSTED in its trailers)
    raised anything else, or returned
      without finishing                  -> 500 if nothing was sent, else abort
    client gone (scope cancelled)        -> nothing can be said; stop

`ServerContext` is what every connection of one `Server` shares: the handler, the
limits, the `Patrol` (phase deadlines, eviction, hung-up clients: proxy/http/patrol.py),
the `WaitRoom` (sockets of stalled clients, woken in bounded batches: proxy/http/waitroom.py),
statistics counters and the Prometheus children bound once (never per request).
`metrics=None` leaves only the counters, so tests need no registry.
Its `events` log (proxy/http/ratelog.py) is where every client-caused event is
logged: one line per event with the peer, at a rate no client can raise; a handler
that fails (a real bug a client may trigger at will) logs its traceback that way.

A request body is read under two bounds when the handler has to wait for bytes
(`BufferedBody.deadline` and `timeout_s`, set by the connection): the request's own
deadline (x-request-timeout-ms / grpc-timeout, parsed from the head: it applies
while the body is read, not only once it is) and listen.body_timeout_s between
one wait's start and the next bytes. Past either, the read raises RequestTimeout
(answered 408). A body that came with its head costs neither a clock read nor a
scope.

Answers the server writes itself (the 400/408/413/431/500 here and in the
connections: parse errors, timeouts, limits, a failed handler) carry an
`x-request-id` as every other answer of the proxy does (`request_id()`:
the request's own when the head was parsed and it has an acceptable one, else one
made as the edge makes them, proxy/core/request_ids.py), and the log line about
the event names it, so a client's report of such an answer can be found in the log.

Invariants: the body buffer never holds more than the connection allowed (h1 reader
backpressure, h2 flow-control window); a handler exception never escapes a
connection; `trio.Cancelled` from outside (server shutdown) always propagates.
"""

from __future__ import annotations

import contextvars
import logging
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import trio

from proxy.core import grpc_wire, request_ids, wire
from proxy.errors import BodyTooLarge, ClientGone, ProtocolError, RequestTimeout, ResponseCut
from proxy.http.messages import Handler, Headers, Request, ResponseSink
from proxy.http.patrol import Patrol
from proxy.http.ratelog import RateLimitedLog
from proxy.http.waitroom import WaitRoom
from proxy.metrics import Metrics
from proxy.policy.schema import Listen

log = logging.getLogger("rampmeter.server")
_TIMEOUT = wire.REQUEST_TIMEOUT_MS.encode()
_GRPC_TIMEOUT = wire.GRPC_TIMEOUT.encode()
_RID = wire.REQUEST_ID.encode()
_CONTENT_TYPE = b"content-type"
_bits = random.Random().getrandbits  # made request ids (128 random bits, as the edge draws them)
_answers_log = RateLimitedLog(log)  # the connections' own answers: a client controls their rate


def request_id(request: Request | None = None) -> bytes:
    """The id for an answer the server writes itself: `request`'s x-request-id if acceptable, else a new one.

    A made one is written into `request`'s headers (as the edge does), so a second call for the
    same request (its log line, then its answer) gives the same id.
    """
    if request is None:
        return request_ids.make(_bits(128))
    headers = request.headers
    for i, (name, value) in enumerate(headers):
        if name == _RID:
            kept = request_ids.accept(value)
            if kept is None:  # malformed: replaced, as the edge replaces it
                kept = request_ids.make(_bits(128))
                headers[i] = (_RID, kept)
            return kept
    made = request_ids.make(_bits(128))
    headers.append((_RID, made))
    return made


TEXT_PLAIN = [(b"content-type", b"text/plain; charset=utf-8")]
# The peer of the connection the running task serves: set once per connection by the server
# and inherited by the tasks the connection starts (trio copies the context at spawn), so a
# line about a client's doing names the client without every call site passing it.
CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("rampmeter_client", default="?")
CLIENT_CLOSED = 499  # nginx's code for "client closed request": recorded, never sent


class ServerContext:
    """State shared by all connections of one server: handler, limits, counters, metrics."""

    def __init__(
        self, handler: Handler, limits: Listen, metrics: Metrics | None, *, buffer_bodies: bool = False
    ) -> None:
        self.handler = handler
        # The handler reads every HTTP/1.1 body whole before it acts (the sidecar's request path does): the
        # connection may read a body still arriving before the handler starts (h1server, "request bodies").
        # Off for handlers that answer while the body streams in (a duplex echo, a test upstream).
        self.buffer_bodies = buffer_bodies
        self.limits = limits
        self.metrics = metrics
        self.patrol = Patrol(self)
        self.room = WaitRoom()  # sockets held waiting for a stalled client, woken in bounded batches (waitroom.py)
        self.draining = False
        self.requests_in_flight = 0
        self.requests_total = 0
        self.client_disconnects = 0
        self.connections_rejected = 0
        self.protocol_errors = 0
        self.events = RateLimitedLog(log)
        self._done: dict[tuple[str, int, str], Callable[[float], None]] = {}
        self._errors: dict[str, Callable[[], None]] = {}

    def now(self) -> float:
        """trio.current_time(); `Server.serve` binds the running clock's own method in its place (one call, not three)."""
        return trio.current_time()

    def request_done(self, protocol: str, code: int, duration_s: float, klass: str = "") -> None:
        self.requests_total += 1
        record = self._done.get((protocol, code, klass))
        if record is None:
            record = self._done[(protocol, code, klass)] = self._bind_done(protocol, code, klass)
        record(duration_s)

    def _bind_done(self, protocol: str, code: int, klass: str) -> Callable[[float], None]:
        if self.metrics is None:
            return lambda _duration_s: None
        count = self.metrics.requests.labels(protocol, klass, str(code)).inc  # a Tally: positional, SPECS order
        observe = self.metrics.request_duration_seconds.labels(protocol, klass).observe

        def record(duration_s: float) -> None:
            count()
            observe(duration_s)

        return record

    def protocol_error(self, kind: str, detail: str, peer: str = "", request_id: bytes = b"") -> None:
        """One count and one (rate-limited) line per malformed request or HTTP/2 protocol error.

        `request_id`: the x-request-id of the answer that says so (the server's own answers carry one).
        """
        self.protocol_errors += 1
        if request_id:
            self.events.event(
                kind,
                "protocol error %s from %s: %s (request_id=%s)",
                kind,
                peer or CLIENT.get(),
                detail,
                request_id.decode("ascii"),
            )
        else:
            self.events.event(kind, "protocol error %s from %s: %s", kind, peer or CLIENT.get(), detail)
        count = self._errors.get(kind)
        if count is None:
            count = self._errors[kind] = (
                self.metrics.protocol_errors.labels(kind=kind).inc if self.metrics else _nothing
            )
        count()

    def connection_rejected(self, peer: str = "") -> None:
        self.connections_rejected += 1
        self.events.event(
            "connection_refused",
            "connection from %s refused: max_connections (%d) open",
            peer or "?",
            self.limits.max_connections,
        )
        if self.metrics is not None:
            self.metrics.connections_rejected.inc()

    def client_gone(self, request: Request) -> None:
        if not request.client_gone:
            request.client_gone = True
            self.client_disconnects += 1
            if self.metrics is not None:
                self.metrics.client_disconnects.inc()


def _nothing() -> None:
    pass


class BufferedBody:
    """A request body fed by the connection's reader and read once by the handler.

    Subclasses say what consuming bytes means for the peer (`_consumed`: wake the
    h1 reader / acknowledge h2 flow control) and what the first read means
    (`_first_read`: send 100 Continue on h1), called only where `first_read_wanted` says.
    """

    __slots__ = (
        "_error",
        "first_read_wanted",
        "_lot",
        "_parts",
        "complete",
        "content_length",
        "deadline",
        "limit",
        "received",
        "started",
        "timeout_s",
    )

    def __init__(self, content_length: int | None, limit: int) -> None:
        self.content_length = content_length
        self.limit = limit
        self.deadline = math.inf  # the request's own deadline, when it has one (module doc)
        self.timeout_s = math.inf  # longest wait for more bytes
        self.received = 0  # bytes fed, whether consumed or not
        self.complete = False  # the peer finished the body (or it was empty)
        self.started = False
        self._parts: deque[tuple[bytes, int]] = deque()  # (data, flow-controlled length)
        self._error: BaseException | None = None
        self._lot: trio.lowlevel.ParkingLot | None = None  # made when a reader first waits
        self.first_read_wanted = False  # `_first_read` has something to do (h1: the client expects 100)

    # --- the reader's side ---
    def feed(self, data: bytes, flow_len: int) -> bool:
        """Buffer `data`; False (and the body fails) once it passes the cap."""
        self.received += len(data)
        if self.received > self.limit:
            self.fail(BodyTooLarge(self.limit))
            return False
        self._parts.append((data, flow_len))
        self._wake()
        return True

    def finish(self) -> None:
        self.complete = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        """Reading now raises `error` (BodyTooLarge, ProtocolError, ClientGone)."""
        if self._error is None:
            self._error = error
        self._wake()

    @property
    def failed(self) -> bool:
        """Reading raises (BodyTooLarge, RequestTimeout, ProtocolError, ClientGone) once the buffer is drained."""
        return self._error is not None

    def discard(self) -> None:
        """The connection is over: drop unread bytes and the error (whose traceback holds the frame
        of `chunks`, which holds this body: a reference cycle)."""
        self._parts.clear()
        self._error = None

    def _wake(self) -> None:
        if self._lot is not None:
            self._lot.unpark_all()

    # --- the handler's side ---
    async def chunks(self) -> AsyncIterator[bytes]:
        if not self.started:
            self.started = True
            if self.first_read_wanted:
                await self._first_read()
        while True:
            if self._parts:
                data, flow_len = self._parts.popleft()
                self._consumed(len(data), flow_len)
                yield data
            elif self._error is not None:
                raise self._error
            elif self.complete:
                return
            else:
                await self._wait()

    async def read_all(self) -> bytes:
        if self.complete and not self.started and self._error is None:
            # The whole body is here already (always so for a GET): skip the async generator.
            self.started = True
            if self.first_read_wanted:
                await self._first_read()
            parts = self._parts
            if not parts:
                return b""
            for data, flow_len in parts:
                self._consumed(len(data), flow_len)
            whole = parts[0][0] if len(parts) == 1 else b"".join(data for data, _ in parts)
            parts.clear()
            return whole
        chunks = [chunk async for chunk in self.chunks()]
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _wait(self) -> None:
        """Until the reader fed more (or failed the body), within `deadline` and `timeout_s`."""
        if self._lot is None:
            self._lot = trio.lowlevel.ParkingLot()
        if self.deadline == math.inf and self.timeout_s == math.inf:
            await self._lot.park()
            return
        with trio.move_on_at(self.wait_until()) as waited:
            await self._lot.park()
        if waited.cancelled_caught:
            self.fail(self.timed_out())

    def wait_until(self) -> float:
        return min(self.deadline, trio.current_time() + self.timeout_s)

    def timed_out(self) -> RequestTimeout:
        if trio.current_time() >= self.deadline:
            return RequestTimeout("the request's deadline passed while its body was being received")
        return RequestTimeout(f"no request body bytes for {self.timeout_s:g}s")

    async def _first_read(self) -> None:
        pass

    def _consumed(self, size: int, flow_len: int) -> None:
        pass


def request_deadline(headers: Headers, received_at: float) -> float:
    """The absolute deadline a request's x-request-timeout-ms / grpc-timeout gives; inf if none (or unreadable).

    A malformed value is not this layer's to refuse: classification answers it 400 once
    the body is read. Only for bodies that must be waited for (module doc).
    """
    for name, value in headers:
        try:
            if name == _TIMEOUT:
                return received_at + wire.parse_timeout_ms(value) / 1000.0
            if name == _GRPC_TIMEOUT:
                return received_at + wire.parse_grpc_timeout_ms(value) / 1000.0
        except wire.HeaderError:
            return math.inf
    return math.inf


class Sink(ResponseSink, Protocol):
    """What `run_exchange` needs of a protocol's ResponseSink beyond the public API."""

    finished: bool
    status: int

    def abort(self) -> None: ...


async def run_exchange(
    ctx: ServerContext,
    protocol: str,
    handler: Handler,
    request: Request,
    sink: Sink,
    scope: trio.CancelScope | None,
) -> float:
    """Run `handler` in `scope` (which the reader cancels when the client goes) and finish the answer.

    `scope=None`: the caller's own task scope plays that part (h1: one per connection), and
    a cancellation propagates from here after the bookkeeping. Returns when it ended
    (trio time), for callers that keep time per request.

    One coroutine, the handler called inline (no helper per request: each coroutine layer is
    created, and resumed at every wait of the handler's, request after request).
    """
    ctx.requests_in_flight += 1
    problem: tuple[int, str] | None = None
    try:
        try:
            if scope is None:
                await handler(request, sink)
            else:
                with scope:
                    await handler(request, sink)
        except BodyTooLarge as exc:
            problem = 413, f"request body larger than {exc.limit} bytes"
        except RequestTimeout as exc:
            rid = request_id(request)
            ctx.protocol_error("body_timeout", str(exc), request.client, rid)
            problem = 408, str(exc)
        except ClientGone:
            ctx.client_gone(request)
        except ProtocolError as exc:
            problem = 400, str(exc)
        except ResponseCut:
            problem = 500, "response cut"  # started, so the stream is aborted; logged where it was cut
        except Exception:
            ctx.events.event(
                "handler_failed",
                "handler failed on %r from %s",
                request,
                request.client,
                level=logging.ERROR,
                exc_info=True,
            )
            problem = 500, "internal error"
        else:
            if not sink.finished and not request.client_gone:
                ctx.events.event(
                    "handler_unfinished",
                    "handler returned without finishing its response to %r",
                    request,
                    level=logging.ERROR,
                )
                problem = 500, "handler returned without a response"
        if problem is not None and not request.client_gone:
            await _answer_problem(ctx, request, sink, *problem)
    finally:
        ctx.requests_in_flight -= 1
        code = CLIENT_CLOSED if request.client_gone else sink.status
        ended = ctx.now()
        ctx.request_done(protocol, code, ended - request.received_at, request.klass)
    return ended


def answer(status: int, message: str) -> Handler:
    """A stand-in handler for a request the server answers itself (413, 431).

    It says `connection: close` (h1 closes after it; h2 drops the header as hop-by-hop), and
    carries an x-request-id (`request_id()`), which its (rate-limited) log line names.
    """
    body = f"{status} {message}\n".encode()

    async def handler(request: Request, sink: ResponseSink) -> None:
        rid = request_id(request)
        _answers_log.event(
            f"answer_{status}",
            "answered %d to %s (request_id=%s): %s",
            status,
            request.client or CLIENT.get(),
            rid.decode("ascii"),
            message,
        )
        if status == 413 and grpc_wire.is_grpc(ct := request.header(_CONTENT_TYPE)):
            await sink.respond(*grpc_wire.too_large(message, ct))  # what a gRPC client reads (issue 17)
            return
        await sink.respond(status, [*TEXT_PLAIN, (b"connection", b"close"), (_RID, rid)], body)

    return handler


def _trailers_can_say_so(request: Request, sink: Sink) -> bool:
    """A started response whose status its trailers can still carry: gRPC over HTTP/2 (an HTTP/1.1
    client that did not send `te: trailers` would get a body that ends as if complete: it is cut)."""
    return not sink.finished and request.http_version == "2" and grpc_wire.is_grpc(request.header(_CONTENT_TYPE))


async def _answer_problem(ctx: ServerContext, request: Request, sink: Sink, status: int, message: str) -> None:
    rid = request_id(request)  # the 408's line (run_exchange) named the same one
    if sink.headers_sent:
        if status == 413 and _trailers_can_say_so(request, sink):
            # A gRPC call's status can still go in its trailers: a bidi call whose replies had started when its request
            # stream passed the limit ends RESOURCE_EXHAUSTED, as a servicer's own receive limit ends
            # it, not reset (which grpcio shows as INTERNAL). Issue 17, docs/grpc.md.
            try:
                await sink.trailers(grpc_wire.too_large_status(message))
            except ClientGone:
                ctx.client_gone(request)
            return
        sink.abort()  # too late for a status: the client must see a broken response
        return
    try:
        if status == 413 and grpc_wire.is_grpc(ct := request.header(_CONTENT_TYPE)):
            await sink.respond(*grpc_wire.too_large(message, ct))  # what a gRPC client reads (issue 17)
        else:
            await sink.respond(status, [*TEXT_PLAIN, (_RID, rid)], f"{status} {message}\n".encode())
    except ClientGone:
        ctx.client_gone(request)
