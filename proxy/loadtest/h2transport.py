"""h2c sessions of the load generator: streams spread over a few shared `H2UpstreamConnection`s.

Theory of operation: sessions share the transport's connections: a stream goes
round-robin to the first of `target.connections` connections with a free
stream; another connection is opened (one at a time) when all are full, up to
MAX_H2_CONNECTIONS, beyond which a sender parks until a stream ends (the
connection's `on_change` unparks it). Connections that were closed or got
GOAWAY are dropped; a stream the server refused or did not process (above
GOAWAY's last stream id, `request_sent=False`) is sent again, up to
MAX_UNPROCESSED_RETRIES times, as the proxy's pool does (one resend lost 4% of rows
at 1,000 req/s against nginx's 100 requests per connection: every sender that lost
a stream moved to the same new connection and the excess was refused again).

The connections are the project's `H2UpstreamConnection`: its HPACK coder remembers
repeated header blocks (proxy/http/hpack_memo.py: a fifth of the generator's CPU
against nginx), and h2's own inbound header validation is off there (h2rules checks a
response head in one pass; h2's check was a third of the generator's CPU per request).
"""

from __future__ import annotations

from typing import Any

import trio

from proxy.errors import UpstreamError
from proxy.http.pool import MAX_UNPROCESSED_RETRIES, parse_url
from proxy.http.upstream_h2 import H2UpstreamConnection
from proxy.loadtest.shapes import Shape
from proxy.loadtest.target import IDEMPOTENCY_KEY, Target, prepare

MAX_H2_CONNECTIONS = 64


class _H2Session:
    __slots__ = ("_t",)

    def __init__(self, transport: H2Transport) -> None:
        self._t = transport

    async def send(self, shape: int, key: bytes | None) -> Any:
        p = self._t.prepared[shape]
        block = p.h2_block if key is None else [*p.h2_block, (IDEMPOTENCY_KEY, key)]
        for retry in range(MAX_UNPROCESSED_RETRIES + 1):
            conn = self._t.pick() or await self._t.acquire()
            try:
                return await conn.send(block, p.body)
            except UpstreamError as exc:
                if exc.request_sent or retry == MAX_UNPROCESSED_RETRIES:
                    raise
        raise AssertionError("unreachable: the last try returns or raises")

    def close(self) -> None:
        pass


class H2Transport:
    def __init__(self, target: Target, shapes: tuple[Shape, ...], nursery: trio.Nursery) -> None:
        self.host, self.port, _ = parse_url(target.url)
        self.label = f"{self.host}:{self.port}"
        self.prepared = prepare(shapes, target.url)
        self.spread = target.connections
        self.conns: list[H2UpstreamConnection] = []  # the ones new streams may use
        self._every: list[H2UpstreamConnection] = []  # every one opened, closed at the end (draining ones too)
        self._next = 0
        self._opening = False
        self._lot = trio.lowlevel.ParkingLot()
        self._nursery = nursery
        self.opened = 0

    def session(self) -> _H2Session:
        return _H2Session(self)

    def pick(self) -> H2UpstreamConnection | None:
        """A connection with a free stream, round-robin; None when all are full (or too few are open)."""
        conns = self.conns
        n = len(conns)
        if n < self.spread:
            return None
        for k in range(n):
            conn = conns[(self._next + k) % n]
            if conn.has_capacity():
                self._next = (self._next + k + 1) % n
                return conn
        return None

    async def acquire(self) -> H2UpstreamConnection:
        while True:
            self.conns = [c for c in self.conns if not (c.closed or c.goaway)]
            conn = self.pick()
            if conn is not None:
                return conn
            if not self._opening and len(self.conns) < MAX_H2_CONNECTIONS:
                return await self._open()
            await self._lot.park()

    async def _open(self) -> H2UpstreamConnection:
        self._opening = True
        try:
            conn = await H2UpstreamConnection.open(
                self.host, self.port, nursery=self._nursery, label=self.label, on_change=self._changed
            )
        finally:
            self._opening = False
            self._lot.unpark_all()
        self.conns.append(conn)
        self._every.append(conn)
        self.opened += 1
        return conn

    def _changed(self, conn: H2UpstreamConnection) -> None:
        if not self._lot:
            return
        if conn.closed or conn.goaway:
            self._lot.unpark_all()  # the parked may now open a replacement
        else:
            self._lot.unpark()  # a stream ended: one parked sender can have it

    def close(self) -> None:
        for conn in self._every:
            conn.close()
        self.conns, self._every = [], []

    def statistics(self) -> dict[str, int]:
        return {
            "connections_opened": self.opened,
            "connections_open": len(self.conns),
            "streams": sum(c.active_streams for c in self.conns),
        }
