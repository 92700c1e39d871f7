"""proxy.core.grpc_wire against protobuf's own encoding and the gRPC rules it follows (issue 17)."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
from grpc_health.v1 import health_pb2
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import grpc_wire, wire


@given(st.text(max_size=300))
def test_the_health_request_is_protobufs_encoding(service):
    assert grpc_wire.health_request(service) == health_pb2.HealthCheckRequest(service=service).SerializeToString()


@given(st.sampled_from([0, 1, 2, 3]))
def test_the_health_status_reads_protobufs_encoding(status):
    assert grpc_wire.health_status(health_pb2.HealthCheckResponse(status=status).SerializeToString()) == status


def test_unknown_fields_are_skipped_and_cut_messages_refused():
    assert grpc_wire.health_status(b"\x12\x03abc\x08\x01") == 1  # field 2 (bytes) first, then status
    with pytest.raises(ValueError):
        grpc_wire.health_status(b"\x12\x09ab")
    with pytest.raises(ValueError):
        grpc_wire.unframe(b"\x00\x00\x00\x00\x09abc")
    with pytest.raises(ValueError):
        grpc_wire.unframe(b"\x01\x00\x00\x00\x01a")  # compressed


@given(st.binary(max_size=1000))
def test_frame_round_trips(message):
    assert grpc_wire.unframe(grpc_wire.frame(message)) == message


@pytest.mark.parametrize(
    ("content_type", "grpc"),
    [
        (b"application/grpc", True),
        (b"application/grpc+proto", True),
        (b"Application/GRPC+json; charset=utf-8", True),
        (b"application/grpc-web", False),
        (b"application/json", False),
        (None, False),
    ],
)
def test_is_grpc(content_type, grpc):
    assert grpc_wire.is_grpc(content_type) is grpc


def test_every_reason_has_a_grpc_status():
    assert set(grpc_wire.STATUS_FOR_REASON) == set(wire.Reason)


@given(st.text(max_size=600))
def test_grpc_message_is_percent_encoded_printable_ascii(message):
    encoded = grpc_wire.percent_encode(message)
    assert all(0x20 <= b <= 0x7E for b in encoded)
    if len(message) <= 512:
        assert unquote(encoded.decode("ascii"), errors="strict") == message


@given(st.one_of(st.none(), st.integers(0, 10**7)), st.one_of(st.none(), st.floats(-1e7, 1e7)))
def test_a_pushback_past_the_deadline_becomes_do_not_retry(retry_ms, remaining_ms):
    out = grpc_wire.pushback_within(retry_ms, remaining_ms)
    if retry_ms is not None and remaining_ms is not None and retry_ms >= remaining_ms:
        assert out is None  # the retry would start after the deadline: -1 on the wire
    else:
        assert out == retry_ms  # no deadline, no pushback, or a retry that lands in time: unchanged
    if out is None and retry_ms is not None:
        status, headers, _ = grpc_wire.rejection(wire.Reason.QUEUE_FULL, "full", out)
        assert dict(headers)[grpc_wire.RETRY_PUSHBACK_MS] == b"-1"
