"""The HTTP/1.1 request body and response sink of one exchange (see `h1server`).

Theory of operation: `H1Body` is the shared `BufferedBody` with h1's two duties:
the first read sends `100 Continue` to a client that waits for it, and consuming
bytes lets a reader paused at HIGH_WATER go on. `H1Sink` turns the handler's calls
into h11 events and hands the bytes to the connection's one writer: `respond()`
is head, body and end in a single `send_all`; `start()` without content-length
is chunked for HTTP/1.1 clients and close-delimited for HTTP/1.0 ones (h11
decides). The helpers below build the answers the server gives by itself.

Invariant: `finished` is set before the last write, so a client that reads the
whole answer and hangs up at once is not counted as gone.
"""

from __future__ import annotations

import http
from typing import TYPE_CHECKING

import h11

from proxy.http import h11events
from proxy.http.exchange import BufferedBody
from proxy.http.messages import Headers, header_value

if TYPE_CHECKING:
    from proxy.http.h1server import H1Connection

HIGH_WATER = 262_144  # unread body bytes at which the reader stops reading
NO_BODY_STATUS = frozenset({204, 304})


class H1Body(BufferedBody):
    __slots__ = ("_buffered", "_owner")

    def __init__(self, owner: H1Connection, content_length: int | None, limit: int) -> None:
        super().__init__(content_length, limit)
        self._owner = owner
        self._buffered = 0

    def feed(self, data: bytes, flow_len: int = 0) -> bool:
        self._buffered += len(data)
        return super().feed(data, flow_len)

    async def _first_read(self) -> None:
        await self._owner.send_continue()

    def _consumed(self, size: int, flow_len: int) -> None:
        self._buffered -= size
        if self._buffered < HIGH_WATER:
            self._owner.reader_lot.unpark()


class H1Sink:
    """ResponseSink over h11. Used by one handler from the worker task."""

    __slots__ = ("_head_request", "_owner", "finished", "headers_sent", "status")

    def __init__(self, owner: H1Connection, head_request: bool) -> None:
        self._owner = owner
        self._head_request = head_request
        self.headers_sent = False
        self.finished = False
        self.status = 0

    async def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        conn = self._owner.h11
        headers = self._head(status, headers, len(body))
        data = conn.send(h11events.response(status, headers, reason_phrase(status)))
        if body and not self._head_request and status not in NO_BODY_STATUS:
            data += conn.send(h11.Data(data=body))
        data += conn.send(h11events.END)
        self.finished = True  # before the write: a client that reads it and hangs up is not "gone"
        await self._owner.send(data)

    async def start(self, status: int, headers: Headers) -> None:
        headers = self._head(status, headers, None)
        response = h11events.response(status, headers, reason_phrase(status))
        await self._owner.send(self._owner.h11.send(response))

    async def send(self, data: bytes) -> None:
        if not self.headers_sent or self.finished:
            raise RuntimeError("send() outside a started response")
        if data and not self._head_request:
            await self._owner.send(self._owner.h11.send(h11.Data(data=data)))

    async def end(self) -> None:
        if not self.headers_sent or self.finished:
            raise RuntimeError("end() outside a started response")
        self.finished = True
        await self._owner.send(self._owner.h11.send(h11events.END))

    def abort(self) -> None:
        self._owner.broken = True

    def _head(self, status: int, headers: Headers, length: int | None) -> Headers:
        if self.headers_sent:
            raise RuntimeError("response already started")
        self.headers_sent = True
        self.status = status
        if (
            length is not None
            and status >= 200
            and status not in NO_BODY_STATUS
            and header_value(headers, b"content-length") is None
        ):
            headers = [*headers, (b"content-length", str(length).encode())]
        if self._owner.ctx.draining:
            headers = [*headers, (b"connection", b"close")]
        return headers


_REASON_CACHE: dict[int, bytes] = {}


def reason_phrase(status: int) -> bytes:
    """The standard reason phrase (some clients, h2load among them, need one to see the status)."""
    reason = _REASON_CACHE.get(status)
    if reason is None:
        try:
            reason = http.HTTPStatus(status).phrase.encode()
        except ValueError:
            reason = b""
        _REASON_CACHE[status] = reason
    return reason


def error_response(status: int, message: str) -> bytes:
    """A complete close-delimited answer for a request h11 could not parse."""
    body = f"{status} {message}\n".encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (status, reason_phrase(status), len(body), body)
    )
