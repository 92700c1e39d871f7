"""The pod's HTTP handler: OpenAI-compatible endpoints plus /sim/* controls.

Theory of operation: `PodAPI(pod)` is a `proxy.http.messages.Handler`; the
project's server (h11/h2) calls it with a protocol-neutral Request and a
ResponseSink. Routes are a dict `path -> (method, coroutine)`.

Inference (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`):
read the body, 503 while cold-starting, parse into a `Job` (400 with an OpenAI
error body on bad JSON, missing fields or a bad `x-request-timeout-ms`), draw the
injected error (500, nothing executed), then submit to the engine and hold that
lease until the answer is out. Streaming sends the SSE head at once and one
`data:` event per generated token as the engine steps produce them (several
pending tokens go out in one write, still one event each), then `[DONE]`. If the
server cancels the handler because the client left, the `finally` releases the
sequence: it leaves the queue or batch at once and its work counts as wasted.

Controls: GET /health (503 until cold start ends; JSON with instance_id and
started_at either way), GET /v1/models, GET /sim/stats, POST /sim/faults,
POST /sim/reset-stats, GET /metrics (vLLM names, see stats.py).

The profile moves or drops paths as real servers do: `health_path` ("" = no
health endpoint: 404) and `api_prefix` ("" = /chat/completions, /completions,
/embeddings and /models without /v1). The /sim/* controls and /metrics stay.
"""

from __future__ import annotations

import time

import msgspec
import trio

from proxy.core.wire import (
    GRPC_TIMEOUT,
    IDEMPOTENCY_KEY,
    REQUEST_TIMEOUT_MS,
    HeaderError,
    parse_grpc_timeout_ms,
    parse_timeout_ms,
)
from proxy.http.messages import Request, ResponseSink
from proxy.simpod import shapes, stats
from proxy.simpod.driver import Pod
from proxy.simpod.faults import fault_from_json
from proxy.simpod.workload import EMBEDDING, BadRequest, Job, endpoints, parse_job

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode
_JSON = shapes.JSON_HEADERS
_RID_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-"}


