"""One HTTP/2 stream on the server side: its body, its response sink and its task.

Theory of operation: the connection's reader creates an `H2Stream` per accepted
HEADERS frame and starts `run()` in the connection's nursery, so streams are
handled concurrently and a slow one delays no other. The body buffer is bounded
by the stream's flow-control window: bytes are acknowledged (WINDOW_UPDATE) only
as the handler consumes them, and whatever is left unread when the stream ends is
acknowledged then, so the connection window never leaks. A handler waiting for body
bytes waits at most listen.body_timeout_s between them and never past the request's
own x-request-timeout-ms / grpc-timeout; then the stream is reset (RST_STREAM
CANCEL) and the handler ends as if the client had gone. A body can also be passed
upstream as it arrives (`H2Body.passing()`, for gRPC client and bidi streaming:
proxy/runtime/passthrough.py): the upstream's upload task reads it chunk by chunk,
each chunk acknowledged once the upload asks for the next, under the same bounds.

The sink writes through h2 and the connection's writer (`kick()` queues h2's output
without waiting). Body bytes go out no faster than the peer's window allows; what
the window (or the socket queue) cannot take yet is held by the stream, in order,
and sent as WINDOW_UPDATEs arrive. So a handler's `respond()` / `send()` return
as soon as the bytes are handed over: the request path releases the request's
admission slot when the upstream response is complete, not when a slow (or
zero-window) client has read it. Held bytes count against the connection's
h2_send_buffer_bytes; past it a sender waits, holding its slot, as before. After the
handler, `run()` delivers what is still held; a stream whose client takes nothing for
h2_send_timeout_s is reset (RST_STREAM CANCEL), which frees its memory and its
stream slot. h2 errors on a stream the peer reset become `ClientGone`, so h2 never
leaks past this module.

Frames: the sink serialises its HEADERS (CONTINUATION past the peer's max frame size)
and DATA frames itself, with the connection's memoising HPACK encoder, instead of
calling h2's send_headers / send_data, which build a frame object per frame, set
flags as a set of strings, validate and log per call (~20% of the transport's CPU per
h2c request). What h2 still has to know is moved exactly as those calls would move it
(`_advance`): the connection's and the stream's state machines (SEND_HEADERS,
SEND_DATA, SEND_END_STREAM), and both outbound flow-control windows. A stream h2 no
longer knows (closed, reset) is ClientGone, as before. tests/contract/test_h2_internals.py
pins those internals; the h2 conformance of what goes out is checked by h2 itself in
the tests (an h2 client decodes every response of tests/runtime/test_server_h2.py).

Invariant: `H2ServerConnection.stream_done()` is called exactly once per started stream,
also on cancellation; held bytes leave the connection's count exactly once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import h2.exceptions
import h2.stream
import trio
from h2.connection import ConnectionInputs
from h2.errors import ErrorCodes
from h2.stream import StreamInputs

from proxy.core import wire
from proxy.errors import ClientGone
from proxy.http import h2frames
from proxy.http.exchange import CLIENT_CLOSED, BufferedBody, answer, run_exchange
from proxy.http.forward import request_trailers
from proxy.http.h2rules import Malformed, RequestHead
from proxy.http.messages import HOP_BY_HOP, Handler, Headers, Request, ResponseSink, header_value

if TYPE_CHECKING:
    from proxy.http.h2server import H2ServerConnection

NO_BODY_STATUS = frozenset({204, 304})
_STATUS: dict[int, bytes] = {}
_TIMEOUT = wire.REQUEST_TIMEOUT_MS.encode()
_GRPC_TIMEOUT = wire.GRPC_TIMEOUT.encode()
_GRPC_STATUS = b"grpc-status"

_CONN_SEND_HEADERS, _CONN_SEND_DATA = ConnectionInputs.SEND_HEADERS, ConnectionInputs.SEND_DATA
_SEND_HEADERS, _SEND_DATA, _SEND_END = StreamInputs.SEND_HEADERS, StreamInputs.SEND_DATA, StreamInputs.SEND_END_STREAM


def _status_bytes(status: int) -> bytes:
    value = _STATUS.get(status)
    if value is None:
        value = _STATUS[status] = str(status).encode()
    return value


async def _options_star(request: Request, sink: ResponseSink) -> None:
    """`OPTIONS *` asks about the server itself (RFC 9110 9.3.7): the sidecar answers it."""
    await sink.respond(200, [])


def build_request(
    conn: H2ServerConnection, sid: int, head: RequestHead | Malformed, client: str
) -> tuple[Request, H2Body, Handler]:
    """The Request for a HEADERS frame, and who answers it: the handler, or 400/405/413/431 at once."""
    ctx = conn.ctx
    limits = ctx.limits
    handler = ctx.handler
    if isinstance(head, Malformed):
        ctx.protocol_error("h2_malformed", head.message)
        handler = answer(head.status, head.message)
        method, target, authority, scheme, headers, length = b"", b"", b"", b"http", [], None
    else:
        method, target, authority, scheme = head.method, head.target, head.authority, head.scheme
        headers, length = list(head.headers), head.content_length
        if head.size > limits.max_header_bytes:
            ctx.protocol_error("h2_header_too_large", f"{head.size} byte header list")
            handler = answer(431, f"request header list larger than {limits.max_header_bytes} bytes")
        elif length is not None and length > limits.max_body_bytes:
            handler = answer(413, f"request body larger than {limits.max_body_bytes} bytes")
        elif target == b"*":
            handler = _options_star
    body = H2Body(conn, sid, length, limits.max_body_bytes)
    request = Request(
        method,
        target,
        headers,
        body,
        authority=authority,
        scheme=scheme,
        http_version="2",
        client=client,
        received_at=trio.current_time(),
    )
    body.request = request
    return request, body, handler


class H2Body(BufferedBody):
    """A stream's body. What it may hold counts against the connection's h2_body_bytes_per_connection:
    its content-length from the start (the connection reserves it when it accepts the stream),
    or what has arrived when there is none (less what was passed on upstream: `passing()`)."""

    __slots__ = ("_conn", "_passed", "_sid", "_unacked", "accounted", "request")

    def __init__(self, conn: H2ServerConnection, sid: int, content_length: int | None, limit: int) -> None:
        super().__init__(content_length, limit)
        self._conn = conn
        self._sid = sid
        self.request: Request | None = None
        self.accounted = 0  # bytes of the connection's body budget this body holds
        self._passed = 0  # bytes handed upstream whose budget was given back (passing(), no content-length)
        self._unacked = 0  # flow-controlled length handed upstream and not yet acknowledged to the client

    def reserve(self, size: int) -> None:
        self.accounted += size
        self._conn.body_bytes += size

    def passing(self) -> PassingBody:
        """The body as an iterator for the upstream upload, read as the upstream takes it (PassingBody)."""
        return PassingBody(self)

    def feed(self, data: bytes, flow_len: int) -> bool:
        beyond = self.received - self._passed + len(data) - self.accounted
        if beyond > 0:
            if not self._conn.body_room(beyond):
                self._conn.body_over(self._sid)
                self.fail(ClientGone("the connection's request bodies are at their bound"))
                return False
            self.reserve(beyond)
        return super().feed(data, flow_len)

    def _consumed(self, size: int, flow_len: int) -> None:
        self._conn.acknowledge(flow_len, self._sid)

    def release(self) -> None:
        """Acknowledge what the handler never read, and give the budget back (the stream is over)."""
        unread = self._unacked
        if self._parts:
            unread += sum(flow_len for _, flow_len in self._parts)
            self._parts.clear()
        self._unacked = 0
        if unread:
            self._conn.acknowledge(unread, self._sid)
        self._conn.body_bytes -= self.accounted
        self.accounted = 0
        self.request = None  # request <-> body was a reference cycle per request (H2Sink.__init__ says why)

    async def _wait(self) -> None:
        """Wait for body bytes until body_timeout_s or the request's deadline; then reset the stream."""
        if self._lot is None:
            self._lot = trio.lowlevel.ParkingLot()
        conn = self._conn
        by_gap, by_deadline = trio.current_time() + conn.body_timeout_s, self._request_deadline()
        with trio.move_on_at(min(by_gap, by_deadline)) as waited:
            await self._lot.park()
        if waited.cancelled_caught and not (self._parts or self.complete or self._error is not None):
            stream = conn.streams.get(self._sid)
            why = "the request's deadline passed" if by_deadline < by_gap else f"no bytes for {conn.body_timeout_s:g}s"
            conn.timed_out("body", f"request body stalled ({why}); RST_STREAM CANCEL")
            if stream is not None:
                stream.reset(ErrorCodes.CANCEL)
                conn.ctx.client_gone(stream.request)
            raise ClientGone("request body timed out")

    def _request_deadline(self) -> float:
        """received_at + the client's own budget (x-request-timeout-ms, grpc-timeout); inf without one."""
        request = self.request
        if request is None:
            return float("inf")
        budget_ms = None
        for name, value in request.headers:
            try:
                if name == _TIMEOUT:
                    ms = wire.parse_timeout_ms(value)
                elif name == _GRPC_TIMEOUT:
                    ms = wire.parse_grpc_timeout_ms(value)
                else:
                    continue
            except wire.HeaderError:
                continue  # the request path answers 400 for it, once the body is in
            budget_ms = ms if budget_ms is None else min(budget_ms, ms)
        return float("inf") if budget_ms is None else request.received_at + budget_ms / 1000.0


