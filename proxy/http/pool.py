"""The upstream pool: connections to every model server, reused across requests.

Theory of operation: one `_H1Upstream` or `_H2Upstream` per configured upstream;
the caller (admission controller) picks the index, the pool picks the connection.
`request(...)` is an async context manager that yields an `UpstreamResponse` once
the response head arrived and releases it exactly once on exit, also on
cancellation (release never awaits):
- HTTP/1.1: a semaphore of `max_connections` bounds connections in use; an idle
  LIFO stack of keep-alive connections (the hot one is reused, the cold ones age
  out); a connection is checked for a pending EOF before reuse. If the very first
  send on a pooled connection fails before any byte was accepted, the request is
  retried once on a fresh connection; after that never (request_sent=True).
- h2c: streams go to the first connection with capacity; another connection is
  opened (one at a time) when all are full or draining after GOAWAY, up to
  `max_connections`; beyond that callers park until a stream ends. A stream the
  peer did not process (REFUSED_STREAM, GOAWAY) is retried when the body is bytes
  (replayable), up to MAX_UNPROCESSED_RETRIES times: after a GOAWAY every stream it
  refused moves to the same new connection at once, and an upstream with a cap on
  requests per connection (nginx keepalive_requests, Envoy max_requests_per_connection)
  refuses the excess again; one retry lost requests there.
A `deadline` given to `request(...)` bounds an HTTP/1.1 exchange without a cancel
scope of its own (`deadlines.DeadlineKeeper`): at the deadline its connection is
closed and the caller gets UpstreamTimeout; a wait for a connection slot, the one
wait that is not on a connection, gets a real scope, only when it happens. h2c
exchanges are not bounded here (`bounds_deadlines()` is False): their caller
keeps a scope.
The common HTTP/1.1 case (a slot free, a pooled connection fit to reuse) runs in
`_H1Upstream.start` itself, deadline armed inline: one coroutine layer for the
whole upstream exchange, since every layer is created per request and resumed at
each of its waits; a new connection and the one retry go through `_exchange` and
`_retry`.
Exchanges are full duplex: a request body over 64 KiB, or streamed, is sent by a
task in the pool's nursery while the caller reads the response (an upstream that
echoes as it reads cannot deadlock us); the connection modules own that task and
stop it when the response is released. Small bodies cost no task.
One reaper task closes connections idle for `idle_timeout_s`, sleeping until
exactly the earliest expiry (autojump-clock exact). Metrics children are bound
once per upstream at construction.

Invariants: open connections <= max_connections per upstream (draining h2
connections excepted); every started request is counted once in
`upstream_requests{outcome}`; `outstanding` returns to 0 when nothing is in flight.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import trio

from proxy.errors import UpstreamConnectError, UpstreamError, UpstreamTimeout
from proxy.http.deadlines import DeadlineKeeper
from proxy.http.forward import h2_request_headers
from proxy.http.messages import Headers
from proxy.http.upstream_h1 import H1Response, H1UpstreamConnection, framed
from proxy.http.upstream_h2 import H2Response, H2UpstreamConnection
from proxy.metrics import Metrics
from proxy.policy.schema import Upstream

OUTCOMES = ("ok", "aborted", "protocol_error", "connect_error")
_BYTES_LIKE = (bytes, bytearray, memoryview)
# Retries of an h2 stream the upstream did not process (module doc); each is safe (RFC 9113 8.7)
# and costs at most a new connection, so a handful is cheap; a bound, not a loop, for an
# upstream that refuses every stream.
MAX_UNPROCESSED_RETRIES = 8
_C = TypeVar("_C")  # a connection, as its opener makes it


class UpstreamResponse(Protocol):
    status: int
    headers: Headers  # lower-case names, no pseudo-headers
    http_version: str  # "1.1", "1.0" or "2"

    async def receive(self) -> bytes: ...  # what has arrived, as soon as there is any; b"" at the end
    @property
    def all_received(self) -> bool: ...  # the body has ended and receive() has handed all of it out
    async def aclose(self) -> None: ...


class Upstreams(Protocol):
    """What the relay needs of a pool (proxy/runtime/relay.py): `UpstreamPool`, or a stand-in (tests,
    bench.policy_path). A pool may also offer `bounds_deadlines(upstream) -> bool` (UpstreamPool does);
    one that does not bounds nothing, and the relay keeps a scope."""

    def request(
        self,
        upstream: int,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: bytes | AsyncIterable[bytes] = b"",
        deadline: float = math.inf,
        trailers: Headers | None = None,
    ) -> AbstractAsyncContextManager[UpstreamResponse]: ...

    def authority(self, upstream: int) -> bytes: ...


@dataclass(frozen=True)
class UpstreamStatistics:
    index: int
    url: str
    protocol: str
    open_connections: int
    idle_connections: int  # h1: pooled and unused; h2: connections with no stream
    streams: int  # h2 streams open (h1: connections in use)
    outstanding: int  # requests started and not yet released
    waiting: int  # callers waiting for a connection or stream slot


@dataclass(frozen=True)
class PoolStatistics:
    upstreams: tuple[UpstreamStatistics, ...]

    def __getitem__(self, index: int) -> UpstreamStatistics:
        return self.upstreams[index]


class _Null:
    def inc(self, *a: object) -> None: ...
    def dec(self, *a: object) -> None: ...
    def observe(self, *a: object) -> None: ...


def parse_url(url: str) -> tuple[str, int, bytes]:
    """http://host:port[/prefix] -> (host, port, prefix without trailing slash)."""
    rest = url.removeprefix("http://")
    hostport, slash, path = rest.partition("/")
    host, _, port = hostport.rpartition(":") if hostport.rfind(":") > hostport.rfind("]") else (hostport, "", "80")
    return host.strip("[]"), int(port), ("/" + path if slash else "").rstrip("/").encode()


