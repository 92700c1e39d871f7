"""The front-end listener: HTTP/1.1 and h2c on one port, limits, graceful drain.

Theory of operation: `serve()` binds, then runs two nurseries: the inner one holds
the accept loops, the outer one every connection. A connection over
max_connections is accepted and closed at once (counted as rejected). Each
accepted connection reads its first bytes under the header timeout: the HTTP/2
connection preface (`PRI * HTTP/2.0...`, prior knowledge) selects
`h2server.H2Connection`, anything else `h1server.H1Connection`; both call the same
handler through `exchange.run_exchange`.

`shutdown(drain_timeout_s)` drains: it cancels the accept loops (closing the
listening sockets, so new connects are refused), asks every connection to drain
(h1: close when idle, `connection: close` on the answer in flight; h2: GOAWAY with
the last processed stream, then close when its streams are done), waits until no
request is in flight (or the deadline), gives connections DRAIN_GRACE_S to close on
their own, cancels what is left, and returns when `serve()` has ended. It waits for
requests, not connections: a connection that carries no request (accepted but
silent, a head half sent, a keep-alive one between requests) would otherwise hold
an idle sidecar's exit for its header or idle timeout, up to the whole drain.

Why hand-written on h11/h2 rather than hypercorn (the maintained trio server): it
serves ASGI, not this handler interface; its HTTP/2 reader awaits each stream's
consumer, so one slow request body stalls the connection; and it has no place
for our limits, client-gone cancellation or metrics. The protocol work itself is
h11's and h2's.

Invariants: `_open` counts every accepted connection until its task ends, exactly
once; a failure in one connection is logged and never reaches the accept loop.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass

import trio

from proxy.http.exchange import CLIENT, ServerContext
from proxy.http.h1server import H1Connection
from proxy.http.h2server import H2Connection
from proxy.http.messages import Handler
from proxy.policy.schema import Listen
from proxy.runtime.metrics import Metrics

log = logging.getLogger("rampmeter.server")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
RECEIVE_SIZE = 65_536
# accept() failures that mean "out of resources now", not "listener broken" (as trio's serve_listeners).
_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_RETRY_S = 0.1
# Drain: once no request is in flight, connections get this long to close by themselves
# (an h2 GOAWAY flushed, a head that was half sent completed and answered) before the cut.
DRAIN_GRACE_S = 0.5
_DRAIN_POLL_S = 0.05  # how often the drain looks at the in-flight count (a counter, not an event)


@dataclass(frozen=True)
class ServerStatistics:
    name: str
    address: str
    draining: bool
    connections_http1: int
    connections_h2: int
    connections_detecting: int  # accepted, first bytes not yet seen
    connections_accepted: int
    connections_rejected: int
    requests_in_flight: int
    requests_total: int
    client_disconnects: int
    protocol_errors: int


def parse_address(address: str) -> tuple[str | None, int]:
    """'HOST:PORT', '[::1]:PORT' or '*:PORT' -> (host or None for all interfaces, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65_535:
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (None if host in ("", "*") else host), int(port)


def format_address(sockname: tuple) -> str:
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_DEFAULT_LIMITS = Listen()


class Server:
    def __init__(
        self,
        handler: Handler,
        limits: Listen = _DEFAULT_LIMITS,
        *,
        metrics: Metrics | None = None,
        name: str = "data",
    ) -> None:
        self.name = name
        self.limits = limits
        self._ctx = ServerContext(handler, limits, metrics)
        self._address = ""
        self._connections: set[H1Connection | H2Connection] = set()
        self._open = 0
        self._detecting = 0
        self._accepted = 0
        self._accept_scope: trio.CancelScope | None = None
        self._connections_scope: trio.CancelScope | None = None
        self._acceptors_done = trio.Event()
        self._all_closed = trio.Event()
        self._stopped = trio.Event()
        self._gauges = {p: metrics.connections_open.labels(protocol=p) for p in ("http1", "h2")} if metrics else None

    @property
    def draining(self) -> bool:
        return self._ctx.draining

    def update_limits(self, limits: Listen) -> None:
        """Policy reload: new `[listen]` limits, in force from each limit's next use.

        Connections read limits only through the shared context (`ctx.limits`), so
        swapping that one object applies the body and header caps to the next request,
        the timeouts from the next phase, max_connections from the next accept, and
        what a connection fixes when it opens (h2 SETTINGS, h11's head bound) to new
        connections. The bound address is the one thing it cannot change.
        """
        self.limits = self._ctx.limits = limits

    def __repr__(self) -> str:
        state = "draining" if self.draining else "serving" if self._address else "unbound"
        return f"<Server {self.name} {self._address or '-'} {state} open={self._open}>"

    def statistics(self) -> ServerStatistics:
        ctx = self._ctx
        h2 = sum(1 for c in self._connections if isinstance(c, H2Connection))
        return ServerStatistics(
            name=self.name,
            address=self._address,
            draining=ctx.draining,
            connections_http1=len(self._connections) - h2,
            connections_h2=h2,
            connections_detecting=self._detecting,
            connections_accepted=self._accepted,
            connections_rejected=ctx.connections_rejected,
            requests_in_flight=ctx.requests_in_flight,
            requests_total=ctx.requests_total,
            client_disconnects=ctx.client_disconnects,
            protocol_errors=ctx.protocol_errors,
        )

    async def serve(self, address: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        host, port = parse_address(address)
        listeners = await trio.open_tcp_listeners(port, host=host)
        self._address = format_address(listeners[0].socket.getsockname())
        try:
            async with trio.open_nursery() as connections:
                self._connections_scope = connections.cancel_scope
                async with trio.open_nursery() as acceptors:
                    self._accept_scope = acceptors.cancel_scope
                    for listener in listeners:
                        acceptors.start_soon(self._accept_loop, listener, connections)
                    task_status.started(self._address)
                self._acceptors_done.set()
        finally:
            for listener in listeners:
                listener.socket.close()
            self._stopped.set()

    async def shutdown(self, drain_timeout_s: float) -> None:
        deadline = trio.current_time() + drain_timeout_s
        self._ctx.draining = True
        if self._accept_scope is None or self._connections_scope is None:
            return  # never served
        self._accept_scope.cancel()
        await self._acceptors_done.wait()
        for conn in list(self._connections):
            conn.drain()
        with trio.move_on_at(deadline):
            await self._quiesced()
        self._connections_scope.cancel()
        await self._stopped.wait()

    async def _quiesced(self) -> None:
        """Until every connection has closed, or no request was in flight for DRAIN_GRACE_S."""
        ctx = self._ctx
        while self._open:
            if ctx.requests_in_flight:
                await trio.sleep(_DRAIN_POLL_S)
                continue
            with trio.move_on_after(DRAIN_GRACE_S):
                await self._all_closed.wait()
            if not ctx.requests_in_flight:
                return

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        try:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                        raise
                    log.warning("accept failed (%s); retrying in %.1fs", exc, _ACCEPT_RETRY_S)
                    await trio.sleep(_ACCEPT_RETRY_S)
                    continue
                if self._open >= self.limits.max_connections:
                    self._ctx.connection_rejected(_peer(stream))
                    stream.socket.close()
                    continue
                self._open += 1
                self._accepted += 1
                nursery.start_soon(self._connection, stream)
        finally:
            listener.socket.close()  # from here on, connects are refused

    async def _connection(self, stream: trio.SocketStream) -> None:
        accepted_at = trio.current_time()
        peer = _peer(stream)  # now: once the connection failed, getpeername() may fail too
        CLIENT.set(peer)  # this task's context: the connection's tasks inherit it (log lines name the peer)
        try:
            initial = await self._first_bytes(stream, accepted_at)
            if initial:
                await self._run(stream, initial, accepted_at, peer)
        except Exception:
            # A bug (nothing a connection raises on purpose gets here): its traceback, at a
            # rate a client that can trigger it cannot raise.
            self._ctx.events.event(
                "connection_failed", "connection from %s failed", peer, level=logging.ERROR, exc_info=True
            )
        finally:
            stream.socket.close()
            self._open -= 1
            if not self._open and self._ctx.draining:
                self._all_closed.set()

    async def _first_bytes(self, stream: trio.SocketStream, accepted_at: float) -> bytes:
        """Read until the bytes are, or cannot be, the HTTP/2 preface. b'' when nothing came in time."""
        self._detecting += 1
        buf = b""
        try:
            with trio.move_on_at(accepted_at + self.limits.header_timeout_s):
                while len(buf) < len(PREFACE) and PREFACE.startswith(buf):
                    data = await stream.receive_some(RECEIVE_SIZE)
                    if not data:
                        return b""
                    buf += data
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""
        finally:
            self._detecting -= 1
        return buf

    async def _run(self, stream: trio.SocketStream, initial: bytes, accepted_at: float, peer: str) -> None:
        kind = H2Connection if initial.startswith(PREFACE) else H1Connection
        conn = kind(self._ctx, stream, peer, accepted_at)
        self._connections.add(conn)
        gauge = self._gauges[conn.protocol] if self._gauges else None
        if gauge is not None:
            gauge.inc()
        try:
            await conn.run(initial)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("connection %r lost: %s", conn, exc)
        finally:
            self._connections.discard(conn)
            if gauge is not None:
                gauge.dec()


def _peer(stream: trio.SocketStream) -> str:
    try:
        return stream.socket.getpeername()[0]
    except OSError:
        return ""
