"""HTTP/1.1 upstream connection: one socket and one h11 state machine, reused request after request.

Theory of operation: `H1Connection.open(host, port)` connects (TCP_NODELAY, as trio
sets it); `send_request(...)` writes the request and returns an `H1Response` once
the response head has arrived; the caller pulls body chunks with `receive()` as
they arrive and then `aclose()`s it. A connection whose exchange ended cleanly on
both sides is reset with h11's `start_next_cycle()` and can carry the next
request; anything else (body not read to the end, `connection: close`, bytes
after the response, an error, a cancellation) closes it. The caller's task does
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
- a connection carries at most one request at a time (h11 enforces it).
- `request_sent` on a raised `UpstreamError` is False only when no byte of this
  request was accepted by the kernel; the pool retries only then (a stale socket
  can fail the very first send). Sends are counted by hand (os.write, then
  `wait_writable`) because `SocketStream.send_all` does not say how much went.
- a connection is reused only when both sides are DONE and no sender task runs;
  the sender's last write and its h11 END happen in one step (no checkpoint
  between), so a response that ends right after our last byte keeps the connection.
- head and a small body leave in one send (one segment, one syscall).
- reads go through `sockio`: after a request is sent the response cannot be
  there yet, so the first read waits for readability and then reads once.
- `is_stale()` is true when an idle connection is readable: the upstream closed
  it (EOF/RST) or sent bytes nobody asked for; either way it must not be reused.

Hand-written rather than httpcore because httpcore buffers per request in its own
pool, hides the socket (no stale-vs-sent distinction) and does not stream under
trio without anyio; this file is the thin part of that we need.
"""

from __future__ import annotations

import os
import select
from collections.abc import AsyncIterable
from typing import Any, Self

import h11
import trio

from proxy.errors import ProtocolError, UpstreamConnectError, UpstreamError, UpstreamProtocolError
from proxy.http import h11events, sockio
from proxy.http.messages import Headers

RECV_BYTES = 65_536
# Bodies up to this many bytes are copied behind the head and sent with it; larger
# or streamed ones go through a sender task (full duplex, module doc).
SMALL_BODY_BYTES = 65_536
_BODY_METHODS = frozenset({b"POST", b"PUT", b"PATCH"})
_BYTES_LIKE = (bytes, bytearray, memoryview)

Body = bytes | AsyncIterable[bytes]


def framed(method: bytes, headers: Headers, body: Any) -> Headers:
    """`headers` with framing that matches `body`.

    A bytes body gets its exact content-length. A streamed body keeps a caller's
    content-length (h11 then enforces the count) or else goes chunked.
    """
    has_cl = has_te = False
    for k, _ in headers:
        if k == b"content-length":
            has_cl = True
        elif k == b"transfer-encoding":
            has_te = True
    if isinstance(body, _BYTES_LIKE):
        n = len(body)
        if not has_cl and not has_te and (n == 0 and method not in _BODY_METHODS):
            return headers
        kept = [(k, v) for k, v in headers if k != b"content-length" and k != b"transfer-encoding"]
        kept.append((b"content-length", b"%d" % n))
        return kept
    if has_cl and not has_te:
        return headers
    kept = [(k, v) for k, v in headers if k != b"content-length" and k != b"transfer-encoding"]
    kept.append((b"transfer-encoding", b"chunked"))
    return kept


