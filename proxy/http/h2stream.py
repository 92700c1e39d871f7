"""One HTTP/2 stream on the server side: its body, its response sink and its task.

Theory of operation: the connection's reader creates an `H2Stream` per accepted
HEADERS frame and starts `run()` in the connection's nursery, so streams are
handled concurrently and a slow one delays no other. The body buffer is bounded
by the stream's flow-control window: bytes are acknowledged (WINDOW_UPDATE) only
as the handler consumes them, and whatever is left unread when the stream ends is
acknowledged then, so the connection window never leaks.

The sink writes through h2 and the connection's writer (`kick()` queues h2's
output without waiting, `flush()` waits until the kernel has it). Body bytes go
out no faster than the peer's window allows: a sender with no window parks until
the reader sees WINDOW_UPDATE. h2 errors on a stream the peer reset become
`ClientGone`, so h2 never leaks past this module.

Invariant: `H2Connection.stream_done()` is called exactly once per started stream,
also on cancellation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import h2.exceptions
import trio
from h2.errors import ErrorCodes

from proxy.errors import ClientGone
from proxy.http.exchange import BufferedBody, answer, run_exchange
from proxy.http.messages import HOP_BY_HOP, Handler, Headers, Request, header_value

if TYPE_CHECKING:
    from proxy.http.h2server import H2Connection

FLUSH_BYTES = 65_536  # a streaming sender waits for the writer once this much is queued
NO_BODY_STATUS = frozenset({204, 304})
_STATUS: dict[int, bytes] = {}


def _status_bytes(status: int) -> bytes:
    value = _STATUS.get(status)
    if value is None:
        value = _STATUS[status] = str(status).encode()
    return value


def build_request(
    conn: H2Connection, sid: int, raw: list[tuple[bytes, bytes]], client: str
) -> tuple[Request, H2Body, Handler]:
    """The Request for a HEADERS frame, and who answers it: the handler, or 431/413 at once."""
    method = target = authority = b""
    scheme = b"http"
    headers: Headers = []
    size = 0
    length = None
    for name, value in raw:
        size += len(name) + len(value) + 32  # RFC 9113 6.5.2's header list size
        if name[:1] != b":":
            headers.append((name, value))
            if name == b"content-length":
                length = int(value)  # h2 validated it
            elif name == b"host" and not authority:
                authority = value
        elif name == b":method":
            method = value
        elif name == b":path":
            target = value
        elif name == b":authority":
            authority = value
        elif name == b":scheme":
            scheme = value
    ctx = conn.ctx
    limits = ctx.limits
    handler = ctx.handler
    if size > limits.max_header_bytes:
        ctx.protocol_error("h2_header_too_large", f"{size} byte header list")
        handler = answer(431, f"request header list larger than {limits.max_header_bytes} bytes")
    elif length is not None and length > limits.max_body_bytes:
        handler = answer(413, f"request body larger than {limits.max_body_bytes} bytes")
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
    return request, body, handler


class H2Body(BufferedBody):
    __slots__ = ("_conn", "_sid")

    def __init__(self, conn: H2Connection, sid: int, content_length: int | None, limit: int) -> None:
        super().__init__(content_length, limit)
        self._conn = conn
        self._sid = sid

    def _consumed(self, size: int, flow_len: int) -> None:
        self._conn.acknowledge(flow_len, self._sid)

    def release(self) -> None:
        """Acknowledge what the handler never read (the stream is over)."""
        unread = sum(flow_len for _, flow_len in self._parts)
        self._parts.clear()
        if unread:
            self._conn.acknowledge(unread, self._sid)


class H2Sink:
    """ResponseSink for one stream. Called only from that stream's task."""

    __slots__ = ("_conn", "_head_request", "_stream", "finished", "headers_sent", "status")

    def __init__(self, conn: H2Connection, stream: H2Stream, head_request: bool) -> None:
        self._conn = conn
        self._stream = stream
        self._head_request = head_request
        self.headers_sent = False
        self.finished = False
        self.status = 0

    async def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        length = len(body)  # on HEAD, content-length still says what GET would send
        if self._head_request or status in NO_BODY_STATUS:
            body = b""
        end = not body
        self._send_headers(status, headers, length, end)
        if end:
            self._conn.kick()
        else:
            await self._write(body, end_stream=True)
        self.finished = True

    async def start(self, status: int, headers: Headers) -> None:
        self._send_headers(status, headers, None, False)
        self._conn.kick()

    async def send(self, data: bytes) -> None:
        if not self.headers_sent or self.finished:
            raise RuntimeError("send() outside a started response")
        if data and not self._head_request:
            await self._write(data, end_stream=False)
            await self._conn.flush()

    async def end(self) -> None:
        if not self.headers_sent or self.finished:
            raise RuntimeError("end() outside a started response")
        self._h2_call(self._conn.h2.end_stream, self._stream.sid)
        self._conn.kick()
        self.finished = True

    def abort(self) -> None:
        self._stream.reset(ErrorCodes.INTERNAL_ERROR)

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
        self._h2_call(self._conn.h2.send_headers, self._stream.sid, out, end_stream=end)

    async def _write(self, data: bytes, end_stream: bool) -> None:
        """Queue `data` as DATA frames within the peer's window, waiting for WINDOW_UPDATE."""
        conn, sid, total, offset = self._conn, self._stream.sid, len(data), 0
        while True:
            window = self._h2_call(conn.h2.local_flow_control_window, sid)
            size = min(window, conn.h2.max_outbound_frame_size, total - offset)
            if size <= 0 and offset < total:
                conn.kick()
                await conn.wait_window()
                continue
            chunk = data if size == total else data[offset : offset + size]
            offset += size
            last = offset == total
            self._h2_call(conn.h2.send_data, sid, chunk, end_stream=end_stream and last)
            if last:
                conn.kick()
                return
            if conn.queued_bytes() >= FLUSH_BYTES:
                await conn.flush()

    def _h2_call(self, fn, *args, **kwargs):
        """Call h2; a stream or connection that is gone becomes ClientGone."""
        if self._stream.request.client_gone:
            raise ClientGone("client reset the stream")
        try:
            return fn(*args, **kwargs)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as exc:
            self._conn.ctx.client_gone(self._stream.request)
            raise ClientGone(f"stream {self._stream.sid} is closed: {exc}") from exc