class _Upstream:
    protocol = ""

    def __init__(self, index: int, cfg: Upstream, pool: UpstreamPool, metrics: Metrics | None) -> None:
        self.index, self.cfg, self.pool = index, cfg, pool
        self.host, self.port, self.prefix = parse_url(cfg.url)
        self.hostport = f"{self.host}:{self.port}"
        self.authority = cfg.url.removeprefix("http://").partition("/")[0].encode()
        self.connect_timeout_s = cfg.connect_timeout_ms / 1000
        self.outstanding = self.waiting = 0
        name = metrics.upstream(index) if metrics is not None else str(index)
        if metrics is None:
            self.outcomes: dict[str, Any] = dict.fromkeys(OUTCOMES, _Null())
            self.duration: Any = _Null()
            self.connections: Any = _Null()
        else:
            self.outcomes = {o: metrics.upstream_requests.labels(name, o) for o in OUTCOMES}
            self.duration = metrics.upstream_duration_seconds.labels(name)
            self.connections = metrics.upstream_connections.labels(upstream=name)

    def _target(self, target: bytes) -> bytes:
        return self.prefix + target if self.prefix and target[:1] == b"/" else target

    def _failed(self, exc: BaseException) -> None:
        self.outstanding -= 1
        if isinstance(exc, UpstreamTimeout):
            self.outcomes["aborted"].inc()  # the caller's deadline, as a cancellation would have been
        elif isinstance(exc, UpstreamConnectError):
            self.outcomes["connect_error"].inc()
        elif isinstance(exc, UpstreamError):
            self.outcomes["protocol_error"].inc()
        else:
            self.outcomes["aborted"].inc()
        if isinstance(exc, UpstreamError):
            exc.upstream = str(self.index)  # callers and the balancer know upstreams by index

    def _released(self, resp: Any, now: float) -> None:
        self.outstanding -= 1
        failed = resp.failed and not getattr(resp.connection, "timed_out", False)
        outcome = "ok" if resp.complete else "protocol_error" if failed else "aborted"
        self.outcomes[outcome].inc()
        self.duration.observe(now - resp.started_at)

    async def _connect_timed(self, opener: Callable[[], Awaitable[_C]]) -> _C:
        with trio.move_on_after(self.connect_timeout_s):
            return await opener()
        raise UpstreamConnectError(
            f"upstream {self.hostport}: connect timed out after {self.cfg.connect_timeout_ms} ms",
            upstream=str(self.index),
        )


class _Slots:
    """The connections in use, at most `max_connections`: trio.Semaphore's semantics, cheaper per request.

    As trio's: a slot given back goes straight to the longest waiter (FIFO), and a free
    slot means nobody waits. The uncontended take (`free -= 1`) and give (`give()`) cost no
    lock-step calls: trio's acquire_nowait and release are two Python calls each plus the
    ParkingLot's `__bool__` in both, four calls per request for a counter nobody waits on.
    """

    __slots__ = ("free", "lot", "waiters")

    def __init__(self, n: int) -> None:
        self.free = n
        self.waiters = 0  # tasks in take_waiting (parked, or unparked and not yet resumed)
        self.lot = trio.lowlevel.ParkingLot()

    async def take_waiting(self) -> None:
        """Wait for a slot (the caller found none free); cancellable, then nothing was taken."""
        self.waiters += 1
        try:
            await self.lot.park()  # unparked by give(): the slot is ours, never added to `free`
        finally:
            self.waiters -= 1

    def give(self) -> None:
        if self.waiters and self.lot.unpark():
            return  # handed to the first waiter
        self.free += 1


