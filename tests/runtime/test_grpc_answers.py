"""The gRPC shape of the sidecar's own answers (proxy/runtime/grpc_answers.py), reason by reason."""

from __future__ import annotations

import pytest
import trio

from proxy.core import grpc_wire, wire
from proxy.core.decisions import Reject
from proxy.http.messages import Request
from proxy.runtime.grpc_answers import GrpcAnswers, for_request, reshape

CODES = {
    wire.Reason.QUEUE_FULL: 14,
    wire.Reason.CLASS_QUEUE_FULL: 14,
    wire.Reason.OVERLOADED: 14,
    wire.Reason.NOT_READY: 14,
    wire.Reason.DRAINING: 14,
    wire.Reason.TENANT_QUOTA: 8,
    wire.Reason.DEADLINE_UNMEETABLE: 4,
    wire.Reason.DEADLINE_EXPIRED: 4,
    wire.Reason.UPSTREAM_UNAVAILABLE: 14,
    wire.Reason.UPSTREAM_TIMEOUT: 4,
}


@pytest.mark.parametrize(("reason", "code"), CODES.items(), ids=[r.value for r in CODES])
def test_each_reason_is_its_grpc_status_trailers_only(reason, code):
    retry_ms = 1234 if reason in wire.RETRYABLE_REASONS else None
    status, headers, body = reshape(*Reject(reason, retry_ms, "why it was refused").response(), b"application/grpc")
    fields = dict(headers)
    assert (status, body) == (200, b"")
    assert fields[b"grpc-status"] == b"%d" % code
    assert fields[b"grpc-message"] == f"rampmeter {reason.value}: why it was refused".encode()
    assert fields[b"x-rampmeter-reason"] == reason.value.encode()
    if retry_ms is not None:
        assert fields[b"grpc-retry-pushback-ms"] == b"1234"  # the same jittered wait as the HTTP answer
    elif reason in (wire.Reason.UPSTREAM_UNAVAILABLE, wire.Reason.UPSTREAM_TIMEOUT):
        assert b"grpc-retry-pushback-ms" not in fields  # the client's own retry policy decides
    else:
        assert fields[b"grpc-retry-pushback-ms"] == b"-1"  # a retry as it stands cannot help


def test_the_upstreams_own_answers_pass_untouched():
    assert reshape(200, [(b"grpc-status", b"0")], b"", b"application/grpc") is None
    assert reshape(503, [(b"content-type", b"text/plain")], b"busy", b"application/grpc") is None
    assert reshape(503, [(b"x-rampmeter-reason", b"made-up")], b"", b"application/grpc") is None


class Sink:
    headers_sent = False

    def __init__(self) -> None:
        self.answers: list = []

    async def respond(self, status, headers, body=b""):
        self.answers.append((status, headers, body))

    async def start(self, status, headers):
        self.answers.append(("start", status, headers))

    async def send(self, data):
        self.answers.append(("send", data))

    async def end(self):
        self.answers.append(("end",))

    async def trailers(self, headers):
        self.answers.append(("trailers", headers))


def request(content_type: bytes | None) -> Request:
    headers = [] if content_type is None else [(b"content-type", content_type)]
    return Request(b"POST", b"/m", headers, None, http_version="2")  # type: ignore[arg-type]


async def test_only_grpc_requests_are_wrapped_and_the_content_type_is_kept():
    sink = Sink()
    assert for_request(request(b"application/json"), sink) is sink
    assert for_request(request(None), sink) is sink
    wrapped = for_request(request(b"application/grpc+proto"), sink)
    assert isinstance(wrapped, GrpcAnswers)
    await wrapped.respond(*Reject(wire.Reason.TENANT_QUOTA, 500, "slow down").response())
    status, headers, _ = sink.answers[0]
    assert status == 200 and (b"content-type", b"application/grpc+proto") in headers
    assert grpc_wire.status_of(headers) == grpc_wire.Code.RESOURCE_EXHAUSTED


async def test_a_pushback_that_outlasts_the_grpc_timeout_says_do_not_retry(autojump_clock):
    sink = Sink()
    req = request(b"application/grpc")
    req.headers.append((b"grpc-timeout", b"800m"))
    wrapped = for_request(req, sink)
    await wrapped.respond(*Reject(wire.Reason.QUEUE_FULL, 500, "full").response())  # 500 < 800 left: in time
    await trio.sleep(0.4)  # 400 ms left now (it waited in the queue)
    await wrapped.respond(*Reject(wire.Reason.CLASS_QUEUE_FULL, 500, "full").response())
    pushbacks = [dict(h)[b"grpc-retry-pushback-ms"] for _, h, _ in sink.answers]
    assert pushbacks == [b"500", b"-1"]  # the second retry would start after the deadline


async def test_a_relayed_answer_goes_to_the_wrapped_sink_as_it_is():
    sink = Sink()
    wrapped = for_request(request(b"application/grpc"), sink)
    await wrapped.start(200, [(b"content-type", b"application/grpc")])
    await wrapped.send(grpc_wire.frame(b"reply"))
    await wrapped.trailers([(b"grpc-status", b"0")])
    await wrapped.respond(200, [(b"grpc-status", b"5")])  # the upstream's own trailers-only answer
    assert sink.answers == [
        ("start", 200, [(b"content-type", b"application/grpc")]),
        ("send", grpc_wire.frame(b"reply")),
        ("trailers", [(b"grpc-status", b"0")]),
        (200, [(b"grpc-status", b"5")], b""),
    ]


async def test_the_first_content_type_and_grpc_timeout_count():
    req = request(b"application/grpc; charset=x")
    req.headers += [(b"grpc-timeout", b"1S"), (b"content-type", b"text/plain"), (b"grpc-timeout", b"1m")]
    before = trio.current_time()
    wrapped = for_request(req, Sink())
    assert isinstance(wrapped, GrpcAnswers) and wrapped._content_type == b"application/grpc"
    assert wrapped._deadline is not None and 0.99 < wrapped._deadline - before < 1.01  # 1S, not 1m