class PassingBody:
    """A request body on its way upstream as it arrives (gRPC client and bidi streaming), for the
    upstream connection's upload task (`async for`; a class, not an async generator: the upload
    task is cancelled mid-stream, and an abandoned generator would be finalised by the GC).

    Flow control both ways: a chunk's bytes are acknowledged to the client (WINDOW_UPDATE) only
    when the upload asks for the next one, that is once the upstream's window took the chunk; so
    the client sends no faster than the upstream reads, and one stream holds at most its receive
    window plus the chunk being uploaded. Without a content-length, the chunk's share of
    h2_body_bytes_per_connection is given back as it goes up (what counts is what is held). The
    bounds stay: listen.max_body_bytes on the whole body (413; once answering, a gRPC call's
    trailers say RESOURCE_EXHAUSTED and anything else is reset: exchange._answer_problem),
    body_timeout_s between chunks and the request's deadline (H2Body._wait: RST_STREAM CANCEL).

    `trailers`: the client's request trailers (a trailing HEADERS), as they go upstream
    (`forward.request_trailers`), known once the iteration has ended; None if none came.
    They cannot be given with the upstream stream's head, as a whole body's are: they
    arrive after the last chunk, so the upload sends them in place of END_STREAM."""

    __slots__ = ("_body", "trailers")

    def __init__(self, body: H2Body) -> None:
        self._body = body
        self.trailers: Headers | None = None

    def __aiter__(self) -> PassingBody:
        return self

    def whole_here(self) -> bool:
        """All of it has arrived and none was read: it can go up as bytes (`read_all`, no wait)."""
        body = self._body
        return body.complete and not body.started and body._error is None

    async def __anext__(self) -> bytes:
        body = self._body
        body.started = True
        if body._unacked:  # the previous chunk is upstream's now: the client may send as much again
            flow, body._unacked = body._unacked, 0
            body._conn.acknowledge(flow, body._sid)
        while True:
            if body._parts:
                data, flow = body._parts.popleft()
                if not data:  # an empty DATA (END_STREAM alone, or padding only): nothing to upload
                    body._conn.acknowledge(flow, body._sid)
                    continue
                body._unacked = flow
                if body.content_length is None:
                    body._passed += len(data)
                    body.accounted -= len(data)
                    body._conn.body_bytes -= len(data)
                return data
            if body._error is not None:
                raise body._error
            if body.complete:
                request = body.request  # TrailersReceived came before StreamEnded (h2server._dispatch)
                if request is not None and request.trailers:
                    self.trailers = request_trailers(request.trailers)
                raise StopAsyncIteration
            await body._wait()


