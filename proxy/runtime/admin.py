"""The admin listener's handler: health, readiness, metrics and introspection.

Theory of operation: a tiny router over exact paths, served by the same
`proxy.http.server.Server` as the data path, on its own port (default
127.0.0.1:9090, so it stays off the Service). Every answer is computed from
snapshots the owning objects give (`statistics()`), never from internals.

- GET /healthz       200 while the process serves (liveness: never depends on the model)
- GET /readyz        200 when the sidecar should get traffic, else 503 with the reason
- GET /metrics       this instance's registry only: Prometheus text, or OpenMetrics when the scraper
                     asks for it (`Accept: application/openmetrics-text`, what Prometheus sends
                     with exemplar storage on), the format that carries exemplars
- GET /admin/stats   JSON snapshot of every stateful part
- GET /admin/policy  the effective policy, where it came from and its version
- POST /admin/drain  stop admitting, wait for what was admitted (`?timeout_s=`): proxy/runtime/drain.py;
                     200 drained / 504 timed out, with the DrainResult as JSON
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from prometheus_client.exposition import choose_encoder

from proxy.http.messages import Request, ResponseSink
from proxy.runtime.drain import timeout_from_query

_json = msgspec.json.Encoder(enc_hook=lambda obj: repr(obj))


class AdminHandler:
    """Routes admin requests; `sources` are callables so answers are always current."""

    def __init__(
        self,
        *,
        registry,
        stats: Callable[[], dict[str, Any]],
        policy: Callable[[], dict[str, Any]],
        readiness: Callable[[], tuple[bool, str]],
        drain: Callable[[float | None], Awaitable[Any]] | None = None,
    ) -> None:
        self._registry = registry
        self._stats = stats
        self._policy = policy
        self._readiness = readiness
        self._drain = drain
        self._routes = {
            b"/healthz": self._healthz,
            b"/readyz": self._readyz,
            b"/metrics": self._metrics,
            b"/admin/stats": self._admin_stats,
            b"/admin/policy": self._admin_policy,
        }

    async def __call__(self, request: Request, sink: ResponseSink) -> None:
        if request.path == b"/admin/drain" and self._drain is not None:
            await self._admin_drain(request, sink)
            return
        route = self._routes.get(request.path)
        if route is None:
            await _text(sink, 404, "not found; try /healthz /readyz /metrics /admin/stats /admin/policy\n")
        elif request.method not in (b"GET", b"HEAD"):
            await sink.respond(405, [(b"allow", b"GET, HEAD"), (b"content-type", b"text/plain")], b"GET only\n")
        elif route == self._metrics:
            await self._metrics(sink, (request.header(b"accept") or b"").decode("latin-1"))
        else:
            await route(sink)

    async def _healthz(self, sink: ResponseSink) -> None:
        await _text(sink, 200, "ok\n")

    async def _readyz(self, sink: ResponseSink) -> None:
        ready, why = self._readiness()
        await _text(sink, 200 if ready else 503, f"{why}\n")

    async def _metrics(self, sink: ResponseSink, accept: str = "") -> None:
        encode, content_type = choose_encoder(accept[:1024])  # bounded: the header is the client's
        await sink.respond(200, [(b"content-type", content_type.encode())], encode(self._registry))

    async def _admin_stats(self, sink: ResponseSink) -> None:
        await _send_json(sink, self._stats())

    async def _admin_policy(self, sink: ResponseSink) -> None:
        await _send_json(sink, self._policy())

    async def _admin_drain(self, request: Request, sink: ResponseSink) -> None:
        if request.method != b"POST":  # it changes state: never on a GET a probe or a crawler might send
            await sink.respond(405, [(b"allow", b"POST"), (b"content-type", b"text/plain")], b"POST only\n")
            return
        try:
            timeout_s = timeout_from_query(request.target)
        except ValueError as exc:
            await _text(sink, 400, f"{exc}\n")
            return
        drain = self._drain
        assert drain is not None  # routed here only when there is one
        result = await drain(timeout_s)
        await _send_json(sink, dataclasses.asdict(result), result.status)


async def _text(sink: ResponseSink, status: int, text: str) -> None:
    await sink.respond(status, [(b"content-type", b"text/plain; charset=utf-8")], text.encode())


async def _send_json(sink: ResponseSink, value: Any, status: int = 200) -> None:
    await sink.respond(status, [(b"content-type", b"application/json")], _json.encode(value) + b"\n")
