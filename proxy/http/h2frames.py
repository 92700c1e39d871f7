"""HTTP/2 HEADERS, CONTINUATION and DATA frames serialised without h2's frame objects.

Why: h2's send_headers / send_data build a hyperframe object per frame (flags as a set of
strings, a validation pass, several debug-log calls) and serialise it; for a proxied
request that was about a fifth of the h2c transport's CPU. Our callers (h2stream's sink,
upstream_h2's request) move h2's state machines and windows themselves, exactly as
those calls would (tests/contract/test_h2_internals.py pins what they touch), and hand
the bytes on in order.

Pure: bytes in, bytes out (RFC 9113 4.1: a 9-byte header, the 24-bit length as its
high 16 and low 8 bits, then the payload; no padding, no priority).

Received frames: h2 logs each one at trace level with `repr(frame)` evaluated first, whether
or not anything logs; hyperframe's repr (flags, body) was ~4% of an h2c request's CPU on the
server and ~3% of a gRPC call's on the upstream client. `QUIET` maps each hyperframe class to
a subclass whose repr is its class name; both connections' frame buffers hand h2 those
(`quiet(frame)`), and `quiet_dispatch` lets h2 dispatch them as their bases.

The commonest received frames need no hyperframe object at all (`cut`): an unpadded DATA, a
whole unpadded HEADERS block without priority, a WINDOW_UPDATE and a PING are cut from the
buffer into `DataIn` / `HeadersIn` / `WindowIn` / `PingIn`, which carry exactly the
attributes h2's `_receive_*_frame` handlers read (`flags` as a frozenset of hyperframe's flag
names, so `"END_STREAM" in frame.flags` reads as before). Hyperframe's parse, its per-frame
Flags set and the frame header's memoryview copies were ~10% of a gRPC call's CPU through
the sidecar (py-spy, both connections). Everything `cut` does not take whole (padding,
priority, a CONTINUATION pending, a bad length, stream id 0 where one is required, a
WINDOW_UPDATE increment of 0, any other type) is left in the buffer for hyperframe, which
raises exactly what it raised before; so every validation stays where it was.

Only the upstream client cuts (upstream_h2._QuietFrames). The h2c server did too, and
tests/security/test_h2_control_flood.py's bystanders then failed their p99 bound under a PING,
WINDOW_UPDATE or empty-DATA flood on a loaded machine (2 of 3 and 1 of 3 runs, main 0 of 6):
cheaper flood frames bring each flooding connection to its budget, its GOAWAY and its
reconnect sooner, and the accept path is the dearer part. So the server's frames still go
through hyperframe (its request heads have their own cut: h2server._WholeHeaders).
"""

from __future__ import annotations

import struct

import hyperframe.frame

_HEAD = struct.Struct(">HBBBL")
DATA, HEADERS, CONTINUATION = 0x0, 0x1, 0x9
END_STREAM, END_HEADERS = 0x1, 0x4


def head(length: int, kind: int, flags: int, stream_id: int) -> bytes:
    return _HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


def header_block(stream_id: int, block: bytes, end_stream: bool, max_frame: int) -> bytes:
    """HEADERS carrying `block` (CONTINUATIONs past `max_frame`), END_STREAM on the first if asked."""
    size = len(block)
    flags = END_STREAM if end_stream else 0
    if size <= max_frame:
        return head(size, HEADERS, flags | END_HEADERS, stream_id) + block
    parts: list[bytes] = []
    for offset in range(0, size, max_frame):
        piece = block[offset : offset + max_frame]
        kind = HEADERS if offset == 0 else CONTINUATION
        bits = (flags if offset == 0 else 0) | (END_HEADERS if offset + max_frame >= size else 0)
        parts += (head(len(piece), kind, bits, stream_id), piece)
    return b"".join(parts)


def data(stream_id: int, payload: bytes | memoryview, end_stream: bool, max_frame: int) -> tuple[list, int]:
    """DATA frames for `payload` (one empty frame for an empty one), END_STREAM on the last if asked:
    (the parts to join, in order; the number of frames)."""
    size = len(payload)
    parts: list[bytes | memoryview] = []
    offset = 0
    while True:
        n = min(max_frame, size - offset)
        last = offset + n == size
        parts += (head(n, DATA, END_STREAM if end_stream and last else 0, stream_id), payload[offset : offset + n])
        offset += n
        if last:
            return parts, len(parts) // 2


_WINDOW_UPDATE, _PING = 0x8, 0x6
_PADDED, _PRIORITY, _ACK = 0x8, 0x20, 0x1
_FLAG_SETS = {
    0: frozenset(),
    END_STREAM: frozenset({"END_STREAM"}),
    END_HEADERS: frozenset({"END_HEADERS"}),
    END_STREAM | END_HEADERS: frozenset({"END_STREAM", "END_HEADERS"}),
}
_ACK_FLAGS = frozenset({"ACK"})


