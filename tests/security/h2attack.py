"""Hand-made HTTP/2 for the h2 attack tests: raw frames over a blocking socket, and a frame reader.

Theory of operation: an attack writes frames it builds itself (hyperframe, or raw bytes
where the attack is a malformed header) on a socket from `harness.connect`, so nothing
in a client library smooths the attack out. `FrameReader` reads what the sidecar answers
frame by frame (no HPACK state needed: an attack test asserts GOAWAY and RST_STREAM codes;
`RawH2.responses()` decodes response heads with the client's own HPACK decoder when it
has one). Every read is bounded by a deadline, so a test never hangs on a silent server.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from tests.security.harness import CHAT, Stack, connect

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
GOAWAY, RST_STREAM, HEADERS, DATA, PING, SETTINGS = 7, 3, 1, 0, 6, 4
ENHANCE_YOUR_CALM, FRAME_SIZE_ERROR, CANCEL, NO_ERROR, PROTOCOL_ERROR = 0xB, 0x6, 0x8, 0x0, 0x1


def ping() -> bytes:
    return PingFrame(0, opaque_data=b"attacker").serialize()


def window_update(sid: int = 0, increment: int = 1) -> bytes:
    return WindowUpdateFrame(sid, window_increment=increment).serialize()


def settings(values: dict[int, int] | None = None) -> bytes:
    return SettingsFrame(0, settings=values or {}).serialize()


def rst(sid: int, code: int = CANCEL) -> bytes:
    return RstStreamFrame(sid, error_code=code).serialize()


def frame_header(length: int, kind: int, flags: int, sid: int) -> bytes:
    return struct.pack(">I", length)[1:] + bytes([kind, flags]) + struct.pack(">I", sid & 0x7FFFFFFF)


@dataclass
class Frame:
    kind: int
    flags: int
    sid: int
    payload: bytes

    @property
    def error_code(self) -> int:
        """GOAWAY: bytes 4-8; RST_STREAM: bytes 0-4."""
        offset = 4 if self.kind == GOAWAY else 0
        return struct.unpack(">I", self.payload[offset : offset + 4])[0]

    @property
    def last_stream_id(self) -> int:
        return struct.unpack(">I", self.payload[:4])[0] & 0x7FFFFFFF


@dataclass
class FrameReader:
    """Frames from a blocking socket; `eof` once the peer closed (or reset) the connection."""

    sock: socket.socket
    buf: bytearray = field(default_factory=bytearray)
    eof: bool = False

    def read(self, until_s: float) -> list[Frame]:
        """Whatever arrives before `until_s` (time.monotonic()), at least one read's worth when data is there."""
        frames: list[Frame] = []
        while not self.eof:
            left = until_s - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(min(left, 0.5))
            try:
                data = self.sock.recv(262_144)
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                self.eof = True
                break
            if not data:
                self.eof = True
                break
            self.buf += data
            frames += self._parse()
            if frames:
                break
        return frames

    def until(self, predicate, timeout_s: float) -> list[Frame]:
        """Read until `predicate(all frames so far)` holds, the peer closes, or the timeout; all frames read."""
        deadline = time.monotonic() + timeout_s
        seen: list[Frame] = []
        while time.monotonic() < deadline and not self.eof and not predicate(seen):
            seen += self.read(deadline)
        return seen

    def _parse(self) -> list[Frame]:
        out = []
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + length:
                break
            kind, flags = self.buf[3], self.buf[4]
            sid = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            out.append(Frame(kind, flags, sid, bytes(self.buf[9 : 9 + length])))
            del self.buf[: 9 + length]
        return out


def goaway_of(frames: list[Frame]) -> Frame | None:
    return next((f for f in frames if f.kind == GOAWAY), None)


class RawH2:
    """A client connection: the preface and SETTINGS from h2, then whatever the attack sends."""

    def __init__(self, stack: Stack, settings_values: dict[int, int] | None = None, timeout_s: float = 5.0) -> None:
        self.sock = connect(stack, timeout_s)
        # No client-side checks: an attacker sends whatever it likes.
        config = h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False, normalize_outbound_headers=False
        )
        self.h2 = h2.connection.H2Connection(config)
        self.h2.initiate_connection()
        if settings_values:
            self.h2.update_settings(settings_values)
        self.sock.sendall(self.h2.data_to_send())
        self.reader = FrameReader(self.sock)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawH2:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def events_until(self, predicate, timeout_s: float) -> list[h2.events.Event]:
        """Decoded events (the client's h2 state) until `predicate(events so far)`, EOF or the timeout.

        What h2 answers by itself (SETTINGS ACK) is sent; received DATA is not acknowledged."""
        deadline = time.monotonic() + timeout_s
        events: list[h2.events.Event] = []
        while not predicate(events):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(min(left, 0.5))
            try:
                data = self.sock.recv(262_144)
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                break
            if not data:
                break
            events += self.h2.receive_data(data)
            out = self.h2.data_to_send()
            if out:
                self.sock.sendall(out)
        return events

    def head(
        self,
        path: bytes = b"/v1/chat/completions",
        method: bytes = b"POST",
        extra: list[tuple[bytes, bytes]] | None = None,
        end_stream: bool = False,
        pseudo: list[tuple[bytes, bytes]] | None = None,
    ) -> tuple[int, bytes]:
        """A HEADERS frame for a new stream, encoded with the client's HPACK state: (stream id, frame bytes).

        `pseudo` replaces the pseudo-header fields as a whole (for malformed requests)."""
        sid = self.h2.get_next_available_stream_id()
        if pseudo is None:
            pseudo = [(b":method", method), (b":path", path), (b":scheme", b"http"), (b":authority", b"attack")]
        self.h2.send_headers(sid, pseudo + (extra or []), end_stream=end_stream)
        return sid, self.h2.data_to_send()

    def chat(self, sid_extra: list[tuple[bytes, bytes]] | None = None, body: bytes | None = None) -> tuple[int, bytes]:
        """A whole chat completion request (HEADERS + DATA with END_STREAM) as bytes."""
        body = body if body is not None else _json(CHAT)
        extra = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *(sid_extra or [])]
        sid, head = self.head(extra=extra)
        data = DataFrame(sid, data=body, flags=["END_STREAM"]).serialize()
        return sid, head + data


def _json(obj: object) -> bytes:
    import json

    return json.dumps(obj).encode()


def headers_frame_raw(sid: int, block: bytes, *, end_headers: bool, end_stream: bool = False) -> bytes:
    flags = (["END_HEADERS"] if end_headers else []) + (["END_STREAM"] if end_stream else [])
    return HeadersFrame(sid, data=block, flags=flags).serialize()


def continuation_raw(sid: int, block: bytes, *, end_headers: bool) -> bytes:
    return ContinuationFrame(sid, data=block, flags=["END_HEADERS"] if end_headers else []).serialize()


def metric(stack: Stack, name: str, **labels: str) -> float:
    """Sum of the sidecar's `name` samples (from /metrics) whose labels include `labels`."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(stack.admin + "/metrics", timeout=5.0).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def log_lines(stack: Stack, needle: str) -> list[str]:
    """Lines of the sidecar's log that contain `needle`."""
    stack.sidecar.log()  # flushes
    return [line for line in stack.sidecar.log_path.read_text(errors="replace").splitlines() if needle in line]


def pod_inference_requests(stack: Stack) -> int:
    """Inference requests the sim pod's engine has been given (health checks and probes not counted)."""
    import httpx

    return int(httpx.get(stack.pod.url() + "/sim/stats", timeout=5.0).json()["requests_submitted"])
