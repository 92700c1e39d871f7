"""The HTTP/1.1 request body and response sink of one exchange (see `h1server`).

Theory of operation: `H1Body` is the shared `BufferedBody` with h1's duties: the
first read sends `100 Continue` to a client that waits for it, and waiting for
more bytes is one read of the socket by the connection (under the request's
deadline and body_timeout_s), in the handler's own task. `H1Sink` writes the handler's response as bytes built
by hand (`h1write`), choosing the framing as h11 used to:

- `respond(status, headers, body)`: head and body in one write, with the body's
  Content-Length added unless the handler gave one;
- `start()` with a Content-Length from the handler: exactly that many bytes follow
  (more raises, fewer at `end()` breaks the connection, as h11 enforced); without
  one: chunked to HTTP/1.1 clients, close-delimited to HTTP/1.0 ones;
- a response to HEAD, and a 204 or 304, carries no body bytes whatever is sent
  (HEAD keeps the Content-Length it was given; 204/304 get none added);
- Transfer-Encoding from the handler is dropped (the framing is ours);
- `connection: close` is added whenever the connection will close after this
  answer (the client asked, HTTP/1.0 without keep-alive, a close-delimited body,
  a request body not read to its end, a draining server, or the handler said
  close); `connection: keep-alive` answers an HTTP/1.0 keep-alive request.

The helpers below build the answers the server gives by itself.

Invariant: `finished` is set before the last write, so a client that reads the
whole answer and hangs up at once is not counted as gone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.http.exchange import BufferedBody
from proxy.http.h1write import LAST_CHUNK, check_fields, chunk, reason_phrase, response_head
from proxy.http.messages import HOP_BY_HOP, Headers, header_value

if TYPE_CHECKING:
    from proxy.http.h1server import H1ServerConnection

HIGH_WATER = 262_144  # body bytes a watcher buffers for a handler that is not reading (then it stops)
NO_BODY_STATUS = frozenset({204, 304})
_CONTENT_LENGTH = b"content-length"
_TRANSFER_ENCODING = b"transfer-encoding"
_CONNECTION = b"connection"
_FRAMING = frozenset({_CONTENT_LENGTH, _TRANSFER_ENCODING, _CONNECTION})
_CLOSE = (b"connection", b"close")
_KEEP_ALIVE = (b"connection", b"keep-alive")
_CHUNKED = (b"transfer-encoding", b"chunked")
# Never in a trailer section (RFC 9110 6.5.1): framing, routing and the fields the head decides.
_NOT_TRAILERS = HOP_BY_HOP | {b"content-length", b"content-type", b"host", b"content-encoding"}


class H1Body(BufferedBody):
    """A request body the connection reads when the handler asks for more (or a watcher, up to HIGH_WATER)."""

    __slots__ = ("_owner", "buffered")

    def __init__(
        self, owner: H1ServerConnection, content_length: int | None, limit: int, expect_continue: bool
    ) -> None:
        super().__init__(content_length, limit)
        self._owner = owner
        self.buffered = 0  # fed and not yet consumed
        self.first_read_wanted = expect_continue  # the first read sends 100 Continue

    def feed(self, data: bytes, flow_len: int = 0) -> bool:
        self.buffered += len(data)
        return super().feed(data, flow_len)

    def _consumed(self, size: int, flow_len: int) -> None:
        self.buffered -= size

    def has_parts(self) -> bool:
        return bool(self._parts)

    async def _first_read(self) -> None:
        await self._owner.send_continue()

    async def _wait(self) -> None:
        await self._owner.read_body(self)


class H1Sink:
    """ResponseSink for one HTTP/1.1 exchange, used by its handler in the connection's task."""

    __slots__ = (
        "_chunked",
        "_has_body",
        "_owner",
        "_remaining",
        "closing",
        "finished",
        "headers_sent",
        "status",
    )

    def __init__(self, owner: H1ServerConnection, head_request: bool) -> None:
        self._owner = owner
        self._has_body = not head_request
        self._chunked = False
        self._remaining: int | None = None  # body bytes still owed under a Content-Length
        self.headers_sent = False
        self.finished = False
        self.closing = False  # the connection closes after this answer
        self.status = 0

    async def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        data = self._head(status, headers, len(body))
        if body and self._has_body:
            data += body
        self.finished = True  # before the write: a client that reads it and hangs up is not "gone"
        await self._owner.send(data)

    async def start(self, status: int, headers: Headers) -> None:
        await self._owner.send(self._head(status, headers, None))

    async def send(self, data: bytes) -> None:
        if not self.headers_sent or self.finished:
            raise RuntimeError("send() outside a started response")
        if not data or not self._has_body:
            return
        if self._remaining is not None:
            if len(data) > self._remaining:
                self._owner.broken = True
                raise RuntimeError(f"response body longer than its content-length ({self._remaining} bytes left)")
            self._remaining -= len(data)
        elif self._chunked:
            data = chunk(data)
        await self._owner.send(data)

    async def end(self) -> None:
        if not self.headers_sent or self.finished:
            raise RuntimeError("end() outside a started response")
        self.finished = True
        if self._chunked:
            await self._owner.send(LAST_CHUNK)
        elif self._remaining:
            self._owner.broken = True  # the client waits for bytes that will never come: close
            raise RuntimeError(f"response body shorter than its content-length ({self._remaining} bytes missing)")

    async def trailers(self, fields: Headers) -> None:
        """End a streamed response with trailer fields: in the last chunk when the body is chunked and the
        client said `te: trailers` (RFC 9110 10.1.4), else dropped (the body ends as end() ends it)."""
        if not (self._chunked and self._has_body and _accepts_trailers(self._owner)):
            await self.end()
            return
        if not self.headers_sent or self.finished:
            raise RuntimeError("trailers() outside a started response")
        kept = [(k, v) for k, v in fields if k not in _NOT_TRAILERS]
        check_fields(kept)
        self.finished = True
        await self._owner.send(b"0\r\n" + b"".join([k + b": " + v + b"\r\n" for k, v in kept]) + b"\r\n")

    def abort(self) -> None:
        self._owner.broken = True

    def _head(self, status: int, headers: Headers, length: int | None) -> bytes:
        """The head bytes, with framing fields decided here (module doc)."""
        if self.headers_sent:
            raise RuntimeError("response already started")
        self.headers_sent = True
        self.status = status
        owner = self._owner
        given = None
        close = copy = False
        for name, value in headers:  # one pass; a copy only when a field of ours must go
            if name in _FRAMING:
                if name == _CONTENT_LENGTH:
                    given = value
                else:
                    copy = True
                    close = close or (name == _CONNECTION and b"close" in value.lower())
        fields = [(k, v) for k, v in headers if k != _TRANSFER_ENCODING and k != _CONNECTION] if copy else headers
        bodiless = status < 200 or status in NO_BODY_STATUS
        if bodiless:
            self._has_body = False
        elif given is not None:
            if self._has_body and length is None:
                self._remaining = int(given)
        elif length is not None:
            fields = [*fields, (_CONTENT_LENGTH, b"%d" % length)]
        elif self._has_body:
            if owner.http10:
                close = True  # close-delimited: the end of the body is the end of the connection
            else:
                self._chunked = True
                fields = [*fields, _CHUNKED]
        if close or not owner.keep_alive_possible():
            self.closing = True
            fields = [*fields, _CLOSE]
        elif owner.http10:
            fields = [*fields, _KEEP_ALIVE]
        return response_head(status, fields)


def _accepts_trailers(owner: H1ServerConnection) -> bool:
    """The current request carries `te: trailers` (looked up only when trailers are to be sent)."""
    request = owner._request  # the connection's current exchange, whose sink this is
    te = None if request is None else header_value(request.headers, b"te")
    return te is not None and b"trailers" in [t.split(b";")[0].strip().lower() for t in te.split(b",")]


def error_response(status: int, message: str, request_id: bytes) -> bytes:
    """A complete answer, then close, for a request that could not be parsed or was cut short.

    `request_id` (exchange.request_id(): a made one, or the request's own) is the answer's
    x-request-id, as on every other answer of the proxy; it is already safe to write.
    """
    body = f"{status} {message}\n".encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
        b"x-request-id: %s\r\nconnection: close\r\n\r\n%s"
        % (status, reason_phrase(status), len(body), request_id, body)
    )
