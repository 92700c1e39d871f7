"""One HTTP/1.1 server connection, one task: read, parse, handle, write; keep-alive, pipelining, 100-continue.

Theory of operation: `run()` is the connection's only task. It first tells an
HTTP/2 prior-knowledge client from an HTTP/1.1 one (the first bytes either are
or cannot be the h2 preface; for h2 it hands them back in `h2_initial` and
leaves the socket to `h2server`). Then it loops: read, feed the parser
(`h1parse.RequestParser`, whose events come out in order), and for each request
head run the exchange in this same task (`run_exchange`): the handler reads the
body through `H1Body`, which pulls more bytes from the socket only when the
handler asks (so a body is never buffered beyond one read, and there is no
reader to pause), and writes its answer through `H1Sink`. Pipelined requests
wait in the parser's events until the one before is answered.

What two tasks per connection used to do, without the second task and its two
hand-offs per request (issue 15 measured 46 us of trio per request for them):

- timeouts: the connection tells the server's `Patrol` its phase (head due,
  idle, waiting for body bytes, running) with an O(1) call, and the patrol
  cancels the connection's one scope when a phase runs out: a stalled head gets
  408 (header_timeout_s from accept, or from the head's first byte on a kept
  connection), an idle keep-alive connection is closed quietly. A body the
  handler waits for is read under the request's own deadline and
  body_timeout_s (exchange.BufferedBody); past them the answer is 408.
- a client that hangs up mid-request: the patrol starts a watcher for requests
  still running after patrol.WATCH_AFTER_S; it waits for the socket to become
  readable and peeks: EOF or a reset sets `request.client_gone` and cancels the
  connection's scope, and with it the handler and its upstream exchange. Bytes
  (a pipelined request) end the watch. Short requests never pay for one.
- the connection limit: the patrol can pick this connection as the one to close
  to make room (`expire("evicted")`) whenever it is not running a handler.

Socket I/O goes through `sockio`: between requests the connection waits for
readability and then reads once; a response is written straight into the socket
when the kernel takes it whole.

Request bodies: on a server whose handler reads every HTTP/1.1 body whole before it
acts (`buffer_bodies`: the sidecar's data port, whose request path needs the body for
admission), a body that has not all arrived with its head is read to its end before
the handler starts (`_preread`; nginx's request buffering). Other handlers (the sim
pod, a duplex echo) get the body as it streams in. A stalled body then
costs a connection, its parser and a read, not the request path's coroutines and
objects as well: under bench.attacks' stalled_bodies (4,096 held, thousands evicted a
second) that was ~15 fewer GC-tracked objects per held connection, no handler started
or cancelled per eviction, and the normal load's p99 fell from 400-600 ms to 110-230
ms. Each read is `read_body`'s (evictable while it waits, under the request's
deadline and body_timeout_s); a timeout, a framing error or a body past the cap is
left in the body, so the handler's read answers it (408, 400, 413) as before. A
client that leaves mid-body is not answered and is not a request (as a head never
completed is not). Not for `Expect: 100-continue`: that client waits for the handler
to ask (it may answer without reading the body), and `OPTIONS *` and the 413 by
Content-Length are answered without it.

A response may end before the request body does (413, an early answer): the
connection then closes, after a short lingering read so that the client sees the
answer rather than a reset.

Framing (what h11 used to decide) is explicit: `h1parse` for requests (its module
doc lists every rule), `h1sink` for responses; why httptools rather than h11 is in
`h1parse`.
"""

from __future__ import annotations

import logging
import math
import socket

import trio

from proxy.errors import ClientGone, ProtocolError
from proxy.http import sockio
from proxy.http.exchange import ServerContext, answer, request_deadline, request_id, run_exchange
from proxy.http.h1parse import END, FramingError, RequestHead, RequestParser
from proxy.http.h1sink import HIGH_WATER, H1Body, H1Sink, error_response
from proxy.http.h1write import CONTINUE
from proxy.http.messages import Request, ResponseSink

