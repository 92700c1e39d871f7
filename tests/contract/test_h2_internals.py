"""The h2 and hpack internals proxy/http relies on still exist (pyproject pins their minor versions).

proxy/http subclasses or reaches into these (not their documented API):
- h2server.py: `_H2State` overrides the `open_inbound_streams` property; `_Inbound` subclasses
  `h2.frame_buffer.FrameBuffer`, reads its `_data` and `max_frame_size`, wraps `__next__`,
  and is installed as the connection's `incoming_buffer`;
- upstream_h2.py: `_GracefulStateMachine` extends `H2ConnectionStateMachine._transitions`
  (keyed by ConnectionState / ConnectionInputs members); `_ClientState` overrides
  `open_outbound_streams` and the connection's `state_machine` is swapped;
- h2stream.py: serialises HEADERS/CONTINUATION/DATA frames itself and moves h2's state as
  send_headers / send_data would: `conn.state_machine.process_input(ConnectionInputs.SEND_HEADERS /
  SEND_DATA)`, `conn.streams[sid].state_machine.process_input(StreamInputs.SEND_HEADERS / SEND_DATA /
  SEND_END_STREAM)`, both objects' `outbound_flow_control_window`, `conn.encoder`; h2server.py reads
  `conn._data_to_send` (h2's pending output) to keep it ahead of those frames; upstream_h2.py
  does the same for requests, opening the stream with `conn._begin_new_stream(sid,
  AllowedStreamIDs.ODD)`, setting its `request_method` / `_authority`, and appending the
  frames to `conn._data_to_send`;
- h2server.py: `_Inbound` swaps each parsed frame's class for a subclass with a cheap repr (hyperframe
  frames have no `__slots__`) and `_H2State` adds those to h2's `_frame_dispatch_table`;
- hpack_memo.py: `VersionedHeaderTable` subclasses `hpack.table.HeaderTable` (its `_maxsize`,
  the `maxsize` property's setter, `dynamic_entries`, `resized`, `add`), and `install` swaps the
  connection's `encoder` / `decoder` (their `header_table`, `max_header_list_size`,
  `max_allowed_table_size`).
A minor release that renames one of these fails here, not in production.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.frame_buffer
import hpack
import hpack.hpack
import hpack.table

from proxy.http import hpack_memo


def test_h2_connection_internals():
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    for name in ("incoming_buffer", "state_machine", "encoder", "decoder", "streams"):
        assert hasattr(conn, name), name
    assert isinstance(conn.incoming_buffer, h2.frame_buffer.FrameBuffer)
    for name in ("open_inbound_streams", "open_outbound_streams"):
        assert isinstance(getattr(h2.connection.H2Connection, name), property), name
    assert isinstance(conn.max_inbound_frame_size, int) and isinstance(conn.max_outbound_frame_size, int)


def test_h2_frame_buffer_internals():
    buf = h2.frame_buffer.FrameBuffer(server=True)
    assert isinstance(buf._data, bytes | bytearray) and isinstance(buf.max_frame_size, int)
    assert callable(h2.frame_buffer.FrameBuffer.__next__)


def test_h2_state_machine_table():
    table = h2.connection.H2ConnectionStateMachine._transitions
    key = (h2.connection.ConnectionState.CLIENT_OPEN, h2.connection.ConnectionInputs.RECV_GOAWAY)
    assert isinstance(table, dict) and key in table
    machine = h2.connection.H2ConnectionStateMachine()
    assert machine.state is h2.connection.ConnectionState.IDLE


def test_hpack_table_internals():
    table = hpack.table.HeaderTable()
    assert isinstance(table._maxsize, int) and table.dynamic_entries is not None and table.resized is False
    assert isinstance(hpack.table.HeaderTable.maxsize, property) and hpack.table.HeaderTable.maxsize.fset is not None
    assert hpack.table.table_entry_size(b"a", b"b") == 34  # RFC 7541 4.1: 32 + name + value
    table.add(b"a", b"b")


def test_hpack_coders_internals():
    enc, dec = hpack.Encoder(), hpack.Decoder()
    assert isinstance(enc.header_table, hpack.table.HeaderTable)
    assert isinstance(dec.header_table, hpack.table.HeaderTable)
    assert isinstance(dec.max_header_list_size, int) and isinstance(dec.max_allowed_table_size, int)
    assert isinstance(hpack.hpack.DEFAULT_MAX_HEADER_LIST_SIZE, int)


def test_the_memo_installs_on_a_fresh_connection_and_round_trips():
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    assert hpack_memo.install(conn)
    assert isinstance(conn.encoder, hpack_memo.MemoEncoder) and isinstance(conn.decoder, hpack_memo.MemoDecoder)
    headers = [(b":method", b"GET"), (b":path", b"/"), (b"x-a", b"1")]
    block = conn.encoder.encode(headers)
    assert [tuple(h) for h in hpack_memo.MemoDecoder().decode(block, raw=True)] == headers


def test_h2_send_state_internals():
    """What h2stream's own frame serialisation moves, exactly as h2's send_headers/send_data would."""
    from h2.connection import ConnectionInputs
    from h2.stream import StreamInputs

    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(
        1, [(":method", "GET"), (":path", "/"), (":scheme", "http"), (":authority", "x")], end_stream=True
    )
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    assert isinstance(server._data_to_send, bytearray) and server._data_to_send
    state = server.streams[1]
    window = state.outbound_flow_control_window
    assert isinstance(window, int) and isinstance(server.outbound_flow_control_window, int)
    server.state_machine.process_input(ConnectionInputs.SEND_HEADERS)
    state.state_machine.process_input(StreamInputs.SEND_HEADERS)
    server.state_machine.process_input(ConnectionInputs.SEND_DATA)
    state.state_machine.process_input(StreamInputs.SEND_DATA)
    state.state_machine.process_input(StreamInputs.SEND_END_STREAM)
    assert state.closed and state.state_machine.headers_sent


def test_h2_client_stream_opening_internals():
    from h2.connection import AllowedStreamIDs

    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    state = client._begin_new_stream(1, AllowedStreamIDs.ODD)
    assert client.streams[1] is state and client.highest_outbound_stream_id == 1
    assert state.request_method is None and state._authority is None
    assert isinstance(client.remote_settings.max_concurrent_streams, int)


def test_h2_frame_dispatch_internals():
    """h2server hands h2 frames of quiet-repr subclasses and adds them to h2's dispatch table."""
    from hyperframe.frame import HeadersFrame

    from proxy.http import h2server

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    assert isinstance(conn._frame_dispatch_table, dict) and HeadersFrame in conn._frame_dispatch_table
    assert not hasattr(HeadersFrame, "__slots__") or "__dict__" in dir(HeadersFrame(1))
    state = h2server._H2State(h2.config.H2Configuration(client_side=False))
    quiet = h2server._QUIET[HeadersFrame]
    assert state._frame_dispatch_table[quiet] == state._frame_dispatch_table[HeadersFrame]
    frame = HeadersFrame(1)
    frame.__class__ = quiet
    assert isinstance(frame, HeadersFrame) and repr(frame) == "HeadersFrame"