class _H1Upstream(_Upstream):
    protocol = "http1"

    def __init__(self, index: int, cfg: Upstream, pool: UpstreamPool, metrics: Metrics | None) -> None:
        super().__init__(index, cfg, pool, metrics)
        self.slots = _Slots(cfg.max_connections)
        self.idle: deque[H1UpstreamConnection] = deque()  # oldest idle at the left
        self.open = 0

    async def start(
        self,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: Any,
        deadline: float = math.inf,
        trailers: Headers | None = None,  # not sent: HTTP/1.1 request trailers are not forwarded
    ) -> H1Response:
        self.outstanding += 1
        now = self.pool.now()
        slots = self.slots
        if slots.free:
            slots.free -= 1
        else:
            try:
                await self._wait_for_slot(deadline)
            except BaseException as exc:
                self._failed(exc)
                raise
            now = self.pool.now()
        if self.prefix and target[:1] == b"/":
            target = self.prefix + target
        try:
            # The common case inline (a pooled connection, fresh, and the exchange on it): one
            # coroutine layer for the whole upstream exchange; `_exchange` for the rest.
            conn = self._take_idle(now)
            if conn is None:
                resp = await self._exchange(deadline, method, target, headers, body)
            else:
                entry = None if deadline == math.inf else self.pool.deadlines.arm(deadline, conn)
                try:
                    resp = await conn.send_request(method, target, headers, body)
                except BaseException:
                    if entry is not None:
                        self.pool.deadlines.disarm(entry)
                    resp = await self._retry(conn, deadline, method, target, headers, body)
                else:
                    resp.deadline_entry = entry
        except BaseException as exc:
            self.slots.give()
            self._failed(exc)
            raise
        resp.owner = self
        resp.started_at = now  # the exchange starts once a connection slot is ours
        return resp

    async def _wait_for_slot(self, deadline: float) -> None:
        self.waiting += 1
        try:
            with trio.move_on_at(deadline):
                await self.slots.take_waiting()
                return
            raise UpstreamTimeout(f"upstream {self.hostport}: no connection free before the deadline")
        finally:
            self.waiting -= 1

    async def _exchange(self, deadline: float, *request: Any) -> H1Response:
        """The exchange on a new connection (no pooled one was fit to carry it)."""
        conn = await self._connect()
        try:
            return await self._send(conn, deadline, *request)
        except BaseException:
            self._discard(conn)
            raise

    async def _retry(
        self, conn: H1UpstreamConnection, deadline: float, method: bytes, target: bytes, headers: Headers, body: Any
    ) -> H1Response:
        """In an `except` for the exchange on pooled `conn`: discard it; retry on a new one if that is safe.

        (The bare `raise`s re-raise the caller's exception, the one being handled.)
        """
        self._discard(conn)
        exc = sys.exc_info()[1]
        # Safe to replay only if nothing reached the upstream and the body can be sent again.
        if isinstance(exc, UpstreamTimeout) or not isinstance(exc, UpstreamError):
            raise
        if exc.request_sent or not isinstance(body, _BYTES_LIKE):
            raise
        return await self._exchange(deadline, method, target, headers, body)

    async def _send(self, conn: H1UpstreamConnection, deadline: float, *request: Any) -> H1Response:
        """The exchange on `conn`, closed by the keeper at `deadline` unless released first."""
        if deadline == math.inf:
            return await conn.send_request(*request)
        entry = self.pool.deadlines.arm(deadline, conn)
        try:
            resp = await conn.send_request(*request)
        except BaseException:
            self.pool.deadlines.disarm(entry)
            raise
        resp.deadline_entry = entry
        return resp

    def _take_idle(self, now: float) -> H1UpstreamConnection | None:
        idle, timeout = self.idle, self.cfg.idle_timeout_s
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < timeout and not conn.is_stale():
                return conn
            self._discard(conn)  # closed by the upstream while idle, or expired: never carried this request
        return None

    async def _connect(self) -> H1UpstreamConnection:
        conn = await self._connect_timed(
            lambda: H1UpstreamConnection.open(self.host, self.port, label=self.hostport, nursery=self.pool.nursery)
        )
        self.open += 1
        self.connections.inc()
        return conn

    def _discard(self, conn: H1UpstreamConnection) -> None:
        conn.close()
        self.open -= 1
        self.connections.dec()

    def release(self, resp: H1Response) -> None:
        """Called once by `resp.aclose()`: pool the connection if the exchange ended cleanly."""
        if resp.deadline_entry is not None:
            self.pool.deadlines.disarm(resp.deadline_entry)
        now = self.pool.now()
        if not self.pool.closed and resp.reusable():
            resp.connection.idle_since = now
            self.idle.append(resp.connection)
            self.pool.reap_by(now + self.cfg.idle_timeout_s)
        else:
            self._discard(resp.connection)
        self.slots.give()
        self._released(resp, now)

    def reap(self, now: float) -> float:
        idle, timeout = self.idle, self.cfg.idle_timeout_s
        while idle and now - idle[0].idle_since >= timeout:
            self._discard(idle.popleft())
        return idle[0].idle_since + timeout if idle else math.inf

    def close_all(self) -> None:
        while self.idle:
            self._discard(self.idle.pop())

    def statistics(self) -> UpstreamStatistics:
        return UpstreamStatistics(
            self.index,
            self.cfg.url,
            self.protocol,
            self.open,
            len(self.idle),
            self.open - len(self.idle),
            self.outstanding,
            self.waiting,
        )


