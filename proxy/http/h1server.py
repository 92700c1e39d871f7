"""One HTTP/1.1 server connection, on h11: keep-alive, chunked both ways, 100-continue, HTTP/1.0.

Theory of operation: two tasks per connection, each owning one direction of the
socket, so trio never sees two receivers or two senders:

- the reader owns the receive side and h11's parser. It parses a head, hands the
  `Request` to the worker, feeds the body into the request's `H1Body` (pausing
  while more than HIGH_WATER bytes wait unread) and then keeps reading. Reading
  on after the body is what notices a client that disconnects while its request
  is handled: EOF sets `request.client_gone` and cancels the worker (and so the
  handler) at once. Bytes of a pipelined next request make h11 PAUSE; the reader
  waits for the worker to finish the cycle.
- the worker runs one exchange at a time (`run_exchange`) and owns the send side:
  the handler's `H1Sink` writes from it, `respond()` in one write.

Socket I/O goes through `sockio` (trio's semantics without its per-call yield):
between requests the reader waits for readability and then reads once; a
response is written straight into the socket when the kernel takes it whole.

Timeouts apply to the reader, with a deadline that follows the phase table
below: idle keep-alive (idle_timeout_s, then a silent close), head started
(header_timeout_s from the first byte, or from accept on a fresh connection, then
408), request in progress (none here: the handler's own deadline rules).

A response may end before the request body does (413, an early answer): the
connection then closes, after a short lingering read so that the client sees the
answer rather than a reset.

Why h11: it is the maintained sans-IO HTTP/1.1 implementation and gets framing,
100-continue, pipelining and HTTP/1.0 right. It is also the largest single cost
on this path (about a third of the server's CPU per request, see
bench/server_bench.py); httptools (llhttp) parses a head ~100x faster and is the
lever to pull if the proxy-wide throughput target needs it.
"""

from __future__ import annotations

import enum

import h11
import trio

from proxy.errors import ClientGone, ProtocolError
from proxy.http import h11events, sockio
from proxy.http.exchange import ServerContext, answer, run_exchange
from proxy.http.h1sink import HIGH_WATER, H1Body, H1Sink, error_response, reason_phrase
from proxy.http.messages import Request

RECEIVE_SIZE = 65_536
LINGER_S = 1.0  # after an early answer, read and discard this long ...
LINGER_BYTES = 1_048_576  # ... or this much, so the client reads our answer, not a reset


class Phase(enum.Enum):
    WAIT_HEAD = "wait_head"  # nothing of the next request yet
    READ_HEAD = "read_head"  # part of a head received
    IN_REQUEST = "in_request"  # head parsed, exchange running


_PHASES: dict[tuple[Phase, str], Phase] = {
    (Phase.WAIT_HEAD, "bytes"): Phase.READ_HEAD,
    (Phase.WAIT_HEAD, "head"): Phase.IN_REQUEST,
    (Phase.READ_HEAD, "head"): Phase.IN_REQUEST,
    (Phase.IN_REQUEST, "answered"): Phase.WAIT_HEAD,
}


def _next_phase(phase: Phase, event: str) -> Phase:
    try:
        return _PHASES[(phase, event)]
    except KeyError:
        raise AssertionError(f"h1 connection: no transition from {phase} on {event!r}") from None