class H2Stream:
    __slots__ = ("body", "conn", "handler", "request", "scope", "sid", "sink")

    def __init__(self, conn: H2Connection, sid: int, request: Request, body: H2Body, handler: Handler) -> None:
        self.conn = conn
        self.sid = sid
        self.request = request
        self.body = body
        self.sink = H2Sink(conn, self, request.method == b"HEAD")
        self.scope = trio.CancelScope()
        self.handler = handler

    def __repr__(self) -> str:
        return f"<H2Stream {self.sid} {self.request!r} status={self.sink.status} finished={self.sink.finished}>"

    async def run(self) -> None:
        try:
            await run_exchange(self.conn.ctx, "h2", self.handler, self.request, self.sink, self.scope)
            if self.sink.finished and not self.body.complete:
                # Answered before the body ended (413, early answer): ask the client to stop sending.
                self.reset(ErrorCodes.NO_ERROR)
        finally:
            self.body.release()
            self.conn.stream_done(self)

    def peer_reset(self) -> None:
        """RST_STREAM from the client: cancel the handler now."""
        if not self.sink.finished:
            self.conn.ctx.client_gone(self.request)
            self.scope.cancel()
        self.body.fail(ClientGone("client reset the stream"))

    def reset(self, code: ErrorCodes) -> None:
        try:
            self.conn.h2.reset_stream(self.sid, code)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            return  # already closed: nothing to reset
        self.conn.kick()
