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


def quiet(frame):
    """The same frame, of its QUIET subclass where it has one (hyperframe frames have no __slots__:
    same layout, so the class can be swapped in place)."""
    cls = QUIET.get(frame.__class__)
    if cls is not None:
        frame.__class__ = cls
    return frame


def quiet_dispatch(table: dict) -> None:
    """Make an h2 connection's frame dispatch table take QUIET's subclasses as their bases."""
    for base, cls in QUIET.items():
        if base in table:
            table[cls] = table[base]
