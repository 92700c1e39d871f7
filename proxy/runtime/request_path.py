"""The request path, top to bottom.

Theory of operation: `RequestPath.__call__` is the data listener's handler and
reads like the path itself:

    read the bounded body -> choose an upstream -> forward with the remaining
    budget -> stream the response back -> record

Each step is a call into the module that owns it; this file only sequences them
and maps failures onto the wire contract (proxy/core/wire.py):
connect failure -> 502 upstream_unavailable, the upstream's own time cap ->
504 upstream_timeout, a broken upstream before any response byte -> 502. After
response bytes went out there is no status left to change: the downstream
stream is aborted, which the client sees as a truncated response.

Request bodies are read whole (bounded by listen.max_body_bytes) before
forwarding: admission needs them to estimate cost and fingerprint idempotent
requests, the same choice the Gateway API inference extension makes. Responses
always stream, chunk by chunk, unbuffered.
"""

from __future__ import annotations

import logging

import trio

from proxy.core import wire
from proxy.errors import UpstreamConnectError, UpstreamError
from proxy.http import forward
from proxy.http.messages import Request, ResponseSink, header_value

log = logging.getLogger("rampmeter.request")

_CONTENT_LENGTH = b"content-length"


class RequestPath:
    """Handler for the data listener; one instance per sidecar, policy swappable."""

    def __init__(self, *, policy, pool, balancer, metrics) -> None:
        self.policy = policy
        self._pool = pool
        self._balancer = balancer
        self._metrics = metrics
        self._inflight = metrics.requests_in_flight
        self._disconnects = metrics.client_disconnects
        self._rejections = {reason: metrics.rejections.labels(reason.value) for reason in wire.Reason}

    async def __call__(self, request: Request, sink: ResponseSink) -> None:
        self._inflight.inc()
        try:
            await self._handle(request, sink)
        except trio.Cancelled:
            if request.client_gone:
                self._disconnects.inc()
            raise
        finally:
            self._inflight.dec()

    async def _handle(self, request: Request, sink: ResponseSink) -> None:
        body = await request.body.read_all()
        upstream = self._balancer.choose(trio.current_time())
        await self._forward(request, sink, upstream, body)

    async def _forward(self, request: Request, sink: ResponseSink, upstream: int, body: bytes) -> None:
        config = self.policy.upstreams[upstream]
        headers = forward.request_headers(request, self._pool.authority(upstream))
        extra = [(wire.QUEUE_MS.encode(), b"0")]
        try:
            with trio.fail_after(config.timeout_s):
                async with self._pool.request(upstream, request.method, request.target, headers, body) as resp:
                    await _relay(resp, sink, forward.response_headers(resp.headers) + extra)
        except UpstreamConnectError as exc:
            self._balancer.mark_refused(upstream, trio.current_time())
            await self._reject(sink, wire.Reason.UPSTREAM_UNAVAILABLE, f"upstream {upstream} unavailable: {exc}")
        except UpstreamError as exc:
            if sink.headers_sent:
                raise
            await self._reject(sink, wire.Reason.UPSTREAM_UNAVAILABLE, f"upstream {upstream} failed: {exc}")
        except trio.TooSlowError:
            if sink.headers_sent:
                raise
            await self._reject(
                sink, wire.Reason.UPSTREAM_TIMEOUT, f"upstream {upstream} took longer than {config.timeout_s:g}s"
            )

    async def _reject(self, sink: ResponseSink, reason: wire.Reason, message: str, retry_after_ms=None) -> None:
        self._rejections[reason].inc()
        status, headers, body = wire.rejection(reason, message, retry_after_ms)
        await sink.respond(status, headers, body)


async def _relay(resp, sink: ResponseSink, headers) -> None:
    """Copy the upstream response to the client as it arrives.

    Fast path: a response whose whole body came with its first read (the common
    small JSON answer) goes out as one write. Everything else streams: each
    upstream chunk is sent on as soon as it arrives (SSE tokens included).
    """
    first = await resp.receive()
    length = header_value(resp.headers, _CONTENT_LENGTH)
    if not first or (length is not None and len(first) == int(length)):
        await sink.respond(resp.status, headers, first)
        while await resp.receive():  # lets the pool see the end and reuse the connection
            pass
        return
    await sink.start(resp.status, headers)
    chunk = first
    while chunk:
        await sink.send(chunk)
        chunk = await resp.receive()
    await sink.end()