class DataIn:
    """A received DATA frame without padding: what h2's `_receive_data_frame` reads."""

    __slots__ = ("data", "flags", "flow_controlled_length", "stream_id")

    def __init__(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        self.stream_id, self.data = stream_id, data
        self.flags = _FLAG_SETS[END_STREAM if end_stream else 0]
        self.flow_controlled_length = len(data)

    def __repr__(self) -> str:
        return "DataFrame"


class HeadersIn:
    """A received HEADERS frame with a whole block, no padding or priority: what `_receive_headers_frame` reads."""

    __slots__ = ("data", "flags", "stream_id")

    def __init__(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        self.stream_id, self.data = stream_id, data
        self.flags = _FLAG_SETS[(END_STREAM if end_stream else 0) | END_HEADERS]

    def __repr__(self) -> str:
        return "HeadersFrame"


class WindowIn:
    """A received WINDOW_UPDATE (4 bytes, increment >= 1): what `_receive_window_update_frame` reads."""

    __slots__ = ("flags", "stream_id", "window_increment")

    def __init__(self, stream_id: int, increment: int) -> None:
        self.stream_id, self.window_increment = stream_id, increment
        self.flags = _FLAG_SETS[0]

    def __repr__(self) -> str:
        return "WindowUpdateFrame"


class PingIn:
    """A received PING (8 bytes, stream 0): what `_receive_ping_frame` reads."""

    __slots__ = ("flags", "opaque_data", "stream_id")

    def __init__(self, opaque_data: bytes, ack: bool) -> None:
        self.stream_id, self.opaque_data = 0, opaque_data
        self.flags = _ACK_FLAGS if ack else _FLAG_SETS[0]

    def __repr__(self) -> str:
        return "PingFrame"


CUT = {
    DataIn: hyperframe.frame.DataFrame,
    HeadersIn: hyperframe.frame.HeadersFrame,
    WindowIn: hyperframe.frame.WindowUpdateFrame,
    PingIn: hyperframe.frame.PingFrame,
}


# What `cut` makes: frames h2 takes as the hyperframe classes they stand for (CUT, quiet_dispatch).
Light = DataIn | HeadersIn | WindowIn | PingIn


def cut(buf: bytearray, length: int, kind: int, flags: int, stream_id: int) -> Light | None:
    """The whole frame at the start of `buf` (header already read: its `length`, `kind`, `flags` and
    31-bit `stream_id`) as a light frame, removed from `buf`; None, `buf` untouched, where hyperframe
    must parse it (module doc). The caller checked that the whole frame is buffered, that its
    length is within SETTINGS_MAX_FRAME_SIZE and that no header block is being assembled."""
    if kind == DATA:
        if flags & _PADDED or not stream_id:
            return None
        frame: Light = DataIn(stream_id, bytes(buf[9 : 9 + length]), bool(flags & END_STREAM))
    elif kind == HEADERS:
        if flags & (_PADDED | _PRIORITY) or not flags & END_HEADERS or not stream_id:
            return None
        frame = HeadersIn(stream_id, bytes(buf[9 : 9 + length]), bool(flags & END_STREAM))
    elif kind == _WINDOW_UPDATE:
        if length != 4:
            return None
        increment = int.from_bytes(buf[9:13], "big")
        if not 1 <= increment <= 0x7FFFFFFF:
            return None
        frame = WindowIn(stream_id, increment)
    elif kind == _PING:
        if length != 8 or stream_id:
            return None
        frame = PingIn(bytes(buf[9:17]), bool(flags & _ACK))
    else:
        return None
    del buf[: 9 + length]
    return frame


def _class_name(frame: object) -> str:
    return type(frame).__name__


def _quiet(cls: type) -> type:
    return type(cls.__name__, (cls,), {"__repr__": _class_name})


QUIET: dict[type, type] = {
    cls: _quiet(cls)
    for cls in (
        hyperframe.frame.HeadersFrame,
        hyperframe.frame.DataFrame,
        hyperframe.frame.WindowUpdateFrame,
        hyperframe.frame.SettingsFrame,
        hyperframe.frame.PingFrame,
        hyperframe.frame.RstStreamFrame,
        hyperframe.frame.PriorityFrame,
        hyperframe.frame.GoAwayFrame,
        hyperframe.frame.ContinuationFrame,
        hyperframe.frame.PushPromiseFrame,
    )
}


def quiet(frame: hyperframe.frame.Frame) -> hyperframe.frame.Frame:
    """The same frame, of its QUIET subclass where it has one (hyperframe frames have no __slots__:
    same layout, so the class can be swapped in place)."""
    cls = QUIET.get(frame.__class__)
    if cls is not None:
        frame.__class__ = cls
    return frame


def quiet_dispatch(table: dict) -> None:
    """Make an h2 connection's frame dispatch table take QUIET's subclasses and CUT's light frames as
    the hyperframe classes they stand for."""
    for base, cls in QUIET.items():
        if base in table:
            table[cls] = table[base]
    for cls, base in CUT.items():
        table[cls] = table[base]
