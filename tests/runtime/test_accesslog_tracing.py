"""Tracing (OpenTelemetry), in virtual time: one span per request, the caller's trace continued.

Spans go to the SDK's InMemorySpanExporter through a SimpleSpanProcessor (exported at
`end()`, so each test sees them at once). Off, nothing of OpenTelemetry is imported.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import trio
import trio.testing
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from proxy.http.messages import header_value
from proxy.runtime import tracing
from tests.runtime.test_accesslog_edge import call, fields_of, logged
from tests.runtime.test_request_path_deadlines import chat, policy, stack

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    return exporter, tracing.Tracing([SimpleSpanProcessor(exporter)], version="test")


async def test_a_span_continues_the_callers_trace_and_is_the_parent_upstream(autojump_clock, spans, caplog):
    caplog.set_level(logging.INFO, logger="rampmeter.access")
    exporter, tracer = spans
    async with stack(logged()) as s:
        s.app.edge.tracing = tracer
        pipe = call(s, chat(4), ("traceparent", TRACEPARENT), ("tracestate", "vendor=1"), ("x-request-id", "t-1"))
        assert (await pipe.answer())[0] == 200
    (span,) = exporter.get_finished_spans()
    ctx = span.get_span_context()
    assert f"{ctx.trace_id:032x}" == TRACE_ID and f"{span.parent.span_id:016x}" == PARENT_ID
    assert span.kind is SpanKind.SERVER and span.name == "POST"
    sent = s.pool.forwarded[0]
    # Upstream: the same trace, this span as the parent; the caller's tracestate kept; one of each.
    assert [k for k, _ in sent].count(b"traceparent") == 1
    assert header_value(sent, b"traceparent").decode() == f"00-{TRACE_ID}-{ctx.span_id:016x}-01"
    assert header_value(sent, b"tracestate") == b"vendor=1"
    assert [e.name for e in span.events] == ["admitted", "upstream first byte", "done"]  # no wait: no "queued"
    attrs = span.attributes
    assert (attrs["rampmeter.request_id"], attrs["rampmeter.class"], attrs["http.response.status_code"]) == (
        "t-1",
        "interactive",
        200,
    )
    assert attrs["rampmeter.cost"] == s.app.scheduler.estimate("/v1/chat/completions", chat(4)).units
    assert attrs["rampmeter.queue_ms"] == 0.0 and "rampmeter.reason" not in attrs
    assert attrs["rampmeter.upstream"] == "0"  # the app names it by its address (metrics' upstream label)
    assert span.resource.attributes["service.name"] == "rampmeter"
    (record,) = [r for r in caplog.records if r.name == "rampmeter.access"]
    assert fields_of(record.getMessage())["trace_id"] == TRACE_ID  # the line leads to the trace


async def test_a_queued_request_has_a_queued_event_and_a_rejection_its_reason(autojump_clock, spans):
    exporter, tracer = spans
    async with stack(policy(limit=1)) as s:
        s.app.edge.tracing = tracer
        first = call(s, chat(40))
        await trio.testing.wait_all_tasks_blocked()
        queued = call(s, chat(4))
        await trio.testing.wait_all_tasks_blocked()
        await first.answer()
        await queued.answer()
        refused = call(s, chat(100), ("x-request-timeout-ms", "5"))
        assert (await refused.answer())[0] == 503
    by_id = {span.attributes["rampmeter.request_id"]: span for span in exporter.get_finished_spans()}
    waited = by_id[queued.header("x-request-id")]
    events = {e.name: e.timestamp for e in waited.events}
    assert list(events) == ["queued", "admitted", "upstream first byte", "done"]
    # Wall-clock nanoseconds: the queued event is placed back by the queue time.
    assert events["admitted"] - events["queued"] == pytest.approx(
        waited.attributes["rampmeter.queue_ms"] * 1e6, rel=1e-3
    )
    assert waited.attributes["rampmeter.queue_ms"] > 100
    rejected = by_id[refused.header("x-request-id")]
    assert rejected.attributes["rampmeter.reason"] == "deadline_unmeetable"
    assert [e.name for e in rejected.events] == ["done"]
    assert rejected.status.status_code is StatusCode.ERROR  # a 503: the caller did not get an answer
    assert header_value(s.pool.forwarded[0], b"traceparent") is not None  # no caller context: a new trace


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_the_standard_variables_turn_it_on(env, wanted):
    assert tracing.wanted(env) is wanted
    made = tracing.from_environment(env)
    assert (made is not None) is wanted
    if made is not None:
        made.shutdown()  # its batch thread; nothing to export


def test_the_service_name_is_the_operators_where_given(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "llm-sidecar")
    made = tracing.Tracing([], version="1.2")
    assert made.provider.resource.attributes["service.name"] == "llm-sidecar"
    assert made.provider.resource.attributes["service.version"] == "1.2"


def test_the_exporter_follows_the_protocol_variable():
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    assert isinstance(tracing._exporter("otlp", {}), Http)  # the spec's default: http/protobuf
    assert isinstance(tracing._exporter("otlp", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}), Grpc)
    with pytest.raises(ValueError, match="zipkin"):
        tracing._exporter("zipkin", {})


def test_without_the_extra_asking_for_traces_warns_once_and_stays_off(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace.export", None)  # import fails: not installed
    assert tracing.from_environment({"OTEL_TRACES_EXPORTER": "otlp"}) is None
    assert "rampmeter[sidecar,tracing]" in caplog.text


def test_off_nothing_of_opentelemetry_is_imported():
    code = (
        "import sys\n"
        "from proxy.app import App\n"
        "from proxy.policy.schema import Policy\n"
        "from proxy.runtime.reload import PolicyVersion\n"
        "app = App(Policy(), PolicyVersion('t', 1, '', 0.0))\n"
        "assert app.edge.tracing is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
