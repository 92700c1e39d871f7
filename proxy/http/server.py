"""The front-end listener: HTTP/1.1 and h2c on one port, limits, graceful drain.

Theory of operation: `serve()` binds, then runs two nurseries: the inner one holds
the accept loops, the outer one every connection and the server's `Patrol`
(phase deadlines, eviction, hung-up clients: proxy/http/patrol.py). Each accepted
connection starts as an `h1server.H1ServerConnection`, which reads its first bytes
under the header timeout (from accept): the HTTP/2 connection preface (`PRI *
HTTP/2.0...`, prior knowledge) hands the connection to `h2server.H2ServerConnection`,
anything else is served as HTTP/1.1; both call the same handler through
`exchange.run_exchange`.

The connection limit keeps headroom for newcomers: at max_connections a new
connection is still accepted, and the patrol's victim (the connection whose last
sign of life is oldest: a stalled head or body, the longest-idle keep-alive
connection) is closed to make room. Only when every connection is running a
request (or is HTTP/2) is the newcomer closed at once (counted as rejected).
Thousands of stalled bodies then cost the attacker their own connections, not
everyone else's.

Fairness between established and new connections (accept priority): after each
accept, the accept loop takes the next connection only once the event loop has
nothing else to run (every other task waits for I/O or a timer; trio's runner tells,
`trio.testing.wait_all_tasks_blocked`), or after ACCEPT_DEFER_MAX_S at the latest.
New connections are work the sidecar has not taken on yet: while established
connections have work (requests to read, answers to write, upstream replies),
newcomers wait in the kernel's listen backlog rather than in the loop's passes. An
accepted connection costs work over its next few passes (its first read and parse,
its handler starting, the victim it evicts answering 408 and closing: ~0.7 ms of CPU
in all for a stalled body, ~0.2 ms for a request answered 400 and closed), and each
of the many passes an established request goes through (read, admission, upstream
send and reply, answer) waited for whatever accepts had started. A client that
opens connections as fast as the sidecar accepts them (a reconnecting flood, a
stalled-body attacker at the connection limit) thus gets the loop's idle time, not
a share of every pass. With nothing else ready the wait is one poll of the loop
(microseconds). The floor: with the loop busy without a pause (a saturated core),
each listener still accepts one connection per ACCEPT_DEFER_MAX_S, so newcomers are
never shut out. This is Envoy's overload action `stop_accepting_connections`
(newcomers queue in the kernel while the process is overloaded) with "overloaded"
read from the loop itself, and nginx's `multi_accept off` (one accept per loop
pass). The cost is a newcomer's wait while the loop is busy: behind the attacker's
connections queued in the backlog (docs/security.md gives the figures). The admin
port does not defer (`defer_accepts=False`): its probes open a connection each.

At the connection limit every accept also closes a connection to make room (below),
and a client holding stalled connections refills what it loses as fast as it is
accepted: 4,000 connections a second opened, parsed, evicted and closed under
bench.attacks' stalled_bodies, whose Python objects (~65 GC-tracked per held
connection, 4,096 held) kept the cyclic GC's young and middle passes at 50-160 ms.
So there the next accept waits until the loop has been idle for EVICT_IDLE_S (it has
time to spare), EVICT_DEFER_MAX_S at most: evictions take ~110 a second under that
attack instead of ~4,000, and a newcomer waits in the backlog behind the attacker's
queued connects for that much longer (docs/security.md gives the figures).
The accept itself is the socket's own non-blocking accept(): trio's wrapper adds
two scheduler passes and a context manager per connection.

The limit itself is held to the open-file limit at start (`fd_cap`): the data
port's connections must leave descriptors for the upstream pool, the admin port
and the process's own files, or at the limit accept() fails for every listener
at once (the admin port's /healthz included). RLIMIT_NOFILE's soft limit is
raised to the hard one first (as Go's runtime does); what still does not fit
lowers max_connections, said in one line at start. accept() failures are logged
rate-limited (a client controls their rate).

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
import resource
import socket
from dataclasses import dataclass
from typing import Any

import trio
from trio.testing import wait_all_tasks_blocked  # the runner's own idle test (module doc, accept priority)

from proxy.errors import StartupError
from proxy.http import heap
from proxy.http.exchange import CLIENT, ServerContext
from proxy.http.h1server import PREFACE, H1ServerConnection
from proxy.http.h2server import H2ServerConnection
from proxy.http.messages import Handler
from proxy.http.ratelog import RateLimitedLog
from proxy.metrics import Metrics
from proxy.policy.schema import Listen

log = logging.getLogger("rampmeter.server")

__all__ = ["PREFACE", "Server", "ServerStatistics", "fd_cap", "format_address", "parse_address"]

# accept() failures that mean "out of resources now", not "listener broken" (as trio's serve_listeners).
_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_RETRY_S = 0.1
# Drain: once no request is in flight, connections get this long to close by themselves
# (an h2 GOAWAY flushed, a head that was half sent completed and answered) before the cut.
DRAIN_GRACE_S = 0.5
_DRAIN_POLL_S = 0.05  # how often the drain looks at the in-flight count (a counter, not an event)
# Accept priority (module doc): the next accept waits until the loop has nothing else to run, this long at most
# (with the loop never idle, one accept per listener per interval: newcomers are slowed, never shut out).
ACCEPT_DEFER_MAX_S = 0.01
# At the connection limit an accept evicts a connection (module doc): the next one waits until the loop has been idle
# this long, EVICT_DEFER_MAX_S at most (with the loop never idle that long, 10 evictions a second per listener).
EVICT_IDLE_S = 0.001
EVICT_DEFER_MAX_S = 0.1
FD_BASE_RESERVE = 64  # listeners, log files, the dedup store, probes and GPU sampling: the process's own


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
    connections_evicted: int
    accepts_forced: int  # accepts made at the floor: the loop had not gone idle for ACCEPT_DEFER_MAX_S
    max_connections: int  # in force: listen.max_connections, or less where the open-file limit says so
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


def format_address(sockname: tuple[Any, ...]) -> str:
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def fd_cap(max_connections: int, reserve: int, nofile: tuple[int, int]) -> tuple[int, str | None]:
    """max_connections that fits under the open-file limit `nofile` (soft, hard) after `reserve`; and why, if lowered.

    Pure: the caller raises the soft limit to the hard one first and passes the result.
    """
    soft = nofile[0]
    if soft == resource.RLIM_INFINITY or max_connections + reserve <= soft:
        return max_connections, None
    fits = soft - reserve
    if fits < 1:
        return 0, (
            f"the open-file limit ({soft}) leaves no room for client connections after {reserve} kept for "
            "upstream connections, the admin port and the process: raise `ulimit -n` or lower "
            "upstreams.max_connections"
        )
    return fits, (
        f"listen.max_connections {max_connections} does not fit the open-file limit ({soft}, `ulimit -n`) with "
        f"{reserve} descriptors kept for upstream connections, the admin port and the process: serving at most "
        f"{fits} client connections"
    )


def _raise_nofile() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE raised to the hard limit (what is allowed without privileges); returns (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft, hard


_DEFAULT_LIMITS = Listen()


class Server:
    def __init__(
        self,
        handler: Handler,
        limits: Listen = _DEFAULT_LIMITS,
        *,
        metrics: Metrics | None = None,
        name: str = "data",
        fd_reserve: int | None = None,
        defer_accepts: bool = True,
        buffer_bodies: bool = False,
    ) -> None:
        """`fd_reserve`: descriptors to keep free beside this server's connections (None: no fd check).
        `defer_accepts`: accept at the loop's idle time (module doc, accept priority); off for the admin port.
        `buffer_bodies`: the handler reads each HTTP/1.1 body whole first, so the connection reads a body still
        arriving before the handler starts (proxy/http/h1server.py, "request bodies"; the sidecar's data port)."""
        self.name = name
        self._defer_accepts = defer_accepts
        self.accepts_forced = 0  # accepts made at the floor: the loop had not gone idle for ACCEPT_DEFER_MAX_S
        self._ctx = ServerContext(handler, limits, metrics, buffer_bodies=buffer_bodies)
        self._fd_reserve = fd_reserve
        self._fd_cap: int | None = None  # set at serve() when the open-file limit lowers max_connections
        self._address = ""
        self._connections: set[H1ServerConnection | H2ServerConnection] = set()
        self._open = 0
        self._evicting = 0  # evicted, not yet closed: their slots are as good as free
        self._evicted = 0
        self._accepted = 0
        self._accept_log = RateLimitedLog(log)
        self._accept_scope: trio.CancelScope | None = None
        self._connections_scope: trio.CancelScope | None = None
        self._acceptors_done = trio.Event()
        self._all_closed = trio.Event()
        self._stopped = trio.Event()
        self._gauges = {p: metrics.connections_open.labels(protocol=p) for p in ("http1", "h2")} if metrics else None

    @property
    def limits(self) -> Listen:
        return self._ctx.limits

    @limits.setter
    def limits(self, limits: Listen) -> None:
        self.update_limits(limits)  # a reload of listen.* (what applies live does so there)

    def update_limits(self, limits: Listen) -> None:
        """Policy reload: new `[listen]` limits, in force from each limit's next use.

        Connections and the patrol read limits only through the shared context
        (`ctx.limits`), so swapping that one object applies the body and header caps to
        the next request, the timeouts from the next phase, max_connections from the
        next accept (still held to the open-file cap found at start), and what a
        connection fixes when it opens (h2 SETTINGS) to new connections. The bound
        address is the one thing it cannot change.
        """
        self._ctx.limits = limits
        self._ctx.patrol.wake()  # it sleeps until the next deadline under the old timeouts

    @property
    def max_connections(self) -> int:
        limit = self._ctx.limits.max_connections
        return limit if self._fd_cap is None else min(limit, self._fd_cap)

    @property
    def draining(self) -> bool:
        return self._ctx.draining

    def __repr__(self) -> str:
        state = "draining" if self.draining else "serving" if self._address else "unbound"
        return f"<Server {self.name} {self._address or '-'} {state} open={self._open}>"

    def statistics(self) -> ServerStatistics:
        ctx = self._ctx
        h2 = sum(1 for c in self._connections if isinstance(c, H2ServerConnection))
        detecting = sum(1 for c in self._connections if isinstance(c, H1ServerConnection) and c.detecting)
        return ServerStatistics(
            name=self.name,
            address=self._address,
            draining=ctx.draining,
            connections_http1=len(self._connections) - h2 - detecting,
            connections_h2=h2,
            connections_detecting=detecting,
            connections_accepted=self._accepted,
            connections_rejected=ctx.connections_rejected,
            connections_evicted=self._evicted,
            accepts_forced=self.accepts_forced,
            max_connections=self.max_connections,
            requests_in_flight=ctx.requests_in_flight,
            requests_total=ctx.requests_total,
            client_disconnects=ctx.client_disconnects,
            protocol_errors=ctx.protocol_errors,
        )

    async def serve(
        self, address: str, *, reuse_port: bool = False, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Bind `address` and serve until cancelled or shut down.

        `reuse_port`: bind with SO_REUSEPORT, so several processes share the port and the
        kernel spreads connections over them (bench/workers.py measures it; admission is
        per process, see docs/multicore.md, so the sidecar itself does not offer it).
        """
        if self._fd_reserve is not None:
            cap, why = fd_cap(self._ctx.limits.max_connections, self._fd_reserve, _raise_nofile())
            if why is not None:
                if cap < 1:
                    raise StartupError(why)
                log.warning("%s", why)
                self._fd_cap = cap
        self._ctx.now = trio.lowlevel.current_clock().current_time  # type: ignore[method-assign]  # ServerContext.now
        host, port = parse_address(address)
        listeners = await (_reuse_port_listener(host, port) if reuse_port else trio.open_tcp_listeners(port, host=host))
        self._address = format_address(listeners[0].socket.getsockname())
        try:
            async with trio.open_nursery() as connections:
                self._connections_scope = connections.cancel_scope
                await connections.start(self._ctx.patrol.run)
                await connections.start(self._ctx.room.run)
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
        # The stdlib socket under trio's (trio offers no public accessor); a stand-in listener
        # without one (tests) goes through trio's accept().
        raw = getattr(listener.socket, "_sock", None)
        try:
            while True:
                try:
                    stream, peer = await (_accept(listener) if raw is None else _accept_now(raw))
                except OSError as exc:
                    if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                        raise
                    self._accept_log.event(
                        "accept_failed", "%s: accept failed (%s); retrying in %.1fs", self.name, exc, _ACCEPT_RETRY_S
                    )
                    await trio.sleep(_ACCEPT_RETRY_S)
                    continue
                if self._open - self._evicting >= self.max_connections and not self._make_room():
                    self._ctx.connection_rejected(peer)
                    stream.socket.close()
                    continue
                self._open += 1
                self._accepted += 1
                nursery.start_soon(self._connection, stream, peer)
                if self._defer_accepts:
                    await self._idle_loop()
                heap.accepted(self._open)  # in a flood, a young pass every heap.SWEEP_ACCEPTS accepts (heap.py)
        finally:
            listener.socket.close()  # from here on, connects are refused

    async def _idle_loop(self) -> None:
        """Until the event loop has nothing else to run, ACCEPT_DEFER_MAX_S at most (module doc, accept priority);
        at the connection limit, until it has had nothing to run for EVICT_IDLE_S, EVICT_DEFER_MAX_S at most.

        Only after an accept: the next one may be waiting already. With none waiting the accept loop then
        waits for the listener's readability as before, so an idle sidecar polls nothing.
        """
        if self._open - self._evicting < self.max_connections:
            idle_s, most_s = 0.0, ACCEPT_DEFER_MAX_S
        else:  # the next accept closes a connection to make room: only with time to spare (module doc)
            idle_s, most_s = EVICT_IDLE_S, EVICT_DEFER_MAX_S
        with trio.move_on_after(most_s) as floor:
            await wait_all_tasks_blocked(idle_s)
        if floor.cancelled_caught:
            self.accepts_forced += 1

    def _make_room(self) -> bool:
        """Close the patrol's victim (module doc) for a newcomer; False if every connection is busy."""
        victim = self._ctx.patrol.victim()
        if victim is None:
            return False
        self._evicting += 1
        self._evicted += 1
        victim.evicted = True
        victim.expire("evicted")
        return True

    async def _connection(self, stream: trio.SocketStream, peer: str) -> None:
        accepted_at = trio.current_time()
        CLIENT.set(peer)  # this task's context: the connection's tasks inherit it (log lines name the peer)
        h1 = H1ServerConnection(self._ctx, stream, peer, accepted_at)
        conn: H1ServerConnection | H2ServerConnection = h1
        try:
            self._connections.add(conn)
            await self._serve(conn)
            initial = h1.h2_initial
            if initial is not None:
                self._connections.discard(conn)
                conn = H2ServerConnection(self._ctx, stream, peer, accepted_at)
                self._connections.add(conn)
                await self._serve(conn, initial)
        except Exception:
            # A bug (nothing a connection raises on purpose gets here): its traceback, at a
            # rate a client that can trigger it cannot raise.
            self._ctx.events.event(
                "connection_failed", "connection from %s failed", peer or "?", level=logging.ERROR, exc_info=True
            )
        finally:
            self._connections.discard(conn)
            stream.socket.close()
            self._open -= 1
            if getattr(conn, "evicted", False):
                self._evicting -= 1
            if not self._open and self._ctx.draining:
                self._all_closed.set()

    async def _serve(self, conn: H1ServerConnection | H2ServerConnection, initial: bytes | None = None) -> None:
        # connections_open{protocol="http1"} counts a connection from accept (while it is told apart from h2c).
        gauge = self._gauges[conn.protocol] if self._gauges else None
        if gauge is not None:
            gauge.inc()
        try:
            await conn.run(initial)  # type: ignore[arg-type]  # an H2ServerConnection is always given its preface bytes
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("connection %r lost: %s", conn, exc)
        finally:
            if gauge is not None:
                gauge.dec()


async def _reuse_port_listener(host: str | None, port: int) -> list[trio.SocketListener]:
    sock = trio.socket.socket(trio.socket.AF_INET6 if host and ":" in host else trio.socket.AF_INET)
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEPORT, 1)
    await sock.bind((host or "0.0.0.0", port))
    sock.listen(4096)
    return [trio.SocketListener(sock)]


async def _accept(listener: trio.SocketListener) -> tuple[trio.SocketStream, str]:
    """trio's SocketListener.accept, keeping the peer address accept() returned.

    Written here because trio drops that address, and asking the socket later
    (getpeername) fails once a client has reset it: its failures were logged as
    "connection from ? failed". Same errno handling as trio's (routine ones retried).
    """
    while True:
        try:
            sock, address = await listener.socket.accept()
        except OSError as exc:
            if exc.errno in _CLOSED_ERRNOS:
                raise trio.ClosedResourceError from None
            if exc.errno not in _IGNORABLE_ACCEPT_ERRNOS:
                raise
        else:
            peer = address[0] if isinstance(address, tuple) and address else ""
            return trio.SocketStream(sock), peer


async def _accept_now(sock: socket.socket) -> tuple[trio.SocketStream, str]:
    """The next connection from `sock` (the stdlib listening socket, non-blocking), without a scheduler pass when
    one is waiting: the caller yields after each accept (`_idle_loop`). Same errno handling as `_accept`.
    """
    while True:
        try:
            conn, address = sock.accept()
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)  # raises ClosedResourceError if the listener is closed meanwhile
            continue
        except OSError as exc:
            if exc.errno in _CLOSED_ERRNOS:
                raise trio.ClosedResourceError from None
            if exc.errno not in _IGNORABLE_ACCEPT_ERRNOS:
                raise
            continue
        peer = address[0] if isinstance(address, tuple) and address else ""
        return trio.SocketStream(trio.socket.from_stdlib_socket(conn)), peer


# As trio._highlevel_socket's: a closed listener, and a connection that died in the backlog.
_CLOSED_ERRNOS = {errno.EBADF, errno.ENOTSOCK}
_IGNORABLE_ACCEPT_ERRNOS = {
    getattr(errno, name)
    for name in (
        "ECONNABORTED",
        "EPERM",
        "EPROTO",
        "ENETDOWN",
        "ENOPROTOOPT",
        "EHOSTDOWN",
        "ENONET",
        "EHOSTUNREACH",
        "EOPNOTSUPP",
        "ENETUNREACH",
        "ENOSR",
        "ESOCKTNOSUPPORT",
        "EPROTONOSUPPORT",
        "ETIMEDOUT",
        "ECONNRESET",
    )
    if hasattr(errno, name)
}
