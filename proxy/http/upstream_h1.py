"""HTTP/1.1 upstream connection: one socket and one llhttp response parser, reused request after request.

Theory of operation: `H1UpstreamConnection.open(host, port)` connects (TCP_NODELAY, as trio
sets it); `send_request(...)` writes the request and returns an `H1Response` once
the response head has arrived; the caller pulls body chunks with `receive()` as
they arrive and then `aclose()`s it. A connection whose exchange ended cleanly on
both sides (request sent whole, response complete and keep-alive) can carry the
next request; anything else (body not read to the end, `connection: close`, a
close-delimited body, a HEAD, bytes after the response, an error, a
cancellation) closes it. Heads are written by hand (`h1write`) and responses
parsed by llhttp (`h1parse.ResponseParser`, whose doc lists the framing rules);
why not h11 is in `h1parse`. The caller's task does
every read and write of the common request (a body of at most SMALL_BODY_BYTES,
sent with the head), so it costs no spawns.

Full duplex: a larger or streamed body is sent by a task in the nursery given to
`open()` (the pool's) while the caller waits for the head and reads the body.
An upstream that answers as it reads (an echo, a transcoder) stops reading once
its own writes block, so sending the whole body before reading would deadlock
both sides until the deadline. The head is still written by the caller (a stale
socket fails there with request_sent=False, so the pool's retry still works);
the sender task then writes the body. Its lifetime is inside the exchange's:
`close()` cancels it, and a connection whose sender has not finished is never
reused, so an early answer (413 before the body was read) simply ends the
exchange and closes the connection. A sender that fails other than on the
socket (the body iterator raised, a content-length mismatch) closes the socket,
which wakes the reader; the reader then raises that error rather than its own.
Send failures on the socket (the upstream closed) are left to the reader, which
may still find a complete early answer in the receive buffer. Without a nursery
(standalone use) the body is sent before reading, as HTTP/1.1 clients commonly do.

Invariants:
- a connection carries at most one request at a time (`_busy` until the cycle ends).
- `request_sent` on a raised `UpstreamError` is False only when no byte of this
  request was accepted by the kernel; the pool retries only then (a stale socket
  can fail the very first send). Sends are counted by hand (os.write, then
  `wait_writable`) because `SocketStream.send_all` does not say how much went.
- a connection is reused only when both sides are DONE and no sender task runs;
  the sender's last write and marking the request sent happen in one step (no
  checkpoint between), so a response that ends right after our last byte keeps
  the connection.
- head and a small body leave in one send (one segment, one syscall).
- reads go through `sockio`: after a request is sent the response cannot be
  there yet, so the first read waits for readability and then reads once. A socket
  whose reads keep finding nothing (an upstream streaming tokens slower than we
  relay them) waits first (sockio.SocketIO, learns=True).
- `receive()` hands over every body piece already parsed, joined: chunks that
  arrived together leave in one client write, and none waits for another.
- `is_stale()` is true when an idle connection is readable: the upstream closed
  it (EOF/RST) or sent bytes nobody asked for; either way it must not be reused.

Hand-written rather than httpcore because httpcore buffers per request in its own
pool, hides the socket (no stale-vs-sent distinction) and does not stream under
trio without anyio; this file is the thin part of that we need.
"""

from __future__ import annotations

import operator
import os
import select
from collections.abc import AsyncIterable
from typing import Any, Self

import trio

from proxy.errors import ProtocolError, UpstreamConnectError, UpstreamError, UpstreamProtocolError, UpstreamTimeout
from proxy.http import sockio
from proxy.http.h1parse import ResponseHead, ResponseParser
from proxy.http.h1write import LAST_CHUNK, FieldError, chunk, request_head
from proxy.http.messages import Headers

RECV_BYTES = 65_536
# Bodies up to this many bytes are copied behind the head and sent with it; larger
# or streamed ones go through a sender task (full duplex, module doc).
SMALL_BODY_BYTES = 65_536
_BODY_METHODS = frozenset({b"POST", b"PUT", b"PATCH"})
_BYTES_LIKE = (bytes, bytearray, memoryview)
_FRAMING_NAMES = frozenset({b"content-length", b"transfer-encoding"})
_FIRST = operator.itemgetter(0)  # a field's name
# Bound once: each is looked up per request otherwise (module attribute, then trio's re-exports).
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_write = os.write