class H2Sink:
    """ResponseSink for one stream. Called only from that stream's task."""

    __slots__ = (
        "_conn",
        "_end_held",
        "_head_request",
        "_held",
        "_held_bytes",
        "_request",
        "_sid",
        "_trailers_held",
        "finished",
        "headers_sent",
        "status",
    )

    def __init__(self, conn: H2ServerConnection, stream: H2Stream, head_request: bool) -> None:
        self._conn = conn
        # The stream's id and request, not the stream: the stream holds its sink, and a back-reference
        # made each request a reference cycle (sink <-> stream, with the body, the request and their
        # deques): ~8 objects of cyclic garbage per request, left to the cyclic GC, whose gen-1/gen-2
        # passes were the h2c wire's long pauses (tens of ms: the p99 outlier at 1000 req/s).
        self._sid = stream.sid
        self._request = stream.request
        self._head_request = head_request
        self._held: deque[memoryview] = deque()  # bytes the window could not take yet, in order
        self._held_bytes = 0
        self._end_held = False  # END_STREAM goes with the last held bytes
        self._trailers_held: Headers | None = None  # trailers that go (with END_STREAM) after the last held bytes
        self.headers_sent = False
        self.finished = False
        self.status = 0

    @property
    def holding(self) -> bool:
        return bool(self._held)

    async def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        length: int | None = len(body)  # on HEAD, content-length still says what GET would send
        if not body and header_value(headers, _GRPC_STATUS) is not None:
            length = None  # a gRPC trailers-only response goes out as it came: one HEADERS, nothing added
        if self._head_request or status in NO_BODY_STATUS:
            body = b""
        end = not body
        self._send_headers(status, headers, length, end)
        if not end:
            self._push(body, end_stream=True)
        self.finished = True
        await self._room()

    async def start(self, status: int, headers: Headers) -> None:
        self._send_headers(status, headers, None, False)

    async def send(self, data: bytes) -> None:
        if not self.headers_sent or self.finished:
            raise RuntimeError("send() outside a started response")
        if data and not self._head_request:
            self._push(data, end_stream=False)
            await self._room()

    async def end(self) -> None:
        if not self.headers_sent or self.finished:
            raise RuntimeError("end() outside a started response")
        if self._held:
            self._end_held = True
        else:
            self._send_now(memoryview(b""), end_stream=True)
        self.finished = True

    async def trailers(self, headers: Headers) -> None:
        """Finish the streamed response with a trailing HEADERS frame (END_STREAM), after any held bytes."""
        if not self.headers_sent or self.finished:
            raise RuntimeError("trailers() outside a started response")
        fields = [(k, v) for k, v in headers if k not in HOP_BY_HOP and k[:1] != b":"]
        if self._head_request or not fields:
            await self.end()
            return
        if self._held:
            self._trailers_held = fields
        else:
            self._write_headers(fields, end_stream=True)
        self.finished = True

    def abort(self) -> None:
        self.drop_held()
        _reset(self._conn, self._sid, ErrorCodes.INTERNAL_ERROR)

    async def deliver(self) -> None:
        """After the handler: send what is held as the window opens (ClientGone past the send timeout)."""
        if self._held:
            await self._wait(lambda: not self._held)

    def drop_held(self) -> None:
        self._conn.held_bytes -= self._held_bytes
        self._conn.holding.pop(self._sid, None)
        self._held.clear()
        self._held_bytes = 0
        self._trailers_held = None

    def _send_headers(self, status: int, headers: Headers, length: int | None, end: bool) -> None:
        if self.headers_sent:
            raise RuntimeError("response already started")
        self.headers_sent = True
        self.status = status
        out = [(b":status", _status_bytes(status))]
        out += [(k, v) for k, v in headers if k not in HOP_BY_HOP]  # illegal in HTTP/2
        if (
            length is not None
            and status >= 200
            and status not in NO_BODY_STATUS
            and header_value(headers, b"content-length") is None
        ):
            out.append((b"content-length", str(length).encode()))
        self._write_headers(out, end_stream=end)

    def _h2_stream(self) -> h2.stream.H2Stream:
        """h2's state for this stream; ClientGone once the client reset it or h2 has closed it."""
        if self._request.client_gone:
            raise ClientGone("client reset the stream")
        state = self._conn.h2.streams.get(self._sid)
        if state is None:
            self._conn.ctx.client_gone(self._request)
            raise ClientGone(f"stream {self._sid} is closed")
        return state

    def _advance(
        self, state: h2.stream.H2Stream, conn_input: ConnectionInputs, stream_input: StreamInputs, end_stream: bool
    ) -> None:
        """Move h2's connection and stream state machines as its send_headers / send_data would."""
        try:
            self._conn.h2.state_machine.process_input(conn_input)
            state.state_machine.process_input(stream_input)
            if end_stream:
                state.state_machine.process_input(_SEND_END)
        except h2.exceptions.ProtocolError as exc:  # stream or connection closed (reset, GOAWAY)
            self._conn.ctx.client_gone(self._request)
            raise ClientGone(f"stream {self._sid} is closed: {exc}") from exc

    def _write_headers(self, fields: Headers, end_stream: bool) -> None:
        """A response head or trailers: one HEADERS frame (CONTINUATIONs past the peer's max frame size).

        Serialised here, not by h2's send_headers (module doc, "Frames"): the state machines move
        exactly as h2 would move them (`_advance`, before the irreversible HPACK encoding, as h2
        does), and the block comes from the connection's (memoising) encoder."""
        state = self._h2_stream()
        self._advance(state, _CONN_SEND_HEADERS, _SEND_HEADERS, end_stream)
        h2c, sid = self._conn.h2, self._sid
        block = h2c.encoder.encode(fields)
        self._conn.send_frames(h2frames.header_block(sid, block, end_stream, h2c.max_outbound_frame_size))

    def _push(self, data: bytes, end_stream: bool) -> None:
        """Send what can go now; hold the rest (after anything already held, to keep the order)."""
        view = memoryview(data)
        if self._held:
            self.pump()
        if not self._held:
            rest = self._send_now(view, end_stream)
            if rest is None:
                return
            view = rest
        self._held.append(view)
        self._held_bytes += len(view)
        self._conn.held_bytes += len(view)
        self._conn.holding[self._sid] = self
        self._end_held = self._end_held or end_stream

    def _send_now(self, view: memoryview, end_stream: bool) -> memoryview | None:
        """DATA frames within the peer's window and the socket queue's bound; what is left, or None.

        Serialised here (module doc, "Frames"): h2's send_data builds a frame object, flags set
        and a serialisation per frame; the windows and state machines move as it would move them."""
        conn = self._conn
        h2c = conn.h2
        state = self._h2_stream()
        total = len(view)
        size = max(0, min(h2c.outbound_flow_control_window, state.outbound_flow_control_window, total, conn.out_room()))
        if total and not size:
            return view
        end = end_stream and size == total
        self._advance(state, _CONN_SEND_DATA, _SEND_DATA, end)
        parts, frames = h2frames.data(self._sid, view[:size], end, h2c.max_outbound_frame_size)
        state.outbound_flow_control_window -= size
        h2c.outbound_flow_control_window -= size
        conn.budget.data_sent(frames)  # the client's WINDOW_UPDATEs for these are earned
        conn.send_frames(b"".join(parts))
        return None if size == total else view[size:]

    def pump(self) -> bool:
        """Send held bytes the window and the socket queue now allow; whether any moved.

        Called by this stream's task, and by the connection (no task switch) when a
        WINDOW_UPDATE arrives or the writer drains, so held bytes move even while the
        handler waits for its upstream."""
        moved = False
        held = self._held
        while held:
            view = held[0]
            rest = self._send_now(view, self._end_held and len(held) == 1)
            sent = len(view) - (0 if rest is None else len(rest))
            self._held_bytes -= sent
            self._conn.held_bytes -= sent
            moved = moved or sent > 0 or rest is None
            if rest is not None:
                held[0] = rest
                break
            held.popleft()
        if not held:
            self._conn.holding.pop(self._sid, None)
            trailers, self._trailers_held = self._trailers_held, None
            if trailers is not None:
                self._write_headers(trailers, end_stream=True)
        return moved

    async def _room(self) -> None:
        """Past the connection's send buffer bound, wait (the caller keeps its slot) until below it."""
        conn = self._conn
        if not conn.send_room():
            await self._wait(conn.send_room)

    async def _wait(self, done: Callable[[], bool]) -> None:
        """Until `done()`, as the client makes room; reset CANCEL once nothing moved for the send timeout.

        Progress is this stream's held bytes moving; with none held (waiting for the
        connection's room), the writer handing bytes to the kernel (a slow reader behind a
        long queue is still reading). Other streams' writes are no progress for a stream
        whose own window stays shut."""
        conn = self._conn
        deadline = trio.current_time() + conn.send_timeout_s
        while not done():
            before = self._progress()
            with trio.move_on_at(deadline) as waited:
                await conn.wait_send()
            if self.pump() or self._progress() != before:
                deadline = trio.current_time() + conn.send_timeout_s
            elif waited.cancelled_caught and not done():
                conn.timed_out("stream_send", f"client took nothing for {conn.send_timeout_s:g}s; RST_STREAM CANCEL")
                self.drop_held()
                _reset(self._conn, self._sid, ErrorCodes.CANCEL)
                conn.ctx.client_gone(self._request)
                raise ClientGone("client took no response bytes within the send timeout")

    def _progress(self) -> tuple[str, int]:
        return ("held", self._held_bytes) if self._held else ("writes", self._conn.writes)


