"""OpenTelemetry tracing: one span per request, continuing the caller's W3C trace context.

Theory of operation: off by default, and then free: `from_environment()` returns None
unless the standard OTEL_* variables ask for traces (OTEL_TRACES_EXPORTER set to
something other than `none`, or OTEL_EXPORTER_OTLP_ENDPOINT /
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set; OTEL_SDK_DISABLED=true wins), and nothing of
OpenTelemetry is imported before that (`pip install 'rampmeter[sidecar,tracing]'`).
On, the SDK reads the rest of the standard variables itself: OTEL_SERVICE_NAME and
OTEL_RESOURCE_ATTRIBUTES (the resource), OTEL_TRACES_SAMPLER(_ARG), the exporter's
endpoint, headers, timeout and OTEL_EXPORTER_OTLP(_TRACES)_PROTOCOL (grpc or
http/protobuf, the default), OTEL_BSP_* for the batch processor, whose thread does the
export: the trio thread only records.

Per request (`Edge` calls `start` and `RequestSpan.end`; the request path tells
`admitted` through edge.note_admitted):

    span "METHOD" (kind SERVER), parent: the caller's traceparent/tracestate
    events: queued (when it entered the queue, if it waited), admitted, upstream first
            byte (the first answer bytes passed on from the upstream), done
    attributes: rampmeter.request_id, rampmeter.class, rampmeter.cost,
            rampmeter.queue_ms, rampmeter.reason, rampmeter.upstream, http.request.method,
            url.path, network.protocol.version, http.response.status_code
    status ERROR for 5xx answers, the sidecar's own 503s included (OTel's HTTP server rule: the
            caller got no answer), else UNSET

The request goes upstream with a traceparent naming this span as the parent, so the
model server's own spans (vLLM and Triton trace with OTel) hang under it.
Timestamps are wall-clock nanoseconds (what OTel keeps), taken when each event is
noted.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping

import trio

log = logging.getLogger("rampmeter.tracing")

_TRACEPARENT = b"traceparent"
_TRACESTATE = b"tracestate"
_CONTEXT_HEADERS = (_TRACEPARENT, _TRACESTATE)


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the OTEL_* variables ask for traces (module doc)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def from_environment(environ: Mapping[str, str] | None = None, *, version: str = "") -> Tracing | None:
    """A Tracing set up as the OTEL_* variables say, or None (off, or the extra not installed)."""
    environ = os.environ if environ is None else environ
    if not wanted(environ):
        return None
    try:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_* variables ask for traces but OpenTelemetry is not installed: "
            "pip install 'rampmeter[sidecar,tracing]'; tracing stays off"
        )
        return None
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    processors = [BatchSpanProcessor(_exporter(name, environ)) for name in names if name != "none"]
    return Tracing(processors, version=version)


def _exporter(name: str, environ: Mapping[str, str]):
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER: {name!r} is not one rampmeter knows (otlp, console, none)")
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if (protocol or "http/protobuf").strip() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter()


class Tracing:
    """A tracer provider of its own (not the global one) and the W3C propagator."""

    def __init__(self, processors, *, version: str = "") -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.trace import SpanKind, StatusCode, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # Resource.create reads OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES; "rampmeter" only where they name none.
        resource = Resource.create({"service.version": version})
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "rampmeter"}))
        self.provider = TracerProvider(resource=resource)
        for processor in processors:
            self.provider.add_span_processor(processor)
        self._tracer = self.provider.get_tracer("rampmeter", version)
        self._propagator = TraceContextTextMapPropagator()
        self._server = SpanKind.SERVER
        self._error = StatusCode.ERROR
        self._in_context = set_span_in_context
        self.upstream_name = str  # upstream index -> its name (the app sets the metrics label: the address)

    def start(self, request, ex) -> RequestSpan:
        """The request's span, child of the caller's trace context; its own context replaces that upstream."""
        carrier = {}
        for name, value in request.headers:
            if name in _CONTEXT_HEADERS:
                carrier[name.decode()] = value.decode("latin-1")
        parent = self._propagator.extract(carrier) if carrier else None
        method = request.method.decode("latin-1")
        attributes = {
            "rampmeter.request_id": ex.request_id.decode("ascii"),
            "http.request.method": method,
            "url.path": request.path[:256].decode("latin-1"),
            "network.protocol.version": request.http_version,
        }
        span = self._tracer.start_span(method, context=parent, kind=self._server, attributes=attributes)
        out: dict[str, str] = {}
        self._propagator.inject(out, context=self._in_context(span))
        headers = [h for h in request.headers if h[0] not in _CONTEXT_HEADERS]
        headers += [(k.encode(), v.encode("latin-1")) for k, v in out.items()]
        request.headers[:] = headers  # what goes upstream names this span as the parent
        return RequestSpan(span, self._error, self.upstream_name)

    def shutdown(self) -> None:
        """Export what is batched (at exit)."""
        self.provider.shutdown()


class RequestSpan:
    """One request's span; `trace_id` for the access line."""

    __slots__ = ("_error", "_upstream_name", "span", "trace_id")

    def __init__(self, span, error_status, upstream_name=str) -> None:
        self.span = span
        self._error = error_status
        self._upstream_name = upstream_name
        self.trace_id = f"{span.get_span_context().trace_id:032x}"

    def admitted(self, queue_ms: float) -> None:
        now = time.time_ns()
        if queue_ms > 0:
            self.span.add_event("queued", timestamp=now - int(queue_ms * 1e6))
        self.span.add_event("admitted", {"rampmeter.queue_ms": round(queue_ms, 3)}, timestamp=now)

    def end(self, ex, error: BaseException | None) -> None:
        span = self.span
        if ex.first_byte_at is not None and ex.service_ms is not None:  # the upstream answered (not our 502/504)
            # first_byte_at is trio time; the event's wall time is placed back from now by the difference.
            ago_s = trio.current_time() - ex.first_byte_at
            span.add_event("upstream first byte", timestamp=time.time_ns() - int(ago_s * 1e9))
        ticket = ex.ticket
        attributes = {"http.response.status_code": ex.status}
        if ticket is not None:
            attributes["rampmeter.class"] = ticket.klass
            attributes["rampmeter.cost"] = ticket.cost.units
        if ex.queue_ms is not None:
            attributes["rampmeter.queue_ms"] = round(ex.queue_ms, 3)
        if ex.reason:
            attributes["rampmeter.reason"] = ex.reason
        if ex.upstream is not None:
            attributes["rampmeter.upstream"] = self._upstream_name(ex.upstream)
        span.set_attributes(attributes)
        if ex.status >= 500:
            span.set_status(self._error, ex.reason or f"status {ex.status}")
        span.add_event("done")
        span.end()
