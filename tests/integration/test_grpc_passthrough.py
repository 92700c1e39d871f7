"""gRPC through the sidecar, as direct (issue 17): real grpcio server and client on 127.0.0.1.

One grpcio server (proxy/testing/grpc_servicer.py) and one `rampmeter serve
--upstream-protocol h2c` in front of it, whose readiness is the gRPC health check.
Each call is made direct and through the sidecar and must come back the same:
messages, status code, details, and the application's metadata (the sidecar adds
its own `via`, `x-request-id` and `x-rampmeter-*` entries, which are left out of the comparison).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import grpc
import pytest

from proxy.testing import grpc_servicer as gs

POLICY = """
[warmup]
health_check = "grpc"
grpc_health_service = "test.Echo"
health_interval_s = 0.2

[slow_start]
window_s = 0
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    policy = Path(tmp_path_factory.mktemp("grpc")) / "policy.toml"
    policy.write_text(POLICY)
    with gs.through_sidecar(str(policy)) as s:
        yield s.echo, s.car, s.direct, s.via


def app_metadata(md) -> list[tuple[str, object]]:
    ours = ("via", "x-request-id")  # the sidecar's own entries (x-request-id: proxy/runtime/edge.py)
    return [(m.key, m.value) for m in md or () if m.key not in ours and not m.key.startswith("x-rampmeter-")]


def outcome(ch: grpc.Channel, name: str, kind: str, request, timeout: float = 10.0) -> dict:
    """What a client sees of one call: messages, code, details, initial and trailing metadata."""
    call_fn = gs.method(ch, name, kind)
    if kind.endswith("_stream"):
        call = call_fn(request, timeout=timeout)
        try:
            messages = list(call)
        except grpc.RpcError:
            messages = None
        return {
            "messages": messages,
            "code": call.code(),
            "details": call.details(),
            "initial": app_metadata(call.initial_metadata()),
            "trailing": app_metadata(call.trailing_metadata()),
        }
    try:
        response, call = call_fn.with_call(request, timeout=timeout)
    except grpc.RpcError as exc:
        response, call = None, exc
    return {
        "messages": response,
        "code": call.code(),
        "details": call.details(),
        "initial": app_metadata(call.initial_metadata()),
        "trailing": app_metadata(call.trailing_metadata()),
    }


CASES = [
    ("Unary", "unary_unary", b"hello"),
    ("ServerStream", "unary_stream", b"7"),
    ("Fail", "unary_unary", b"no such model"),
]


@pytest.mark.parametrize(("name", "kind", "request_"), CASES, ids=[c[0] for c in CASES])
def test_calls_come_back_as_direct(stack, name, kind, request_) -> None:
    _, _, direct, via = stack
    expected = outcome(direct, name, kind, request_)
    assert outcome(via, name, kind, request_) == expected
    if name == "Fail":  # an error status with details and binary trailing metadata, from trailers-only
        assert expected["code"] is grpc.StatusCode.INVALID_ARGUMENT
        assert ("x-error-detail-bin", b"\x08\x03detail") in expected["trailing"]
    else:
        assert expected["code"] is grpc.StatusCode.OK
        assert expected["trailing"], "the trailing metadata came through"


def test_client_streaming_and_messages_past_the_flow_control_windows(stack) -> None:
    _, _, direct, via = stack
    parts = [bytes([i]) * 700_000 for i in range(4)]  # 2.8 MB up: past the 64 KiB and 1 MiB windows
    assert outcome(via, "ClientStream", "stream_unary", iter(parts)) == outcome(
        direct, "ClientStream", "stream_unary", iter(parts)
    )
    big = outcome(via, "Big", "unary_unary", b"5000000")  # 5 MB down, trailers after held bytes
    assert big == outcome(direct, "Big", "unary_unary", b"5000000")
    assert big["code"] is grpc.StatusCode.OK and len(big["messages"]) == 5_000_000