class H2Stream:
    __slots__ = ("body", "conn", "handler", "request", "scope", "sid", "sink")

    def __init__(self, conn: H2ServerConnection, sid: int, request: Request, body: H2Body, handler: Handler) -> None:
        self.conn = conn
        self.sid = sid
        self.request = request
        self.body = body
        self.sink = H2Sink(conn, self, request.method == b"HEAD")
        self.scope: trio.CancelScope | None = None  # the worker's, while it runs this stream (h2server._Worker)
        self.handler = handler

    def __repr__(self) -> str:
        return f"<H2Stream {self.sid} {self.request!r} status={self.sink.status} finished={self.sink.finished}>"

    @property
    def answered(self) -> bool:
        """The whole response was handed to h2 (a reset after this is no early reset)."""
        return self.sink.finished and not self.sink.holding

    def skip(self) -> None:
        """Reset by the client in the read that opened it: no task, no handler, no upstream request."""
        self.conn.ctx.request_done("h2", CLIENT_CLOSED, 0.0)
        self.sink.drop_held()
        self.body.release()
        self.conn.stream_done(self)

    async def run(self, scope: trio.CancelScope) -> None:
        """Handle the stream inside `scope`, its worker's: `cancel()` cancels it, and the
        Cancelled propagates from here (after the bookkeeping) to the worker, which takes a
        fresh scope (h2server._Worker: no cancel scope is entered per request)."""
        ctx = self.conn.ctx
        self.scope = scope
        try:
            await run_exchange(ctx, "h2", self.handler, self.request, self.sink, None)
            if not self.request.client_gone:
                await self.sink.deliver()
            if self.sink.finished and not self.body.complete:
                # Answered before the body ended (413, early answer): ask the client to stop sending.
                self.reset(ErrorCodes.NO_ERROR)
        except ClientGone:
            pass  # the client reset the stream or never read the response: nothing more to say
        finally:
            self.scope = None  # the worker's scope serves the next stream: never cancel it from here again
            self.sink.drop_held()
            self.body.release()
            self.conn.stream_done(self)

    def cancel(self) -> None:
        """Stop the handler at its next checkpoint (a stream not started yet never starts: client_gone)."""
        self.conn.ctx.client_gone(self.request)
        if self.scope is not None:
            self.scope.cancel()

    def peer_reset(self) -> None:
        """RST_STREAM from the client (or the connection ends): cancel the handler now."""
        if not self.sink.finished:
            self.cancel()
        self.body.fail(ClientGone("client reset the stream"))

    def reset(self, code: ErrorCodes) -> None:
        _reset(self.conn, self.sid, code)


def _reset(conn: H2ServerConnection, sid: int, code: ErrorCodes) -> None:
    """RST_STREAM(code) for stream `sid`, unless it is closed already."""
    try:
        conn.h2.reset_stream(sid, code)
    except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
        return  # already closed: nothing to reset
    conn.kick()