Body = bytes | AsyncIterable[bytes]


def framed(method: bytes, headers: Headers, body: Any) -> Headers:
    """`headers` with framing that matches `body`.

    A bytes body gets its exact content-length. A streamed body keeps a caller's
    content-length (the sender then enforces the count) or else goes chunked.
    The names are looked at in C (`map(_FIRST, headers)`): the common request, a
    bodiless GET with no framing field, costs no Python loop over its fields.
    """
    if isinstance(body, _BYTES_LIKE):
        n = len(body)
        if n == 0 and method not in _BODY_METHODS and _FRAMING_NAMES.isdisjoint(map(_FIRST, headers)):
            return headers
        kept = [(k, v) for k, v in headers if k != b"content-length" and k != b"transfer-encoding"]
        kept.append((b"content-length", b"%d" % n))
        return kept
    names = set(map(_FIRST, headers))
    if b"content-length" in names and b"transfer-encoding" not in names:
        return headers
    kept = [(k, v) for k, v in headers if k != b"content-length" and k != b"transfer-encoding"]
    kept.append((b"transfer-encoding", b"chunked"))
    return kept


class H1UpstreamConnection:
    __slots__ = (
        "_busy",
        "_io",
        "_nursery",
        "_poll",
        "_rp",
        "_send_error",
        "_sender",
        "_sent_all",
        "_sent_any",
        "_sock",
        "closed",
        "idle_since",
        "label",
        "requests",
        "timed_out",
    )

    def __init__(self, sock: trio.socket.SocketType, label: str, nursery: trio.Nursery | None = None) -> None:
        self._sock = sock
        self._io = sockio.SocketIO(sock, learns=True)  # reads that learn when not to try first (sockio.SocketIO)
        self._nursery = nursery  # where body senders run; None: send bodies before reading
        self._sender: trio.CancelScope | None = None  # the running body sender's scope
        self._send_error: BaseException | None = None  # why the last sender stopped early
        # is_stale() asks this poll object, registered once: trio's is_readable() builds a
        # new one per call. It holds only the descriptor number, and is asked only while open.
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        self._rp = ResponseParser()
        self._busy = False  # a request is on this connection (sent or being sent, answer not finished)
        self._sent_all = False  # the current request left whole
        self.label = label
        self.idle_since = 0.0  # trio.current_time() when it last went idle (the pool sets it)
        self.requests = 0
        self.closed = False
        self.timed_out = False  # closed by the pool's deadline keeper
        self._sent_any = False

    @classmethod
    async def open(
        cls, host: str, port: int, *, label: str = "", nursery: trio.Nursery | None = None
    ) -> H1UpstreamConnection:
        """Connect; bounded by the caller's cancel scope. Raises UpstreamConnectError.

        With `nursery`, large and streamed request bodies are sent while the
        response is read (full duplex, module doc).
        """
        label = label or f"{host}:{port}"
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise UpstreamConnectError(f"upstream {label}: connect failed: {exc}", upstream=label) from exc
        return cls(stream.socket, label, nursery)

    def is_stale(self) -> bool:
        """True if this idle connection must not carry another request."""
        return self.closed or self._busy or bool(self._poll.poll(0))

    def deadline_passed(self) -> None:
        """The exchange's deadline (pool.DeadlineKeeper): close; the waiting caller gets UpstreamTimeout."""
        self.timed_out = True
        self.close()

    def _timeout(self) -> UpstreamTimeout:
        return UpstreamTimeout(
            f"upstream {self.label}: the request's deadline passed", upstream=self.label, request_sent=True
        )

    def close(self) -> None:
        """Close now (synchronous, so it is safe on cancellation paths)."""
        if not self.closed:
            self.closed = True
            if self._sender is not None:
                self._sender.cancel()
            self._sock.close()  # wakes a task waiting on the socket (ClosedResourceError)

    async def send_request(self, method: bytes, target: bytes, headers: Headers, body: Body = b"") -> H1Response:
        """Write the request, wait for the response head. The body is pulled with `receive()`.

        A body over SMALL_BODY_BYTES, or streamed, is still being sent when this
        returns if the connection has a nursery (full duplex, module doc).
        """
        await _checkpoint_if_cancelled()  # the writes below do not checkpoint
        if self._busy or self.closed:
            raise RuntimeError(f"{self!r} is not idle")
        self._busy = True
        self._sent_any = self._sent_all = False
        self.requests += 1
        self._rp.expect(method)
        headers = framed(method, headers, body)
        try:
            head = request_head(method, target, headers)
        except FieldError as exc:
            raise ProtocolError(f"upstream {self.label}: cannot send request: {exc}") from exc
        if isinstance(body, _BYTES_LIKE) and len(body) <= SMALL_BODY_BYTES:
            await self._write(head + body if body else head)
            self._sent_all = True
        else:
            await self._write(head)
            length = None
            for k, v in headers:
                if k == b"content-length":
                    length = int(v)
            if self._nursery is None:
                await self._send_body(body, length)
            else:
                self._start_sender(body, length)
        rp = self._rp
        wait_first = True  # the answer cannot be here yet: wait for it, then read once
        while rp.head is None:
            await self._fill(wait_first)
            wait_first = False
        return H1Response(self, rp.head)

    async def _send_body(self, body: Body, length: int | None) -> None:
        """Everything after the head; `_sent_all` is set right after the last write (no checkpoint)."""
        if isinstance(body, _BYTES_LIKE):
            await self._write(body)  # content-length framing (framed() set it)
        elif length is not None:
            left = length
            async for piece in body:
                if len(piece) > left:
                    raise ProtocolError(f"upstream {self.label}: request body longer than its content-length")
                left -= len(piece)
                if piece:
                    await self._write(piece)
            if left:
                raise ProtocolError(f"upstream {self.label}: request body shorter than its content-length")
        else:
            async for piece in body:
                if piece:
                    await self._write(chunk(piece))
            await self._write(LAST_CHUNK)
        self._sent_all = True

    def _start_sender(self, body: Body, length: int | None) -> None:
        assert self._nursery is not None
        self._sender = scope = trio.CancelScope()
        self._send_error = None
        self._nursery.start_soon(self._sender_task, scope, body, length)

    async def _sender_task(self, scope: trio.CancelScope, body: Body, length: int | None) -> None:
        """The body, sent while the caller reads the response. Never raises into the nursery."""
        with scope:
            try:
                await self._send_body(body, length)
            except UpstreamError as exc:
                self._send_error = exc  # the socket failed: the reader sees that itself (module doc)
            except Exception as exc:
                self._send_error = exc
                self.close()  # the request cannot be completed: wake the reader, abort upstream
            finally:
                self._sender = None  # same step as the last write: reuse is decided after it

    async def _write(self, data: bytes) -> None:
        sent = 0
        try:
            try:
                # A plain non-blocking write first: the kernel nearly always takes a
                # request whole, and this skips trio's post-send yield (a scheduler
                # pass per request). The rest, if any, waits for room; no yield
                # follows the last write (see the reuse invariant).
                # The stdlib socket's descriptor, not trio's fileno() wrapper (a Python call; sockio).
                sent = _write(self._sock._sock.fileno(), data)  # type: ignore[attr-defined]
            except BlockingIOError:
                pass
            if sent < len(data):
                view = memoryview(data)
                while sent < len(view):
                    if self.closed:
                        raise trio.ClosedResourceError("closed while sending")
                    await trio.lowlevel.wait_writable(self._sock)
                    try:
                        sent += os.write(self._sock.fileno(), view[sent:])
                    except BlockingIOError:
                        pass
        except (OSError, trio.ClosedResourceError) as exc:
            if self.timed_out:
                raise self._timeout() from exc
            raise UpstreamProtocolError(
                f"upstream {self.label}: send failed: {exc}",
                upstream=self.label,
                request_sent=self._sent_any or sent > 0,
            ) from exc
        finally:
            if sent:
                self._sent_any = True

    async def _fill(self, wait_first: bool) -> None:
        """Read once more and parse it; raises the upstream's error if it broke the response."""
        try:
            data = await self._io.receive(RECV_BYTES, wait_first)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            if self.timed_out:
                raise self._timeout() from exc
            if self._send_error is not None:  # the sender closed it, or the socket broke sending
                raise self._send_error from exc
            raise UpstreamProtocolError(
                f"upstream {self.label}: receive failed: {exc}", upstream=self.label, request_sent=True
            ) from exc
        rp = self._rp
        if data:
            rp.feed(data)
        else:
            rp.eof()
        if rp.error is not None:
            if not data and rp.head is None and self._send_error is not None:
                raise self._send_error
            what = "closed the connection before responding" if not data and rp.head is None else rp.error
            raise UpstreamProtocolError(f"upstream {self.label}: {what}", upstream=self.label, request_sent=True)

    def finish_cycle(self) -> bool:
        """After a complete response: get ready for the next request. False: close instead."""
        rp = self._rp
        head = rp.head
        if (
            rp.complete
            and head is not None
            and head.keep_alive
            and not rp.trailing
            and self._sent_all
            and not self.closed
            and self._sender is None
        ):
            self._busy = False
            return True
        return False

    def statistics(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "requests": self.requests,
            "closed": self.closed,
            "busy": self._busy,
            "sending": self._sender is not None,
            "response_complete": self._rp.complete,
        }

    def __repr__(self) -> str:
        state = "closed" if self.closed else "busy" if self._busy else "idle"
        sending = " sending" if self._sender is not None else ""
        return f"<H1UpstreamConnection {self.label} {state}{sending} requests={self.requests}>"