class PodAPI:
    def __init__(self, pod: Pod) -> None:
        self.pod = pod
        self.counters = stats.HttpCounters()
        self._registry = stats.metrics_registry(pod)
        self._created = int(pod.started_at)
        profile = pod.profile
        self._routes = {
            profile.api_prefix.encode() + b"/models": (b"GET", self._models),
            b"/sim/stats": (b"GET", self._stats),
            b"/sim/faults": (b"POST", self._faults),
            b"/sim/reset-stats": (b"POST", self._reset),
            b"/metrics": (b"GET", self._metrics),
            b"/sim/echo": (b"POST", self._echo),
        }
        if profile.health_path:
            self._routes[profile.health_path.encode()] = (b"GET", self._health)
        for path, kind in endpoints(profile.api_prefix).items():
            self._routes[path] = (b"POST", self._inference_for(kind))

    def __repr__(self) -> str:
        return f"<PodAPI {self.pod!r} {self.counters}>"

    async def __call__(self, request: Request, sink: ResponseSink) -> None:
        self.counters.http_requests += 1
        route = self._routes.get(request.path)
        if route is None:
            self.counters.not_found += 1
            return await self._error(sink, 404, f"no route {request.path.decode('latin-1')}", "not_found_error")
        method, handler = route
        if request.method != method:
            self.counters.not_found += 1
            return await self._error(sink, 405, f"use {method.decode()}", "method_not_allowed")
        await handler(request, sink)

    async def _error(self, sink: ResponseSink, status: int, message: str, type_: str, param: str | None = None) -> None:
        await sink.respond(status, _JSON, shapes.error_body(message, type_, param))

    # --- inference ---
    def _inference_for(self, kind: str):
        async def handle(request: Request, sink: ResponseSink) -> None:
            await self._inference(kind, request, sink)

        return handle

    def _deadline(self, request: Request) -> float | None:
        raw = request.header(REQUEST_TIMEOUT_MS.encode())
        if raw is not None:
            ms = parse_timeout_ms(raw)
        else:
            raw = request.header(GRPC_TIMEOUT.encode())
            if raw is None:
                return None
            ms = parse_grpc_timeout_ms(raw)
        return (request.received_at or trio.current_time()) + ms / 1000.0

    async def _inference(self, kind: str, request: Request, sink: ResponseSink) -> None:
        body = await request.body.read_all()
        if not self.pod.ready():
            self.counters.not_ready += 1
            return await self._error(sink, 503, "the model is still loading", "service_unavailable")
        try:
            job = parse_job(kind, body, self.pod.profile, self.pod.seed)
            deadline = self._deadline(request)
        except (BadRequest, HeaderError) as exc:
            self.counters.bad_requests += 1
            return await self._error(sink, 400, str(exc), "invalid_request_error", getattr(exc, "param", None))
        if self.pod.draw_error():
            self.counters.injected_errors += 1
            return await self._error(sink, 500, "simulated fault: the engine failed", "internal_server_error")
        key = request.header(IDEMPOTENCY_KEY.encode())
        if self.pod.profile.frontend_ms:
            await trio.sleep(self.pod.frontend_s())  # the front end: the engine does not count it yet
        seq = self.pod.submit(job, deadline=deadline, key=None if key is None else key.decode("latin-1"))
        try:
            if job.stream:
                await self._stream(seq, job, sink)
                return
            await self.pod.wait_done(seq)
            if self.pod.profile.frontend_ms:
                await trio.sleep(self.pod.frontend_s())  # the answer being written, after the engine let it go
            if kind == EMBEDDING:
                body = shapes.embeddings_body(job, self.pod.profile.embedding_dim, job.encoding_format)
            else:
                body = shapes.completion_body(job, self._rid(job, seq.seq_id), int(time.time()))
            await sink.respond(200, _JSON, body)
        finally:
            self.pod.release(seq)

    def _rid(self, job: Job, seq_id: int) -> str:
        return f"{_RID_PREFIX[job.kind]}{self.pod.instance_id[:12]}-{seq_id}"

    async def _stream(self, seq, job: Job, sink: ResponseSink) -> None:
        writer = shapes.ChunkWriter(job, self._rid(job, seq.seq_id), int(time.time()))
        await sink.start(200, shapes.SSE_HEADERS)
        sent = 0
        while True:
            produced = seq.generated
            if produced > sent:
                await sink.send(writer.tokens(sent, produced))
                sent = produced
            elif seq.done:
                break
            else:
                await self.pod.wait(seq)
        tail = writer.usage_event() + shapes.DONE if job.include_usage else shapes.DONE
        await sink.send(tail)
        await sink.end()

    # --- controls ---
    async def _health(self, request: Request, sink: ResponseSink) -> None:
        ready = self.pod.ready()
        body = _encode(
            {
                "status": "ok" if ready else "starting",
                "instance_id": self.pod.instance_id,
                "started_at": self.pod.started_at,
                "uptime_s": self.pod.elapsed(),
            }
        )
        await sink.respond(200 if ready else 503, _JSON, body)

    async def _models(self, request: Request, sink: ResponseSink) -> None:
        await sink.respond(200, _JSON, shapes.models_body(self.pod.profile.model, self._created))

    async def _stats(self, request: Request, sink: ResponseSink) -> None:
        await sink.respond(200, _JSON, stats.stats_json(self.pod, self.counters))

    async def _metrics(self, request: Request, sink: ResponseSink) -> None:
        text = stats.metrics_text(self._registry)
        await sink.respond(200, [(b"content-type", stats.PROMETHEUS_CONTENT_TYPE)], text)

    async def _faults(self, request: Request, sink: ResponseSink) -> None:
        raw = await request.body.read_all()
        try:
            fault = fault_from_json(_decode(raw) if raw.strip() else {}, self.pod.elapsed())
        except (msgspec.DecodeError, TypeError, ValueError) as exc:
            return await self._error(sink, 400, f"bad fault: {exc}", "invalid_request_error")
        self.pod.faults.replace(fault)
        await sink.respond(200, _JSON, _encode(self.pod.faults.statistics(self.pod.elapsed())))

    async def _echo(self, request: Request, sink: ResponseSink) -> None:
        """Stream the request body back as it arrives: for wire tests (large bodies, flow control)."""
        await sink.start(200, [(b"content-type", b"application/octet-stream")])
        async for chunk in request.body.chunks():
            await sink.send(chunk)
        await sink.end()

    async def _reset(self, request: Request, sink: ResponseSink) -> None:
        await request.body.read_all()
        self.pod.reset_stats()
        self.counters.reset()
        await sink.respond(200, _JSON, b'{"reset":true}')