class H1Connection:
    protocol = "http1"

    def __init__(self, ctx: ServerContext, stream: trio.SocketStream, client: str, accepted_at: float) -> None:
        self.ctx = ctx
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=ctx.limits.max_header_bytes)
        self._stream = stream
        self._io = sockio.wrap(stream)
        self._client = client
        self._phase = Phase.WAIT_HEAD
        # When the current phase times out (a plain float: see _read_in_time). A fresh
        # connection's head counts from accept; a keep-alive one waits idle_timeout_s.
        self._deadline = accepted_at + ctx.limits.header_timeout_s
        self._fresh = True
        self._request: Request | None = None
        self._body: H1Body | None = None
        # The worker's scope, for the whole connection: cancelling it is how a client that
        # hangs up stops its handler. One scope per connection rather than per request
        # (entering and leaving a cancel scope costs ~9 us): after a hang-up there is no
        # next request on this connection for the cancellation to spoil.
        self._work_scope = trio.CancelScope()
        self._sink = H1Sink(self, False)  # the current exchange's; a finished one until the first request
        self._sink.finished = True
        self._reject: tuple[int, str] | None = None
        self._reader_done = False
        self._nursery: trio.Nursery | None = None
        self.broken = False  # framing lost (aborted or interrupted write): close, never reuse
        self.requests = 0
        self.reader_lot = trio.lowlevel.ParkingLot()  # reader waits: body backpressure, PAUSED
        self._worker_lot = trio.lowlevel.ParkingLot()

    def __repr__(self) -> str:
        state = f"{self._phase.value} requests={self.requests} broken={self.broken}"
        return f"<H1Connection {self._client} {state}>"

    async def run(self, initial: bytes) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._work)
                if initial:
                    self._arrived()
                    self.h11.receive_data(initial)
                problem = await self._read_in_time()
                if problem is not None:
                    await self._answer_problem(problem)
                self._reader_done = True
                self._worker_lot.unpark()
        finally:
            await self._close()

    def drain(self) -> None:
        """Server shutdown: close now if idle; otherwise the answer says `connection: close`."""
        if self._phase is Phase.WAIT_HEAD and self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # --- reader ---
    async def _read_in_time(self) -> bytes | None:
        """Run the reader under the phase deadlines; returns an answer to send, if any.

        The phase deadline is a plain float (`_deadline`, moved at phase changes for the
        cost of a store). The scope around the reader is re-entered only when it fires, at
        the latest every min(header, idle) timeout, which is never later than a deadline
        that a phase change may set meanwhile. Moving a live scope's deadline per request
        would cost more than the rest of the reader's bookkeeping together.
        """
        limits = self.ctx.limits
        step = min(limits.header_timeout_s, limits.idle_timeout_s)
        check_at = self._deadline
        while True:
            with trio.move_on_at(check_at):
                return await self._read()  # restartable: it only waits in receive or park
            now = trio.current_time()
            if self._phase is Phase.IN_REQUEST:
                check_at = now + step
            elif now >= self._deadline:
                return self._timed_out()
            else:
                check_at = min(self._deadline, now + step)

    async def _read(self) -> bytes | None:
        conn = self.h11
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                return self._malformed(exc)
            kind = type(event)
            if event is h11.NEED_DATA:
                # Between requests the client is waiting for us: wait, then read once.
                # Inside a head or body more bytes are probably there already: read first.
                idle = self._phase is Phase.WAIT_HEAD or conn.their_state is h11.DONE
                data = await self._receive(idle)
                if not data:
                    self._eof()
                    return None
                if self._phase is Phase.WAIT_HEAD:
                    self._arrived()
                conn.receive_data(data)
            elif kind is h11.Data:
                assert self._body is not None
                if not self._body.feed(event.data):
                    return None  # past the body cap: the handler hears BodyTooLarge; stop reading
                while self._body._buffered >= HIGH_WATER:
                    await self.reader_lot.park()
            elif kind is h11.Request:
                self._begin(event)
            elif kind is h11.EndOfMessage:
                assert self._body is not None
                self._body.finish()
            elif event is h11.PAUSED:
                await self.reader_lot.park()  # the worker unparks after start_next_cycle()
            else:  # ConnectionClosed
                return None

    async def _receive(self, wait_first: bool) -> bytes:
        """Next bytes; b'' on EOF or reset."""
        try:
            return await self._io.receive(RECEIVE_SIZE, wait_first)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""  # reset by peer: as good as EOF

    def _arrived(self) -> None:
        """First bytes of a head: from now on the head has header_timeout_s to complete."""
        self._phase = _next_phase(self._phase, "bytes")
        if not self._fresh:
            self._deadline = trio.current_time() + self.ctx.limits.header_timeout_s

    def _begin(self, event: h11.Request) -> None:
        self._phase = _next_phase(self._phase, "head")
        received_at = trio.current_time()
        headers = h11events.header_list(event.headers)
        limits = self.ctx.limits
        length = host = None
        chunked = False
        head_size = len(event.target)
        for name, value in headers:  # one pass: h11 validated framing, we pick what we need
            head_size += len(name) + len(value) + 4
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"host":
                host = value
        content_length = None if chunked else int(length or 0)
        self._body = H1Body(self, content_length, limits.max_body_bytes)
        # The exchange's sink from the head on, not from when the worker starts: an EOF read
        # before then (head, part of a body and FIN in one read) must see an unfinished answer,
        # or `_eof` takes the client for gone-after-answer and the exchange waits for ever.
        self._sink = H1Sink(self, event.method == b"HEAD")
        self._reject = None
        if head_size > limits.max_header_bytes:
            self.ctx.protocol_error("h1_header_too_large", f"{head_size} byte head")
            self._reject = (431, f"request head larger than {limits.max_header_bytes} bytes")
        elif content_length is not None and content_length > limits.max_body_bytes:
            self._reject = (413, f"request body larger than {limits.max_body_bytes} bytes")
        self._request = Request(
            event.method,
            event.target,
            headers,
            self._body,
            authority=host or b"",
            http_version=event.http_version.decode(),
            client=self._client,
            received_at=received_at,
        )
        self._worker_lot.unpark()

    def _eof(self) -> None:
        request = self._request
        if request is not None and self._phase is Phase.IN_REQUEST and not self._sink.finished:
            self.ctx.client_gone(request)
            assert self._body is not None
            self._work_scope.cancel()
            self._body.fail(ClientGone("client closed the connection"))

    def _malformed(self, exc: h11.RemoteProtocolError) -> bytes | None:
        """A body error fails the body (the exchange answers); a head error is answered here."""
        message = str(exc)[:200]
        if self._phase is Phase.IN_REQUEST:
            kind = "h1_bad_chunked" if "chunk" in message else "h1_bad_body"
            self.ctx.protocol_error(kind, message)
            assert self._body is not None
            self._body.fail(ProtocolError(f"malformed request body: {message}"))
            return None
        status = exc.error_status_hint
        self.ctx.protocol_error("h1_header_too_large" if status == 431 else "h1_bad_head", message)
        return error_response(status, "request head too large" if status == 431 else message)

    def _timed_out(self) -> bytes | None:
        """Idle keep-alive: close quietly. Head started but stalled: 408, then close."""
        if self._phase is not Phase.READ_HEAD:
            return None
        self.ctx.protocol_error("header_timeout", "request head not complete in time")
        return error_response(408, "request head not received in time")

    # --- worker ---
    async def _work(self) -> None:
        with self._work_scope:  # cancelled by _eof(): the client hung up mid-exchange
            while True:
                while self._request is None:
                    if self._reader_done:
                        return
                    await self._worker_lot.park()
                await self._exchange(self._request)
                if not self._next_cycle():
                    assert self._nursery is not None
                    self._nursery.cancel_scope.cancel()
                    return

    async def _exchange(self, request: Request) -> None:
        self.requests += 1
        sink = self._sink  # made by _begin
        handler = self.ctx.handler
        if self._reject is not None:
            status, message = self._reject
            self.broken = status == 431  # the body, if any, was never framed for us: do not reuse
            handler = answer(status, message)
        await run_exchange(self.ctx, self.protocol, handler, request, sink, None)

    def _next_cycle(self) -> bool:
        """After an exchange: keep the connection for the next request, or say it must close."""
        conn = self.h11
        if self.broken or self.ctx.draining or self._request is None or self._request.client_gone:
            return False
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return False  # must close, or the request body was not read to the end
        conn.start_next_cycle()
        self._request = self._body = None
        self._fresh = False
        self._phase = _next_phase(self._phase, "answered")
        self._deadline = trio.current_time() + self.ctx.limits.idle_timeout_s
        self.reader_lot.unpark()
        return True

    async def send_continue(self) -> None:
        if self.h11.they_are_waiting_for_100_continue:
            event = h11.InformationalResponse(status_code=100, headers=[], reason=reason_phrase(100))
            await self.send(self.h11.send(event))

    async def send(self, data: bytes) -> None:
        """The worker's only way to write. A failed or interrupted write loses the framing.

        Written straight into the socket when the kernel takes it whole (sockio): no
        scheduler pass per response, and the worker finishes the cycle before the
        reader sees the client's next request (which would otherwise find h11 PAUSED).
        """
        try:
            await self._io.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.broken = True
            if self._request is not None:
                self.ctx.client_gone(self._request)
            raise ClientGone("client connection lost while sending") from exc
        except BaseException:
            self.broken = True
            raise

    async def _answer_problem(self, data: bytes) -> None:
        """The reader's own answer (400, 408, 431): only ever sent while no exchange runs."""
        try:
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _close(self) -> None:
        try:
            if self._phase is Phase.IN_REQUEST and self.h11.their_state is h11.SEND_BODY and not self.broken:
                await self._linger()
        finally:
            await self._stream.aclose()

    async def _linger(self) -> None:
        with trio.move_on_after(LINGER_S):
            try:
                await self._stream.send_eof()
                discarded = 0
                while discarded < LINGER_BYTES:
                    data = await self._stream.receive_some(RECEIVE_SIZE)
                    if not data:
                        return
                    discarded += len(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                pass