def test_a_deadline_that_expires_upstream_cancels_the_upstream_call(stack) -> None:
    echo, _, direct, via = stack
    for ch in (direct, via):
        before = echo.servicer.cancelled
        seen = outcome(ch, "Sleep", "unary_unary", b"3000", timeout=0.3)
        assert seen["code"] is grpc.StatusCode.DEADLINE_EXCEEDED
        assert _eventually(lambda b=before: echo.servicer.cancelled > b), "the upstream call was cancelled"


def test_a_client_that_cancels_mid_stream_cancels_the_upstream_call(stack) -> None:
    echo, _, _, via = stack
    before = echo.servicer.cancelled
    call = gs.method(via, "SlowStream", "unary_stream")(b"20", timeout=10)
    got = [next(call), next(call)]
    call.cancel()
    assert got == [b"tick-0", b"tick-1"]
    assert call.code() is grpc.StatusCode.CANCELLED
    assert _eventually(lambda: echo.servicer.cancelled > before), "the sidecar reset the upstream stream"


def test_an_idempotent_replay_keeps_the_trailers(stack) -> None:
    echo, _, _, via = stack
    unary = gs.method(via, "Unary")
    key = (("idempotency-key", f"grpc-replay-{time.monotonic_ns()}"),)
    first, first_call = unary.with_call(b"once", metadata=key, timeout=10)
    calls = echo.servicer.calls
    again, again_call = unary.with_call(b"once", metadata=key, timeout=10)
    assert echo.servicer.calls == calls, "the second call was replayed, not run"
    assert again == first == b"once"
    assert again_call.code() is grpc.StatusCode.OK
    assert app_metadata(again_call.trailing_metadata()) == app_metadata(first_call.trailing_metadata())
    assert ("idempotent-replayed", "true") in [(m.key, m.value) for m in again_call.initial_metadata()]


def http1_exchange(address: str) -> bytes:
    """A gRPC unary call sent as HTTP/1.1 by a client that reads chunked trailers (`te: trailers`)."""
    host, port = address.rsplit(":", 1)
    body = b"\x00\x00\x00\x00\x02hi"
    head = (
        b"POST /test.Echo/Unary HTTP/1.1\r\nhost: x\r\ncontent-type: application/grpc\r\n"
        + b"te: trailers\r\n"
        + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    )
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_an_http1_client_that_asks_gets_the_trailers_chunked(stack) -> None:
    _, car, _, _ = stack
    answer = http1_exchange(car.url("data").removeprefix("http://"))
    assert b"transfer-encoding: chunked" in answer.lower()
    assert answer.endswith(
        b"\r\n0\r\ngrpc-status: 0\r\ngrpc-message: \r\nx-echo-trailer: done\r\nx-echo-bin: AAH/\r\n\r\n"
    )


def _eventually(check, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_a_coalesced_follower_gets_the_leaders_trailers(stack) -> None:
    """Two calls with one idempotency-key at once: the second follows the first's exchange (one call
    upstream) and gets the same messages, status and trailing metadata."""
    echo, _, _, via = stack
    sleep = gs.method(via, "Sleep")
    key = (("idempotency-key", f"grpc-coalesce-{time.monotonic_ns()}"),)
    calls = echo.servicer.calls
    seen: dict[str, tuple] = {}

    def call(name: str) -> None:
        response, c = sleep.with_call(b"600", metadata=key, timeout=10)
        seen[name] = (response, c.code(), app_metadata(c.trailing_metadata()))

    leader = threading.Thread(target=call, args=("leader",))
    leader.start()
    assert _eventually(lambda: echo.servicer.calls > calls), "the leader's call reached the servicer"
    call("follower")  # while the leader's call sleeps upstream
    leader.join()
    assert echo.servicer.calls == calls + 1, "the follower was not run upstream"
    assert seen["follower"] == seen["leader"] == (b"slept", grpc.StatusCode.OK, [("x-slept-ms", "600")])