log = logging.getLogger("rampmeter.server")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
RECEIVE_SIZE = 65_536
LINGER_S = 1.0  # after an early answer, read and discard this long ...
LINGER_BYTES = 1_048_576  # ... or this much, so the client reads our answer, not a reset
ALLOW = b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"


class Phase:
    """The connection's phases: plain strings, so that a transition's table lookup hashes in C (an Enum's
    __hash__ is a Python function, called twice per lookup, every request)."""

    DETECT = "detect"  # accepted; not yet known to be HTTP/1.1
    WAIT_HEAD = "wait_head"  # between requests (or before the first), no byte of the next yet
    READ_HEAD = "read_head"  # part of a head received
    IN_REQUEST = "in_request"  # head parsed, exchange running
    CLOSING = "closing"


_PHASES: dict[tuple[str, str], str] = {
    (Phase.DETECT, "http1"): Phase.WAIT_HEAD,
    (Phase.WAIT_HEAD, "bytes"): Phase.READ_HEAD,
    (Phase.WAIT_HEAD, "head"): Phase.IN_REQUEST,
    (Phase.READ_HEAD, "head"): Phase.IN_REQUEST,
    (Phase.IN_REQUEST, "answered"): Phase.WAIT_HEAD,
}


def _next_phase(phase: str, event: str) -> str:
    try:
        return _PHASES[(phase, event)]
    except KeyError:
        raise AssertionError(f"h1 connection: no transition from {phase} on {event!r}") from None


