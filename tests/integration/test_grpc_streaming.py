"""Client and bidirectional gRPC streaming through the sidecar, frame by frame (issue 17 item 4).

A grpcio server (proxy/testing/grpc_servicer.py) and `rampmeter serve --upstream-protocol h2c`
on 127.0.0.1. A streaming call is admitted on its headers and its request messages go upstream
as they arrive (proxy/runtime/passthrough.py), so:
- a bidi call whose client sends message i+1 only after it read reply i works (it would wait
  for ever if the sidecar read the request stream whole before forwarding it);
- a long client stream reaches the servicer while the client is still sending, past every
  flow-control window, and arrives whole;
- a client that cancels mid-stream cancels the upstream call;
- the bounds stay: a request stream past listen.max_body_bytes, or one that stalls past
  listen.body_timeout_s, is ended and its upstream call cancelled, and the sidecar serves on.
Every wait is bounded; the results are compared with the same calls made direct.
"""

from __future__ import annotations

import queue
import time
from pathlib import Path

import grpc
import pytest

from proxy.testing import grpc_servicer as gs

pytestmark = pytest.mark.integration

MAX_BODY = 4 * 1024 * 1024
BODY_TIMEOUT_S = 1.5
POLICY = f"""
[listen]
max_body_bytes = {MAX_BODY}
body_timeout_s = {BODY_TIMEOUT_S}

[warmup]
health_check = "grpc"
grpc_health_service = "test.Echo"
health_interval_s = 0.2

[slow_start]
window_s = 0
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    policy = Path(tmp_path_factory.mktemp("grpc_streaming")) / "policy.toml"
    policy.write_text(POLICY)
    with gs.through_sidecar(str(policy)) as s:
        yield s.echo, s.direct, s.via


def ping_pong(ch: grpc.Channel, n: int) -> tuple[list[bytes], grpc.StatusCode]:
    """A bidi call that sends message i+1 only once reply i came back (at most 5 s each)."""
    turn: queue.Queue[None] = queue.Queue()

    def requests():
        for i in range(n):
            yield b"message-%d" % i
            turn.get(timeout=5)  # raises queue.Empty (the call fails) if the reply never comes

    call = gs.method(ch, "Bidi", "stream_stream")(requests(), timeout=20)
    replies = []
    try:
        for reply in call:
            replies.append(reply)
            turn.put(None)
    except grpc.RpcError:
        pass
    return replies, call.code()


def test_a_bidi_stream_that_waits_for_each_reply_works_as_direct(stack) -> None:
    _, direct, via = stack
    expected = ping_pong(direct, 20)
    assert expected == ([b"message-%d" % i for i in range(20)], grpc.StatusCode.OK)
    assert ping_pong(via, 20) == expected


def test_a_long_client_stream_reaches_the_server_while_the_client_still_sends(stack) -> None:
    echo, direct, via = stack
    message, count = bytes(range(256)) * 60, 200  # 15 KB each, 3 MB: past the 256 KiB and 1 MiB windows

    def requests(seen_by: gs.Servicer, before: int):
        for i in range(count):
            if i == count // 2:  # 1.5 MB sent: the servicer must have had some already
                until = time.monotonic() + 10
                while seen_by.received == before and time.monotonic() < until:
                    time.sleep(0.01)
                assert seen_by.received > before, "nothing reached the upstream while the client streamed"
            yield message

    answers = []
    for ch in (direct, via):
        response, call = gs.method(ch, "ClientCount", "stream_unary").with_call(
            requests(echo.servicer, echo.servicer.received), timeout=30
        )
        answers.append((response, call.code()))
    assert answers[0] == answers[1] == (b"%d %d" % (count, count * len(message)), grpc.StatusCode.OK)


def test_a_client_that_cancels_a_bidi_stream_cancels_the_upstream_call(stack) -> None:
    echo, _, via = stack
    before = echo.servicer.cancelled
    more: queue.Queue[bytes | None] = queue.Queue()
    more.put(b"first")

    def requests():
        while (item := more.get(timeout=10)) is not None:
            yield item

    call = gs.method(via, "Bidi", "stream_stream")(requests(), timeout=20)
    assert next(call) == b"first"
    call.cancel()
    more.put(None)
    assert call.code() is grpc.StatusCode.CANCELLED
    assert _eventually(lambda: echo.servicer.cancelled > before), "the sidecar reset the upstream stream"


def test_a_request_stream_past_max_body_bytes_is_ended_and_its_upstream_call_cancelled(stack) -> None:
    echo, _, via = stack
    before = echo.servicer.calls
    message = b"x" * 65_536
    with pytest.raises(grpc.RpcError) as failed:
        gs.method(via, "ClientCount", "stream_unary")(iter([message] * (MAX_BODY // len(message) + 8)), timeout=20)
    # The servicer answers a client stream only at its end: the sidecar's answer is still the first.
    assert failed.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, failed.value
    assert f"larger than {MAX_BODY} bytes" in failed.value.details()
    assert echo.servicer.calls > before, "the call was admitted and forwarded before the bound was reached"
    assert ping_pong(via, 2) == ([b"message-0", b"message-1"], grpc.StatusCode.OK), "the sidecar serves on"


def test_a_bidi_stream_that_stalls_past_body_timeout_s_is_reset_and_its_upstream_call_cancelled(stack) -> None:
    echo, _, via = stack
    before = echo.servicer.cancelled
    stop: queue.Queue[None] = queue.Queue()

    def requests():
        yield b"only"
        stop.get(timeout=BODY_TIMEOUT_S + 10)  # then nothing: the sidecar's body timeout ends it first

    call = gs.method(via, "Bidi", "stream_stream")(requests(), timeout=30)
    started = time.monotonic()
    assert next(call) == b"only"
    with pytest.raises(grpc.RpcError):
        next(call)
    waited = time.monotonic() - started
    stop.put(None)
    assert call.code() is grpc.StatusCode.CANCELLED  # RST_STREAM CANCEL from the sidecar
    assert waited < BODY_TIMEOUT_S + 5, waited
    assert _eventually(lambda: echo.servicer.cancelled > before), "the upstream call was cancelled"


def _eventually(check, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_a_unary_message_past_max_body_bytes_is_resource_exhausted_for_a_grpc_client(stack) -> None:
    """Issue 17: a request past listen.max_body_bytes gets gRPC's answer (trailers-only, status 8), not an
    HTTP 413 that grpcio shows as an opaque UNKNOWN/INTERNAL; the servicer never sees the call."""
    echo, _, via = stack
    before = echo.servicer.calls
    with pytest.raises(grpc.RpcError) as failed:
        gs.method(via, "Unary")(b"x" * (MAX_BODY + 1), timeout=20)
    assert failed.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, failed.value
    assert f"larger than {MAX_BODY} bytes" in failed.value.details()
    assert "listen.max_body_bytes" in failed.value.details()
    assert echo.servicer.calls == before, "a body read whole before admission never reached the servicer"
    assert gs.method(via, "Unary")(b"small", timeout=10) == b"small", "the sidecar serves on"


def test_a_bidi_stream_past_max_body_bytes_after_its_reply_started_is_resource_exhausted(stack) -> None:
    """The response had started (the servicer echoed the first messages) when the request stream passed
    listen.max_body_bytes: the client still gets gRPC's answer, RESOURCE_EXHAUSTED in trailers after the
    replies it had, not a reset (RST_STREAM INTERNAL, which grpcio shows as INTERNAL); the upstream call is
    cancelled and the sidecar serves on."""
    echo, _, via = stack
    before = echo.servicer.cancelled
    message = b"y" * 65_536
    first_reply: queue.Queue[None] = queue.Queue()

    def requests():
        yield message
        first_reply.get(timeout=10)  # the response has started: its head and a reply are on the wire
        yield from [message] * (MAX_BODY // len(message) + 8)

    call = gs.method(via, "Bidi", "stream_stream")(requests(), timeout=20)
    replies = 0
    with pytest.raises(grpc.RpcError) as failed:
        for reply in call:
            assert reply == message
            replies += 1
            if replies == 1:
                first_reply.put(None)
    assert failed.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, failed.value
    assert f"larger than {MAX_BODY} bytes" in failed.value.details()
    assert "listen.max_body_bytes" in failed.value.details()
    assert 1 <= replies <= MAX_BODY // len(message), replies
    assert _eventually(lambda: echo.servicer.cancelled > before), "the upstream call was cancelled"
    assert ping_pong(via, 2) == ([b"message-0", b"message-1"], grpc.StatusCode.OK), "the sidecar serves on"
