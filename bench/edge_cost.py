"""What the data path's edge costs per request: request id, headers, the access line, a span.

    .venv/bin/python -m bench.edge_cost [--quick]

Theory of operation: `proxy.runtime.edge.Edge` wraps a handler that answers 200 at once
(no request path, no sockets), called in a loop in one trio run, so the figure is the
edge's own CPU time per request, in microseconds (process CPU time over N requests,
the best of a few rounds: it survives a busy machine better than wall time). Cases:
the bare handler, the edge with the access log off, on at sample_rate 0.01, on for
every request (text and JSON, written to a file as a container runtime would), and
with tracing on (the SDK, a no-op exporter).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time

import trio

from proxy.http.messages import Request
from proxy.logs import TEXT_FORMAT, JsonFormatter
from proxy.policy.access_log import AccessLog as AccessLogPolicy
from proxy.runtime.accesslog import AccessLog
from proxy.runtime.edge import Edge

BODY = b'{"id": "x", "choices": [{"message": {"content": "hello"}}]}'


class _Body:
    content_length = 0
    received = 64

    async def read_all(self) -> bytes:
        return b""


class _Sink:
    headers_sent = False

    async def respond(self, status, headers, body=b""):
        pass


async def _inner(request, sink, fields=None) -> None:
    request.klass = "interactive"
    await sink.respond(200, [(b"content-type", b"application/json")], BODY)


def _request() -> Request:
    headers = [(b"host", b"x"), (b"content-type", b"application/json"), (b"authorization", b"Bearer k")]
    return Request(b"POST", b"/v1/chat/completions", headers, _Body(), client="10.0.0.7", received_at=1.0)


async def _loop(handler, n: int) -> float:
    sink = _Sink()
    start = time.process_time()
    for _ in range(n):
        await handler(_request(), sink)
    return (time.process_time() - start) / n * 1e6


def _edge(access: AccessLog | None, tracing=None) -> Edge:
    return Edge(_inner, access_log=access, tracing=tracing)


def _tracing():
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    from proxy.runtime.tracing import Tracing

    class Nothing(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    return Tracing([SimpleSpanProcessor(Nothing())], version="bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per round")
    args = parser.parse_args()
    n, rounds = (5_000, 3) if args.quick else (50_000, 5)
    out = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)  # noqa: SIM115 - lives for the run
    handler = logging.StreamHandler(out)
    access_logger = logging.getLogger("rampmeter.access")
    access_logger.addHandler(handler)
    access_logger.setLevel(logging.INFO)
    access_logger.propagate = False

    def log(rate: float, json_format: bool = False) -> AccessLog:
        handler.setFormatter(JsonFormatter() if json_format else logging.Formatter(TEXT_FORMAT))
        return AccessLog(AccessLogPolicy(enabled=True, sample_rate=rate, max_lines_per_s=0), json_format=json_format)

    cases = [
        ("bare handler (no edge)", lambda: _inner),
        ("edge, access log off", lambda: _edge(AccessLog(AccessLogPolicy(enabled=False)))),
        ("edge, access log 1% sampled", lambda: _edge(log(0.01))),
        ("edge, access log every request (text)", lambda: _edge(log(1.0))),
        ("edge, access log every request (json)", lambda: _edge(log(1.0, json_format=True))),
    ]
    try:
        cases.append(("edge, access log off, tracing on (no-op exporter)", lambda: _edge(None, _tracing())))
    except ImportError:
        pass
    print(f"# bench.edge_cost ({'quick' if args.quick else 'full'}): CPU us per request, best of {rounds} x {n}")
    print("| case | CPU us/req |")
    print("|---|---:|")
    for name, make in cases:
        h = make()
        best = min(trio.run(_loop, h, n) for _ in range(rounds))
        print(f"| {name} | {best:.1f} |")
    print(f"(lines written to {out.name})")


if __name__ == "__main__":
    main()