class H1ServerConnection:
    protocol = "http1"

    def __init__(self, ctx: ServerContext, stream: trio.abc.Stream, client: str, accepted_at: float) -> None:
        self.ctx = ctx
        self._stream = stream
        self._io = sockio.wrap(stream)
        self._sock = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._client = client
        self._parser = RequestParser(ctx.limits.max_header_bytes)
        self._phase: str = Phase.DETECT
        # The connection's one scope: the patrol cancels it when a phase runs out or to make
        # room, a watcher when the client hangs up mid-request. One per connection, never per
        # request (entering and leaving a scope costs ~17 us, patrol module doc).
        self._scope = trio.CancelScope()
        self.expired: str | None = None  # why the scope was cancelled
        self.evicted = False  # closed to make room for a newcomer (the server counts it)
        self.since = accepted_at  # kept by the patrol
        self.requests = 0
        self.broken = False  # framing lost (aborted or interrupted write, body error): close, never reuse
        self.h2_initial: bytes | None = None  # the first bytes, when they were the HTTP/2 preface
        self._detected_bytes = False
        self._head: RequestHead | None = None
        self._request: Request | None = None
        self._body: H1Body | None = None
        self._sink = H1Sink(self, False)  # the current exchange's; a finished one until the first request
        self._sink.finished = True
        self._continue_sent = False
        self._unread = b""  # bytes a watcher read from a stream it cannot peek at (tests' memory streams)
        self._watch: trio.CancelScope | None = None
        self._watch_done: trio.Event | None = None
        self._watch_wanted = 0  # the request number the patrol asked to watch
        self._reading = False  # the handler is reading the body (read_body): no watcher reads meanwhile
        self.http10 = False  # the current request is HTTP/1.0 (set per request; the sink asks)
        # trio.current_time() is three calls deep; the clock's own method (the autojump clock in tests) is one.
        self._now = trio.lowlevel.current_clock().current_time
        ctx.patrol.head_due(self, accepted_at)

    def __repr__(self) -> str:
        state = f"{self._phase} requests={self.requests} broken={self.broken}"
        return f"<H1ServerConnection {self._client} {state}>"

    @property
    def detecting(self) -> bool:
        return self._phase is Phase.DETECT

    async def run(self, initial: bytes | None = None) -> None:
        """Serve the connection: `initial` bytes first (b"": none); None: tell HTTP/2 apart first (`h2_initial`)."""
        try:
            with self._scope:
                await self._serve(initial)
            await self._after_expiry()
        finally:
            body = self._body
            # An early answer (413, or a handler that did not read): let the client read it, not a reset.
            linger = self._phase is Phase.IN_REQUEST and body is not None and not body.complete and not self.broken
            self._phase = Phase.CLOSING
            self.ctx.patrol.forget(self)
            self._stop_watch()
            try:
                if self.h2_initial is None:
                    await self._close(linger)
            finally:
                self._unlink()

    def _unlink(self) -> None:
        """Break the connection's reference cycles once it is over, so that refcounting frees it at
        once rather than the cyclic GC later: the parser and llhttp's bound callbacks, the sink and
        body and the connection, a stored body error's traceback and the body's frame. Under a
        stalled-body flood each closed connection left ~110 objects of cyclic garbage, and peak RSS
        depended on how often full GC passes ran (proxy/http/heap.py)."""
        self._parser.close()
        body = self._body
        if body is not None:
            body.discard()
        self._request = self._body = self._head = None
        del self._sink

    def drain(self) -> None:
        """Server shutdown: close now if between requests; otherwise the answer says `connection: close`.

        A head already begun is let finish (the server's drain grace), and answered with close.
        """
        if self._phase is Phase.WAIT_HEAD or (self._phase is Phase.DETECT and not self._detected_bytes):
            self.expire("drain")

    def expire(self, reason: str) -> None:
        """Patrol (or drain, or a watcher): end the connection now; `run` answers as `reason` requires."""
        if self.expired is None:
            self.expired = reason
        self._scope.cancel()

    # --- the loop ---
    async def _serve(self, initial: bytes | None) -> None:
        data = await self._detect() if initial is None else initial or await self._receive(True)
        if not data:
            return
        self._phase = _next_phase(self._phase, "http1")
        events = self._parser.events
        while True:
            self._feed(data)
            while events:
                event = events.popleft()
                if type(event) is RequestHead:
                    if not await self._exchange(event):
                        return
                elif type(event) is FramingError:
                    await self._refuse(event)
                    return
                # else: END / bytes of a body the handler did not read; never kept alive (_exchange)
            # Between requests the client is waiting for us: wait, then read once. Inside a
            # head more bytes are probably there already: read first.
            data = await self._receive(self._phase is Phase.WAIT_HEAD)
            if not data:
                return

    async def _detect(self) -> bytes:
        """The first bytes, read until they are, or cannot be, the HTTP/2 preface. b'' on EOF."""
        buf = b""
        while len(buf) < len(PREFACE) and PREFACE.startswith(buf):
            data = await self._receive(True)
            if not data:
                return b""
            buf += data
            self._detected_bytes = True
        if buf.startswith(PREFACE):
            self.h2_initial = buf
            self.ctx.patrol.forget(self)
            return b""
        return buf

    def _feed(self, data: bytes) -> None:
        parser = self._parser
        parser.feed(data)
        if parser.in_head and self._phase is Phase.WAIT_HEAD:
            self._phase = _next_phase(self._phase, "bytes")
            if self.requests:  # a kept connection: the head has header_timeout_s from its first byte
                self.ctx.patrol.head_due(self, self._now())

    async def _receive(self, wait_first: bool) -> bytes:
        """Next bytes; b'' on EOF or reset."""
        if self._unread:
            data, self._unread = self._unread, b""
            return data
        try:
            return await self._io.receive(RECEIVE_SIZE, wait_first)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""  # reset by peer: as good as EOF

    # --- one exchange ---
    async def _exchange(self, head: RequestHead) -> bool:
        """Run one request in this task; True if the connection carries on."""
        now = self._now()
        ctx = self.ctx
        # The table's lookup inline (two a request): a KeyError here is _next_phase's AssertionError.
        self._phase = _PHASES[(self._phase, "head")]
        self.requests += 1
        limits = ctx.limits
        self._head = head
        self.http10 = head.version == "1.0"
        self._continue_sent = False
        self._body = body = H1Body(self, head.content_length, limits.max_body_bytes, head.expect_continue)
        if head.content_length == 0:
            body.complete = True  # nobody waits on it yet: no wake-up to give
        else:
            self._take_body_events()
        request = self._request = Request(
            head.method,
            head.target,
            head.headers,
            body,
            authority=head.authority,
            http_version=head.version,
            client=self._client,
            received_at=now,
        )
        self._sink = sink = H1Sink(self, head.method == b"HEAD")
        handler = ctx.handler
        if head.content_length is not None and head.content_length > limits.max_body_bytes:
            handler = answer(413, f"request body larger than {limits.max_body_bytes} bytes")
        elif head.asterisk:
            handler = _options_asterisk
        elif ctx.buffer_bodies and not body.complete and not head.expect_continue:
            # The body is still on its way: read it before the handler starts (module doc, "request bodies").
            ctx.patrol.forget(self)
            if not await self._preread(body):
                return False
            now = self._now()
        ctx.patrol.running(self, self.requests, now)
        ended = await run_exchange(ctx, self.protocol, handler, request, sink, None)
        if self._watch is not None:
            self._stop_watch()
        if self._sock is None and self._watch_done is not None:
            await self._watch_done.wait()  # a memory stream's reader must be gone before we read
        # Keep the connection for the next request, or close (the one place it is decided).
        if (
            request.client_gone
            or sink.closing
            or not sink.finished
            or not body.complete
            or not head.keep_alive
            or self.broken
            or ctx.draining
        ):
            return False  # must close, or the request body was not read to the end
        self._request = self._body = self._head = None
        self._phase = _PHASES[(self._phase, "answered")]
        ctx.patrol.idle_since(self, ended)
        return True

    async def _preread(self, body: H1Body) -> bool:
        """Read `body` to its end (or its failure) before the handler starts; False if the client left meanwhile.

        Each read is `read_body`'s: evictable while it waits, under the request's deadline and
        body_timeout_s. A timeout or a framing or size error is left in the body for the handler,
        whose read answers it (408, 400, 413) as before; a client that left gets nothing.
        """
        while not body.complete and not body.failed:
            await self.read_body(body)
        request = self._request
        if request is not None and request.client_gone:
            self.broken = True  # it closed its side: no answer to let it read (no linger)
            return False
        return True

    def _take_body_events(self) -> None:
        """Move the current body's parsed pieces (and its end) from the parser into the body."""
        events, body = self._parser.events, self._body
        assert body is not None
        while events:
            event = events[0]
            kind = type(event)
            if kind is bytes:
                events.popleft()
                if not body.feed(event):
                    self.broken = True  # past the body cap: the handler hears BodyTooLarge
                    return
            elif event is END:
                events.popleft()
                body.finish()
                return
            elif kind is FramingError and event.in_body:
                events.popleft()
                self.ctx.protocol_error(event.kind, event.message, self._client)
                self.broken = True
                body.fail(ProtocolError(event.message))
                return
            else:
                return

    async def read_body(self, body: H1Body) -> None:
        """The handler wants more of the body: one read, under the request's deadline and body_timeout_s."""
        if body.deadline == math.inf:
            assert self._request is not None
            body.deadline = request_deadline(self._request.headers, self._request.received_at)
            body.timeout_s = self.ctx.limits.body_timeout_s
        # One reader at a time: while `_reading`, no watcher starts, and a running one stops
        # here first (it may have buffered what the handler wants). No await between the
        # read and the feed below, so bytes are fed in the order they were read.
        self._reading = True
        try:
            if self._watch is not None:
                done = self._watch_done
                self._stop_watch()
                if done is not None:
                    # Gone, not just told to go: a watcher woken by readability before the cancel
                    # would still read once, and feed those bytes ahead of ours.
                    await done.wait()
                if body.has_parts() or body.complete:
                    return
            patrol = self.ctx.patrol
            patrol.body_wait(self, trio.current_time())  # evictable while the client makes us wait
            data = b""
            with trio.move_on_at(body.wait_until()) as waited:
                data = await self._receive_held()
            patrol.forget(self)
            self._feed_body(body, data, waited.cancelled_caught)
        finally:
            self._reading = False
            if self._watch_wanted == self.requests and self._watch is None:
                self._restart_watch()

    async def _receive_held(self) -> bytes:
        """Body bytes the client makes us wait for: read now, or park the socket in the server's wait room
        (proxy/http/waitroom.py), so that thousands of stalled bodies dropped at once end in bounded batches,
        not all in one scheduler pass. b'' on EOF or reset."""
        sock = self._sock
        if sock is None or self._unread:
            return await self._receive(False)
        try:
            return await self.ctx.room.receive(sock, RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""  # reset by peer: as good as EOF

    def _feed_body(self, body: H1Body, data: bytes, timed_out: bool) -> None:
        if timed_out:
            self.broken = True
            body.fail(body.timed_out())
        elif not data:
            assert self._request is not None
            self.ctx.client_gone(self._request)
            body.fail(ClientGone("client closed the connection while sending the body"))
        else:
            self._parser.feed(data)
            self._take_body_events()

    def keep_alive_possible(self) -> bool:
        """Whether the answer now being written may leave the connection open (its `connection` field).

        A request body still arriving is not a reason to say close: a full-duplex handler
        answers while it reads. If it ends without reading it all, the connection closes
        after the answer all the same (`_exchange`), as h11 did.
        """
        head = self._head
        return head is not None and head.keep_alive and not self.broken and not self.ctx.draining

    async def send_continue(self) -> None:
        """`100 Continue`, once, to an HTTP/1.1 client that asked and has sent no body byte yet."""
        head, body = self._head, self._body
        if head is not None and head.expect_continue and not self._continue_sent and body is not None:
            self._continue_sent = True
            if not body.complete and body.received == 0:
                await self.send(CONTINUE)

    async def send(self, data: bytes) -> None:
        """The only way to write during an exchange. A failed or interrupted write loses the framing.

        A write that must wait for room waits until the request's deadline at most (`Request.deadline`,
        set by the handler), and while the client takes bytes at least every listen.send_timeout_s:
        a client that does not read its answer is then as good as gone. The stall bound is what
        ends a client pipelining requests the sidecar answers itself (no deadline) and never reading.
        """
        request = self._request
        try:
            deadline = math.inf if request is None else request.deadline
            await self._io.send_all(data, deadline, self.ctx.limits.send_timeout_s)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError) as exc:
            self.broken = True
            if request is not None:
                self.ctx.client_gone(request)
            what = "did not read" if isinstance(exc, trio.TooSlowError) else "lost"
            raise ClientGone(f"client connection {what} while sending") from exc
        except BaseException:
            self.broken = True
            raise

    # --- the client hanging up mid-request (started by the patrol) ---
    async def watch_peer(self, request_number: int) -> None:
        """Notice the client hanging up while request `request_number` runs; started by the patrol.

        Body complete: wait until the socket is readable and peek; EOF or a reset is a
        hang-up, bytes (a pipelined request) end the watch. Body still arriving and the
        handler not reading it: read it into the body's buffer (up to HIGH_WATER, as a
        reader task would) so that the EOF behind it is seen. A handler that asks for
        body bytes stops the watch first (`read_body`), so one task reads at a time.
        """
        if self.requests != request_number or self._body is None or self._phase is not Phase.IN_REQUEST:
            return  # finished already, or closing
        self._watch_wanted = request_number
        if self._watch is not None or self._reading:
            return  # watching already, or the handler reads (it restarts the watch when done)
        self._watch = scope = trio.CancelScope()
        self._watch_done = done = trio.Event()
        gone = False
        try:
            with scope:
                gone = await self._hung_up()
            if gone and self.requests == request_number and self._request is not None:
                self.ctx.client_gone(self._request)
                self.expire("gone")
        except Exception:  # it runs in the patrol's nursery: a bug here must not take the server down
            log.exception("watching %r failed", self)
        finally:
            done.set()
            if self._watch is scope:
                self._watch = None

    async def _hung_up(self) -> bool:
        body = self._body
        assert body is not None
        while not body.complete:
            if body.buffered >= HIGH_WATER or self._reading:
                return False  # as a reader would: stop reading, and so stop seeing the peer
            data = await self._receive(True)
            if not data:
                body.fail(ClientGone("client closed the connection while sending the body"))
                return True
            self._parser.feed(data)
            self._take_body_events()
        sock = self._sock
        if sock is None:  # a stream we cannot peek at: read, and keep what came for the loop
            data = await self._receive(True)
            self._unread += data
            return not data
        if sock.fileno() < 0:
            return False  # closed by this connection: nothing left to watch
        try:
            return not await sock.recv(1, socket.MSG_PEEK)  # waits for readability; leaves the bytes
        except trio.ClosedResourceError:
            return False
        except OSError:
            return True  # reset

    def _restart_watch(self) -> None:
        nursery = self.ctx.patrol.nursery
        if nursery is not None:
            nursery.start_soon(self.watch_peer, self.requests)

    def _stop_watch(self) -> None:
        """Before this task reads the socket again (cancelling a wait on a socket unregisters it at once)."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    # --- endings ---
    async def _refuse(self, exc: FramingError) -> None:
        """A head the parser refused (400, 431, 501, 505): answered here, then the connection closes."""
        rid = request_id()  # no request was parsed: a made one
        self.ctx.protocol_error(exc.kind, exc.message, self._client, rid)
        self._phase = Phase.CLOSING
        await self._answer_problem(error_response(exc.status, exc.message, rid))

    async def _after_expiry(self) -> None:
        """The patrol ended the connection: a head or body cut short gets 408; idle ones close quietly."""
        reason = self.expired
        if reason not in ("head", "evicted"):
            return
        cut = self._parser.in_head or (
            self._phase is Phase.IN_REQUEST and not self._sink.headers_sent and not self._body_complete()
        )
        if not cut:
            return
        kind = "header_timeout" if reason == "head" else "evicted"
        # The request's own id when its head was parsed (a body cut short), else a made one.
        rid = request_id(self._request if self._phase is Phase.IN_REQUEST else None)
        self.ctx.protocol_error(kind, "request not received in time", self._client, rid)
        self._phase = Phase.CLOSING
        self.broken = True
        await self._answer_problem(error_response(408, "request not received in time", rid))

    def _body_complete(self) -> bool:
        return self._body is not None and self._body.complete

    async def _answer_problem(self, data: bytes) -> None:
        """An answer of the connection's own (400, 408, 431): only ever sent while no exchange writes."""
        try:
            await self._io.send_all(data, math.inf, self.ctx.limits.send_timeout_s)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            pass  # the connection closes next either way

    async def _close(self, linger: bool) -> None:
        try:
            if linger:
                await self._linger()
        finally:
            await self._stream.aclose()

    async def _linger(self) -> None:
        with trio.move_on_after(LINGER_S):
            try:
                await self._stream.send_eof()  # type: ignore[attr-defined]  # a trio.SocketStream
                discarded = 0
                while discarded < LINGER_BYTES:
                    data = await self._stream.receive_some(RECEIVE_SIZE)
                    if not data:
                        return
                    discarded += len(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                pass


async def _options_asterisk(request: Request, sink: ResponseSink) -> None:
    """`OPTIONS *` asks about the server, not a resource (RFC 9110 9.3.7): the methods it serves."""
    await sink.respond(200, [(b"allow", ALLOW)], b"")
