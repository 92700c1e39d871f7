"""h2frames.cut: the common received frames without hyperframe, the rest left to hyperframe as before."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import pytest
from hyperframe.frame import DataFrame, HeadersFrame, PingFrame, PriorityFrame, WindowUpdateFrame

from proxy.http import h2frames, upstream_h2


def _cut(frame) -> tuple[object, bytearray]:
    raw = bytearray(frame.serialize())
    length = int.from_bytes(raw[:3], "big")
    sid = int.from_bytes(raw[5:9], "big") & 0x7FFFFFFF
    return h2frames.cut(raw, length, raw[3], raw[4], sid), raw


def test_common_frames_are_cut_with_what_h2_reads():
    data = DataFrame(3, b"payload", flags=["END_STREAM"])
    got, rest = _cut(data)
    assert isinstance(got, h2frames.DataIn) and not rest
    assert (got.stream_id, got.data, got.flow_controlled_length) == (3, b"payload", data.flow_controlled_length)
    assert "END_STREAM" in got.flags and repr(got) == "DataFrame"

    headers, _ = _cut(HeadersFrame(5, b"\x88", flags=["END_HEADERS"]))
    assert isinstance(headers, h2frames.HeadersIn) and headers.data == b"\x88"
    assert "END_HEADERS" in headers.flags and "END_STREAM" not in headers.flags and "PRIORITY" not in headers.flags

    window, _ = _cut(WindowUpdateFrame(0, window_increment=1000))
    assert isinstance(window, h2frames.WindowIn) and (window.stream_id, window.window_increment) == (0, 1000)

    ping, _ = _cut(PingFrame(0, opaque_data=b"12345678", flags=["ACK"]))
    assert isinstance(ping, h2frames.PingIn) and ping.opaque_data == b"12345678" and "ACK" in ping.flags


@pytest.mark.parametrize(
    "frame",
    [
        DataFrame(1, b"x", pad_length=3, flags=["PADDED"]),  # padding: hyperframe checks it
        HeadersFrame(1, b"\x88"),  # no END_HEADERS: a CONTINUATION follows
        HeadersFrame(1, b"\x88", flags=["END_HEADERS", "PRIORITY"]),
        PriorityFrame(1),  # any other type
    ],
)
def test_anything_else_is_left_in_the_buffer_for_hyperframe(frame):
    got, rest = _cut(frame)
    assert got is None and bytes(rest) == frame.serialize()


def test_invalid_lengths_and_ids_are_left_for_hyperframe_to_refuse():
    bad = [
        h2frames.head(4, 0x8, 0, 0) + b"\x00\x00\x00\x00",  # WINDOW_UPDATE increment 0
        h2frames.head(5, 0x8, 0, 0) + b"\x00\x00\x00\x01\x00",  # WINDOW_UPDATE of 5 bytes
        h2frames.head(8, 0x6, 0, 1) + b"12345678",  # PING on a stream
        h2frames.head(7, 0x6, 0, 0) + b"1234567",  # PING of 7 bytes
        h2frames.head(1, 0x0, 0, 0) + b"x",  # DATA on stream 0
    ]
    for raw in bad:
        buf = bytearray(raw)
        sid = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
        assert h2frames.cut(buf, int.from_bytes(buf[:3], "big"), buf[3], buf[4], sid) is None
        assert bytes(buf) == raw


def _events(conn, data: bytes) -> list:
    return [repr(e) for e in conn.receive_data(data)]


def test_the_upstream_client_sees_the_same_events_as_plain_h2():
    """A server's response bytes (HEADERS, DATA, trailers, WINDOW_UPDATE, PING) through the client's
    cutting buffer give h2's events exactly as hyperframe's parse does."""
    config = h2.config.H2Configuration(client_side=True, header_encoding=None)
    plain, ours = h2.connection.H2Connection(config), upstream_h2._ClientState(config, {})
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    server.initiate_connection()
    for client in (plain, ours):
        client.initiate_connection()
        client.send_headers(1, [(b":method", b"POST"), (b":path", b"/"), (b":scheme", b"http"), (b":authority", b"a")])
        client.send_data(1, b"request", end_stream=True)
    server.receive_data(plain.data_to_send())
    ours.data_to_send()
    server.send_headers(1, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    server.send_data(1, b"\x00\x00\x00\x00\x02hi")
    server.increment_flow_control_window(4096)
    server.ping(b"pingdata")
    server.send_headers(1, [(b"grpc-status", b"0")], end_stream=True)
    wire = server.data_to_send()
    seen = _events(ours, wire)
    assert seen == _events(plain, wire)
    kinds = [e.split()[0].lstrip("<") for e in seen]
    for kind in (
        "ResponseReceived",
        "DataReceived",
        "WindowUpdated",
        "PingReceived",
        "TrailersReceived",
        "StreamEnded",
    ):
        assert kind in kinds
    assert ours.data_to_send() == plain.data_to_send()  # the SETTINGS and PING ACKs
