"""HTTP/1.1 sessions of the load generator: one keep-alive `H1UpstreamConnection` per worker.

Theory of operation: each runner worker holds a session that owns one
connection, opened lazily and reopened when the server closed it (checked with
`is_stale()` before reuse), so connections = workers, sized by rate x latency.
A request the server provably did not get (`request_sent=False` on a reused
connection) is sent once more on a fresh one, as HTTP clients do.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import UpstreamError
from proxy.http.messages import Headers
from proxy.http.pool import parse_url
from proxy.http.upstream_h1 import H1UpstreamConnection
from proxy.loadtest.shapes import Shape
from proxy.loadtest.target import IDEMPOTENCY_KEY, Prepared, Target, prepare


class _H1Session:
    __slots__ = ("_conn", "_t")

    def __init__(self, transport: H1Transport) -> None:
        self._t = transport
        self._conn: H1UpstreamConnection | None = None

    async def send(self, shape: int, key: bytes | None) -> Any:
        p = self._t.prepared[shape]
        headers = p.h1_headers if key is None else [*p.h1_headers, (IDEMPOTENCY_KEY, key)]
        reused = self._conn is not None
        try:
            return await self._send(p, headers)
        except UpstreamError as exc:
            if not reused or exc.request_sent:
                raise
        return await self._send(p, headers)  # the kept-alive connection had died: not processed

    async def _send(self, p: Prepared, headers: Headers) -> Any:
        conn = self._conn
        if conn is None or conn.closed or conn.is_stale():
            if conn is not None:
                conn.close()
            t = self._t
            self._conn = None
            conn = self._conn = await H1UpstreamConnection.open(t.host, t.port, label=t.label)
            t.opened += 1
        try:
            return await conn.send_request(p.method, p.target, headers, p.body)
        except BaseException:
            conn.close()  # a half-sent request leaves the connection unusable
            self._conn = None
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class H1Transport:
    def __init__(self, target: Target, shapes: tuple[Shape, ...]) -> None:
        self.host, self.port, _ = parse_url(target.url)
        self.label = f"{self.host}:{self.port}"
        self.prepared = prepare(shapes, target.url)
        self.opened = 0

    def session(self) -> _H1Session:
        return _H1Session(self)

    def close(self) -> None:
        pass  # sessions own their connections

    def statistics(self) -> dict[str, int]:
        return {"connections_opened": self.opened}