class _H2Upstream(_Upstream):
    protocol = "h2c"

    def __init__(self, index: int, cfg: Upstream, pool: UpstreamPool, metrics: Metrics | None) -> None:
        super().__init__(index, cfg, pool, metrics)
        self.conns: list[H2UpstreamConnection] = []
        self.opening = False
        self.lot = trio.lowlevel.ParkingLot()  # callers waiting for a stream slot

    async def start(
        self,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: Any,
        deadline: float = math.inf,
        trailers: Headers | None = None,
    ) -> H2Response:
        """`deadline` is not enforced here (bounds_deadlines() is False): the caller holds a scope.
        `trailers`: the client's request trailers, sent after the body."""
        self.outstanding += 1
        started = trio.current_time()
        if isinstance(body, _BYTES_LIKE):
            headers = framed(method, headers, body)
        block = h2_request_headers(method, self._target(target), headers, authority=self.authority)
        try:
            resp = await self._exchange(block, body, trailers)
        except BaseException as exc:
            self._failed(exc)
            raise
        resp.owner = self
        resp.started_at = started
        return resp

    async def _exchange(self, block: Headers, body: Any, trailers: Headers | None = None) -> H2Response:
        for retry in range(MAX_UNPROCESSED_RETRIES + 1):
            conn = await self._connection()  # connect failures are not retried here
            try:
                return await conn.send(block, body, trailers)
            except UpstreamError as exc:
                if exc.request_sent or not isinstance(body, _BYTES_LIKE) or retry == MAX_UNPROCESSED_RETRIES:
                    raise
        raise AssertionError("unreachable: the last try returns or raises")

    async def _connection(self) -> H2UpstreamConnection:
        while True:
            for conn in self.conns:
                if conn.has_capacity():
                    return conn
            live = sum(1 for c in self.conns if not c.goaway)
            if not self.opening and live < self.cfg.max_connections:
                return await self._open()
            self.waiting += 1
            try:
                await self.lot.park()
            finally:
                self.waiting -= 1

    async def _open(self) -> H2UpstreamConnection:
        self.opening = True
        nursery = self.pool.nursery
        assert nursery is not None, "the pool opens connections only inside `async with pool`"
        try:
            conn = await self._connect_timed(
                lambda: H2UpstreamConnection.open(
                    self.host, self.port, nursery=nursery, label=self.hostport, on_change=self._changed
                )
            )
        finally:
            self.opening = False
            self.lot.unpark_all()  # waiters re-check: a new connection, or their turn to open one
        self.conns.append(conn)
        self.connections.inc()
        return conn

    def _changed(self, conn: H2UpstreamConnection) -> None:
        """A connection's capacity changed (stream ended, settings, GOAWAY, closed)."""
        if conn.closed or conn.goaway:
            if conn.closed and conn in self.conns:
                self.conns.remove(conn)
                self.connections.dec()
            self.lot.unpark_all()  # waiters may now open a connection
            return
        self.lot.unpark()  # a stream slot may be free
        if not conn.active_streams:
            self.pool.reap_by(conn.idle_since + self.cfg.idle_timeout_s)

    def release(self, resp: H2Response) -> None:
        self._released(resp, trio.current_time())

    def reap(self, now: float) -> float:
        timeout, next_at = self.cfg.idle_timeout_s, math.inf
        for conn in list(self.conns):
            if conn.active_streams or conn.closed:
                continue
            if now - conn.idle_since >= timeout:
                conn.close()  # _changed() drops it from the list
            else:
                next_at = min(next_at, conn.idle_since + timeout)
        return next_at

    def close_all(self) -> None:
        for conn in list(self.conns):
            conn.close()

    def statistics(self) -> UpstreamStatistics:
        streams = sum(c.active_streams for c in self.conns)
        idle = sum(1 for c in self.conns if not c.active_streams)
        return UpstreamStatistics(
            self.index, self.cfg.url, self.protocol, len(self.conns), idle, streams, self.outstanding, self.waiting
        )