class H1Response:
    """A response being received. `owner` (the pool) is told once when it is closed."""

    __slots__ = (
        "closed",
        "complete",
        "connection",
        "deadline_entry",
        "failed",
        "headers",
        "http_version",
        "owner",
        "started_at",
        "status",
    )
    http_version: str

    def __init__(self, connection: H1UpstreamConnection, head: ResponseHead) -> None:
        self.status: int = head.status
        self.headers: Headers = head.headers  # lower-case names
        self.http_version = head.version
        self.connection = connection
        self.complete = False
        self.failed = False  # receive() raised: the upstream broke the response
        self.closed = False
        self.owner: Any = None
        self.started_at = 0.0
        self.deadline_entry: list[Any] | None = None  # the pool's deadline keeper entry, disarmed at release

    async def receive(self) -> bytes:
        """The body bytes that have arrived, as soon as there are any; b"" once the body has ended.

        Everything parsed already comes back as one piece (the chunks of a stream that arrived
        together, in one read): one client write instead of one per chunk, and no chunk waits
        for another, since only what is here is joined.
        """
        rp = self.connection._rp
        while True:
            body = rp.body
            if body:
                if len(body) == 1:
                    return body.popleft()
                data = b"".join(body)
                body.clear()
                return data
            if rp.complete:
                self.complete = True
                return b""
            if self.failed:
                raise UpstreamProtocolError(
                    f"upstream {self.connection.label}: response already failed", upstream=self.connection.label
                )
            try:
                await self.connection._fill(False)
            except UpstreamError:
                self.failed = True
                raise

    @property
    def all_received(self) -> bool:
        """Every body byte has been handed out by `receive()` and the response has ended: the next
        `receive()` returns b"" without waiting (the relay's whole-answer path)."""
        rp = self.connection._rp
        return rp.complete and not rp.body and not self.failed

    async def read(self) -> bytes:
        """The whole remaining body (for small responses and tests)."""
        rp = self.connection._rp
        if rp.complete and not self.failed:  # all here already (a small answer): no await per piece
            self.complete = True
            body = rp.body
            whole = body.popleft() if len(body) == 1 else b"".join(body)
            body.clear()
            return whole
        parts = []
        while chunk := await self.receive():
            parts.append(chunk)
        return b"".join(parts)

    def reusable(self) -> bool:
        """Ready the connection for another request if this exchange ended cleanly.

        A body the caller did not read may have arrived whole already (a 204, a
        small answer): that still ends the exchange cleanly, without I/O.
        """
        if not self.failed and self.connection._rp.complete:
            self.complete = True
        return self.complete and self.connection.finish_cycle()

    async def aclose(self) -> None:
        """Release the connection: back to the owner, or closed. Never awaits (cancel-safe)."""
        if self.closed:
            return
        self.closed = True
        if self.owner is not None:
            self.owner.release(self)
        elif not self.reusable():
            self.connection.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = "complete" if self.complete else "streaming"
        return f"<H1Response {self.status} {state} via {self.connection!r}>"