class H1Connection:
    __slots__ = (
        "_h11",
        "_nursery",
        "_poll",
        "_send_error",
        "_sender",
        "_sent_any",
        "_sock",
        "closed",
        "idle_since",
        "label",
        "requests",
    )

    def __init__(self, sock: trio.socket.SocketType, label: str, nursery: trio.Nursery | None = None) -> None:
        self._sock = sock
        self._nursery = nursery  # where body senders run; None: send bodies before reading
        self._sender: trio.CancelScope | None = None  # the running body sender's scope
        self._send_error: BaseException | None = None  # why the last sender stopped early
        # is_stale() asks this poll object, registered once: trio's is_readable() builds a
        # new one per call. It holds only the descriptor number, and is asked only while open.
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        self._h11 = h11.Connection(h11.CLIENT)
        self.label = label
        self.idle_since = 0.0  # trio.current_time() when it last went idle (the pool sets it)
        self.requests = 0
        self.closed = False
        self._sent_any = False

    @classmethod
    async def open(cls, host: str, port: int, *, label: str = "", nursery: trio.Nursery | None = None) -> H1Connection:
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
        return self.closed or self._h11.our_state is not h11.IDLE or bool(self._poll.poll(0))

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
        await trio.lowlevel.checkpoint_if_cancelled()  # the writes below do not checkpoint
        h = self._h11
        self._sent_any = False
        self.requests += 1
        try:
            head = h.send(h11events.request(method, target, framed(method, headers, body)))
            if isinstance(body, _BYTES_LIKE) and len(body) <= SMALL_BODY_BYTES:
                if body:
                    head += h.send(h11.Data(data=body))
                await self._write(head + h.send(h11events.END))
            else:
                await self._write(head)
                if self._nursery is None:
                    await self._send_body(body)
                else:
                    self._start_sender(body)
        except h11.LocalProtocolError as exc:
            raise ProtocolError(f"upstream {self.label}: cannot send request: {exc}") from exc
        wait_first = True  # the answer cannot be here yet: wait for it, then read once
        while True:
            event = await self._next_event(wait_first)
            wait_first = False
            if type(event) is h11.Response:
                return H1Response(self, event)
            if type(event) is not h11.InformationalResponse:  # 1xx are skipped
                raise self._send_error or UpstreamProtocolError(
                    f"upstream {self.label} closed the connection before responding",
                    upstream=self.label,
                    request_sent=True,
                )

    async def _send_body(self, body: Body) -> None:
        """Everything after the head. For bytes, h11's END comes right after the last write (no checkpoint)."""
        h = self._h11
        if isinstance(body, _BYTES_LIKE):
            for piece in h.send_with_data_passthrough(h11.Data(data=body)) or ():
                await self._write(piece)
            h.send(h11events.END)  # content-length framing: nothing more to write
        else:
            async for chunk in body:
                if chunk:
                    await self._write(h.send(h11.Data(data=chunk)))
            await self._write(h.send(h11events.END))

    def _start_sender(self, body: Body) -> None:
        assert self._nursery is not None
        self._sender = scope = trio.CancelScope()
        self._send_error = None
        self._nursery.start_soon(self._sender_task, scope, body)

    async def _sender_task(self, scope: trio.CancelScope, body: Body) -> None:
        """The body, sent while the caller reads the response. Never raises into the nursery."""
        with scope:
            try:
                await self._send_body(body)
            except UpstreamError as exc:
                self._send_error = exc  # the socket failed: the reader sees that itself (module doc)
            except Exception as exc:
                if isinstance(exc, h11.LocalProtocolError):
                    exc = ProtocolError(f"upstream {self.label}: cannot send request: {exc}")
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
                sent = os.write(self._sock.fileno(), data)
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
            raise UpstreamProtocolError(
                f"upstream {self.label}: send failed: {exc}",
                upstream=self.label,
                request_sent=self._sent_any or sent > 0,
            ) from exc
        finally:
            if sent:
                self._sent_any = True

    async def _next_event(self, wait_first: bool = False) -> Any:
        h = self._h11
        while True:
            try:
                event = h.next_event()
            except h11.RemoteProtocolError as exc:
                raise UpstreamProtocolError(
                    f"upstream {self.label}: bad response: {exc}", upstream=self.label, request_sent=True
                ) from exc
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await sockio.receive(self._sock, RECV_BYTES, wait_first)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                if self._send_error is not None:  # the sender closed it, or the socket broke sending
                    raise self._send_error from exc
                raise UpstreamProtocolError(
                    f"upstream {self.label}: receive failed: {exc}", upstream=self.label, request_sent=True
                ) from exc
            wait_first = False
            h.receive_data(data)  # b"" records EOF; h11 decides what it means

    def finish_cycle(self) -> bool:
        """After a complete response: get ready for the next request. False: close instead."""
        h = self._h11
        if (
            h.our_state is h11.DONE
            and h.their_state is h11.DONE
            and not h.trailing_data[0]
            and not self.closed
            and self._sender is None
        ):
            h.start_next_cycle()
            return True
        return False

    def statistics(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "requests": self.requests,
            "closed": self.closed,
            "sending": self._sender is not None,
            "our_state": str(self._h11.our_state),
            "their_state": str(self._h11.their_state),
        }

    def __repr__(self) -> str:
        state = "closed" if self.closed else self._h11.our_state.__name__.lower()
        sending = " sending" if self._sender is not None else ""
        return f"<H1Connection {self.label} {state}{sending} requests={self.requests}>"


class H1Response:
    """A response being received. `owner` (the pool) is told once when it is closed."""

    __slots__ = (
        "closed",
        "complete",
        "connection",
        "failed",
        "headers",
        "http_version",
        "owner",
        "started_at",
        "status",
    )
    http_version: str

    def __init__(self, connection: H1Connection, event: h11.Response) -> None:
        self.status: int = event.status_code
        self.headers: Headers = h11events.header_list(event.headers)  # lower-case names
        self.http_version = event.http_version.decode("ascii")
        self.connection = connection
        self.complete = False
        self.failed = False  # receive() raised: the upstream broke the response
        self.closed = False
        self.owner: Any = None
        self.started_at = 0.0

    async def receive(self) -> bytes:
        """Next body chunk as it arrived; b"" once the body has ended."""
        if self.complete:
            return b""
        try:
            event = await self.connection._next_event()
        except UpstreamProtocolError:
            self.failed = True
            raise
        if type(event) is h11.Data:
            return bytes(event.data)
        if type(event) is h11.EndOfMessage:
            self.complete = True
            return b""
        self.failed = True
        raise UpstreamProtocolError(
            f"upstream {self.connection.label}: unexpected {type(event).__name__} in body",
            upstream=self.connection.label,
            request_sent=True,
        )

    async def read(self) -> bytes:
        """The whole remaining body (for small responses and tests)."""
        parts = []
        while chunk := await self.receive():
            parts.append(chunk)
        return b"".join(parts)

    def reusable(self) -> bool:
        """Ready the connection for another request if this exchange ended cleanly.

        A body the caller did not read may already sit in h11's buffer whole (a
        204, a small answer): finish it without I/O rather than lose the connection.
        """
        h = self.connection._h11
        try:
            while not self.complete and not self.failed:
                event = h.next_event()
                if type(event) is h11.EndOfMessage:
                    self.complete = True
                elif type(event) is not h11.Data:
                    break  # NEED_DATA: the rest is still on the wire
        except h11.RemoteProtocolError:
            return False
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