class _Exchange:
    """`async with pool.request(...) as response`: a class, not a generator, to keep the hot path short."""

    __slots__ = ("_args", "_resp", "_up")

    def __init__(self, up: _H1Upstream | _H2Upstream, args: tuple[Any, ...]) -> None:
        self._up, self._args = up, args

    async def __aenter__(self) -> UpstreamResponse:
        self._resp = await self._up.start(*self._args)
        return self._resp

    async def __aexit__(self, *exc_info: object) -> None:
        await self._resp.aclose()


class UpstreamPool:
    def __init__(self, upstreams: list[Upstream], *, metrics: Metrics | None = None) -> None:
        self._ups: list[_H1Upstream | _H2Upstream] = [
            (_H2Upstream if u.protocol == "h2c" else _H1Upstream)(i, u, self, metrics) for i, u in enumerate(upstreams)
        ]
        self.nursery: trio.Nursery | None = None
        self.closed = False
        self.now = trio.current_time  # the running clock's own method once in `async with` (one call, not three)
        self.deadlines = DeadlineKeeper()
        self._reap_at = -math.inf  # no reaper yet: nothing to wake
        self._reap_wake: trio.Event | None = None
        self._nursery_cm: AbstractAsyncContextManager[trio.Nursery] | None = None

    async def __aenter__(self) -> Self:
        self.now = trio.lowlevel.current_clock().current_time
        self._nursery_cm = trio.open_nursery()
        self.nursery = await self._nursery_cm.__aenter__()
        self._reap_at = math.inf
        self.nursery.start_soon(self._reaper)
        self.nursery.start_soon(self.deadlines.run)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self.closed = True
        for up in self._ups:
            up.close_all()
        assert self.nursery is not None
        self.nursery.cancel_scope.cancel()
        assert self._nursery_cm is not None
        return await self._nursery_cm.__aexit__(exc_type, exc, tb)

    def request(
        self,
        upstream: int,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: bytes | AsyncIterable[bytes] = b"",
        deadline: float = math.inf,
        trailers: Headers | None = None,
    ) -> _Exchange:
        """`async with pool.request(i, b"POST", b"/v1/x", headers, body) as resp:` (see module doc).

        `deadline` (trio time): an HTTP/1.1 exchange still running then fails with UpstreamTimeout.
        `trailers`: request trailer fields, sent after the body to an h2c upstream (dropped for HTTP/1.1).
        """
        if self.nursery is None:
            raise RuntimeError("use `async with UpstreamPool(...)` before sending requests")
        args = (
            (method, target, headers, body, deadline)
            if trailers is None
            else (method, target, headers, body, deadline, trailers)
        )
        return _Exchange(self._ups[upstream], args)

    def bounds_deadlines(self, upstream: int) -> bool:
        """Whether `request(..., deadline=)` bounds this upstream's exchanges (HTTP/1.1: yes; h2c: no)."""
        return self._ups[upstream].protocol == "http1"

    def authority(self, upstream: int) -> bytes:
        """HOST:PORT of upstream `upstream` as written in its URL (the Host to send when the client gave none)."""
        return self._ups[upstream].authority

    def reap_by(self, at: float) -> None:
        """Make sure the reaper wakes by `at` (a connection just went idle)."""
        if at < self._reap_at and self._reap_wake is not None:
            self._reap_at = at
            self._reap_wake.set()

    async def _reaper(self) -> None:
        # With nothing idle it still wakes once per shortest idle timeout: otherwise
        # every release would wake it (a connection goes idle and is taken again
        # before the reaper runs), a task switch per request for nothing.
        period = min((up.cfg.idle_timeout_s for up in self._ups), default=math.inf)
        while True:
            self._reap_wake = trio.Event()
            now = trio.current_time()
            self._reap_at = min(min((up.reap(now) for up in self._ups), default=math.inf), now + period)
            with trio.move_on_at(self._reap_at):
                await self._reap_wake.wait()

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(tuple(up.statistics() for up in self._ups))

    def __repr__(self) -> str:
        parts = ", ".join(
            f"#{s.index} {s.protocol} open={s.open_connections} outstanding={s.outstanding}"
            for s in (up.statistics() for up in self._ups)
        )
        return f"<UpstreamPool {parts}>"
