"""HTTP/2 cleartext (prior knowledge) upstream connection: many concurrent streams on one socket.

Theory of operation: `H2UpstreamConnection.open(host, port, nursery=...)` connects, sends
the preface and our SETTINGS, starts two tasks in the given nursery and returns
once the peer's SETTINGS arrived and ours were acknowledged (so
`max_streams` and the windows are known). The reader task feeds every received
byte to h2 and turns events into per-stream state, waking the one task that
waits on that stream. Whoever mutates the h2 state machine then calls `_flush()`,
which never awaits: it writes h2's output with one non-blocking write when
nothing is queued ahead, and hands whatever the socket did not take to the
writer task. So a request that is cancelled can never leave half a frame on the
wire, and the common request costs no writer task switch. `send(block, body)` opens a stream, uploads the body
under flow control and returns an `H2Response` once the head arrived;
`receive()` hands back DATA as it came and returns its flow-control credit as it
is consumed (so a slow consumer slows the upstream, never buffers without bound).

Full duplex: a body larger than SMALL_BODY_BYTES, or streamed, is uploaded by a
task in the connection's nursery while the caller waits for the head and reads
the body. Credit stays tied to consumption (memory per stream is bounded by
STREAM_WINDOW) rather than acknowledging DATA on arrival: an upstream that
echoes as it reads fills our window, waits for WINDOW_UPDATE and stops reading
our body, so an upload in the caller's task (nobody consuming) would deadlock;
with the upload apart the caller consumes, the window reopens and both
directions flow at the pace of the slower end. A small body is uploaded inline
(no task): it fits the peer's initial window, or nearly, and a peer cannot echo
more than it read. The uploader's scope is cancelled by `forget()`; an early
answer (413 and END_STREAM before our body) ends the exchange as before. An
error of the uploader (the body iterator raised) becomes the stream's error,
raised to the caller unless the response had already ended.

Invariants:
- `_streams` holds exactly the streams a caller still owns; `forget()` removes
  one once, resetting it with CANCEL unless both sides ended, and returns the
  credit of unread DATA so the connection window never leaks.
- bytes leave in the order h2 produced them (HPACK state depends on it): a
  direct write happens only with `_outbox` empty and the writer idle; the
  writer sends `_outbox` before anything h2 still holds.
- a stream has one reader waiting (head, DATA) and at most one uploader waiting
  (window, flush); each has its own wake-up, so neither steals the other's.
- a stream the peer refused (REFUSED_STREAM, or above GOAWAY's last_stream_id)
  fails with request_sent=False: RFC 9113 8.7 says it was not processed.

h2 4.x closes its connection state machine on a received GOAWAY, so DATA for
streams the peer promised to finish would raise (python-hyper/h2#1181);
`_GracefulStateMachine` keeps it open and we refuse new streams ourselves. h2
also drops its unsent buffer on GOAWAY, so the reader drains it into `_outbox`
before every `receive_data`.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar, Self

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import trio
from h2.connection import AllowedStreamIDs, ConnectionInputs, ConnectionState
from h2.errors import ErrorCodes
from h2.frame_buffer import FrameBuffer
from h2.stream import StreamInputs
from hyperframe.frame import Frame

from proxy.errors import ProtocolError, UpstreamConnectError, UpstreamProtocolError
from proxy.http import h2frames, h2rules, hpack_memo, sockio
from proxy.http.forward import h2_request_headers
from proxy.http.messages import Headers

RECV_BYTES = 65_536
STREAM_WINDOW = 1 << 20  # per-stream receive window we advertise
CONNECTION_WINDOW = 16 << 20
FLUSH_BYTES = 1 << 20  # a body upload waits for the writer past this much queued
SMALL_BODY_BYTES = 65_536  # bytes bodies up to this are uploaded inline; larger or streamed by a task
_LAST_STREAM_ID = 2**31 - 2**16  # past this, stop opening streams and drain
_BYTES_LIKE = (bytes, bytearray, memoryview)

Body = bytes | AsyncIterable[bytes]

_CLIENT_IDS = AllowedStreamIDs.ODD
_CONN_SEND_HEADERS, _CONN_SEND_DATA = ConnectionInputs.SEND_HEADERS, ConnectionInputs.SEND_DATA
_SEND_HEADERS, _SEND_DATA, _SEND_END = StreamInputs.SEND_HEADERS, StreamInputs.SEND_DATA, StreamInputs.SEND_END_STREAM

# Inbound validation is ours (h2rules.parse_response / parse_trailers, one pass, remembered per block):
# h2's own ran seven generator passes per response head (~8% of a gRPC call's CPU through the
# sidecar, py-spy) and made a malformed head a connection error; here it fails that stream only.
_CONFIG = h2.config.H2Configuration(
    client_side=True,
    header_encoding=None,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
    validate_inbound_headers=False,
    normalize_inbound_headers=False,
)


class _GracefulStateMachine(h2.connection.H2ConnectionStateMachine):
    _transitions = {  # h2's table, plus GOAWAY received keeping the connection open for its streams
        **h2.connection.H2ConnectionStateMachine._transitions,
        (ConnectionState.CLIENT_OPEN, ConnectionInputs.RECV_GOAWAY): (None, ConnectionState.CLIENT_OPEN),
    }


def _noop(conn: H2UpstreamConnection) -> None:
    pass


class _ClientState(h2.connection.H2Connection):
    """h2's connection state, counting open outbound streams in O(1).

    h2 checks SETTINGS_MAX_CONCURRENT_STREAMS on every send_headers by scanning all
    its streams (`_open_streams`, which also prunes closed ones): O(streams) per
    request, 1.0 s of 7.4 s of the load generator's CPU at ~290 streams in flight
    (cProfile, h2c against nginx), and the more it falls behind the more it scans.
    Every stream h2 still counts as open is one a caller owns (`forget()` resets a
    stream before dropping it), so the owned count is never below h2's: the check
    stays at least as strict. h2's scan still runs, to prune, once closed streams
    outnumber owned ones (amortised O(1)).
    """

    def __init__(self, config: h2.config.H2Configuration, owned: dict[int, Any]) -> None:
        super().__init__(config=config)
        self._owned = owned
        self.incoming_buffer = _QuietFrames(server=False)  # frames with a cheap repr (h2frames.QUIET)
        h2frames.quiet_dispatch(self._frame_dispatch_table)

    @property
    def open_outbound_streams(self) -> int:
        if len(self.streams) > 2 * len(self._owned) + 32:
            return super().open_outbound_streams  # prunes the closed streams
        return len(self._owned)


class _QuietFrames(FrameBuffer):
    """h2's frame buffer, cutting the common frames without hyperframe (h2frames.cut) and handing
    h2 the rest with a cheap repr (h2frames.quiet)."""

    # A light frame is not a Frame: h2's dispatch takes it as the class it stands for (quiet_dispatch).
    def __next__(self) -> Frame | h2frames.Light:  # type: ignore[override]
        data = self._data
        if len(data) >= 9 and not self._headers_buffer:
            length = int.from_bytes(data[:3], "big")
            if length <= self.max_frame_size and len(data) >= 9 + length:
                sid = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
                frame = h2frames.cut(data, length, data[3], data[4], sid)
                if frame is not None:
                    return frame
        return h2frames.quiet(super().__next__())


class _Stream:
    """One request stream's state, and its two waiters (the reader of the response, the uploader).

    A waiter parks its own task (`wait_task_rescheduled`) and a wake reschedules it: what a
    fresh trio.Event per wait did (an Event and its ParkingLot per wait, twice or more per call),
    without the objects."""

    __slots__ = (
        "_reader",
        "_writer",
        "blocked",
        "chunks",
        "ended",
        "error",
        "headers",
        "id",
        "local_done",
        "reset",
        "status",
        "trailers",
        "uploader",
    )

    def __init__(self, stream_id: int) -> None:
        self.id = stream_id
        self.status: int | None = None
        self.headers: Headers = []
        self.trailers: Headers | None = None  # the trailing HEADERS (gRPC: grpc-status), once received
        self.chunks: deque[tuple[bytes, int]] = deque()  # (data, flow-controlled length)
        self.ended = False  # peer sent END_STREAM
        self.local_done = False  # we sent END_STREAM
        self.reset = False  # RST_STREAM: the peer sent one, or we did for a malformed head (_malformed)
        self.error: BaseException | None = None  # UpstreamProtocolError, or what the uploader raised
        self.blocked = False  # the uploader waits for send window
        self.uploader: trio.CancelScope | None = None  # the upload task's scope while it runs
        self._reader: Any = None  # the task waiting in wait(), until woken or cancelled
        self._writer: Any = None  # the task waiting in wait_writer()

    def wake(self) -> None:
        """New head or DATA: wake the reader."""
        task = self._reader
        if task is not None:
            self._reader = None
            _reschedule(task)

    def wake_all(self) -> None:
        """Ended, reset, failed: wake the reader and the uploader."""
        self.wake()
        self.wake_writer()

    def wake_writer(self) -> None:
        task = self._writer
        if task is not None:
            self._writer = None
            _reschedule(task)

    async def wait(self) -> None:
        self._reader = _current_task()
        await _wait_rescheduled(self._abort_reader)

    async def wait_writer(self) -> None:
        self._writer = _current_task()
        await _wait_rescheduled(self._abort_writer)

    def _abort_reader(self, _: object) -> trio.lowlevel.Abort:
        self._reader = None
        return _ABORTED

    def _abort_writer(self, _: object) -> trio.lowlevel.Abort:
        self._writer = None
        return _ABORTED


_reschedule, _current_task = trio.lowlevel.reschedule, trio.lowlevel.current_task
_wait_rescheduled, _ABORTED = trio.lowlevel.wait_task_rescheduled, trio.lowlevel.Abort.SUCCEEDED


class H2UpstreamConnection:
    def __init__(
        self,
        stream: trio.SocketStream,
        label: str,
        on_change: Callable[[H2UpstreamConnection], None],
        nursery: trio.Nursery,
    ) -> None:
        self._stream = stream
        self._nursery = nursery  # the reader, the writer and body uploaders run here
        self._streams: dict[int, _Stream] = {}
        self._h2 = _ClientState(_CONFIG, self._streams)
        self._h2.state_machine = _GracefulStateMachine()
        hpack_memo.install(self._h2)
        self._fd = stream.socket.fileno()
        self._outbox: list[bytes] = []  # bytes for the writer task, oldest first
        self._queued = 0  # bytes in _outbox
        self._writing = False  # the writer task is inside send_all
        self._wake = trio.Event()
        self._flushed = trio.Event()
        self._settings_seen = self._settings_acked = False
        self._ready = trio.Event()
        self.label = label
        self.on_change = on_change  # told when capacity may have changed (stream ended, GOAWAY, closed)
        self.max_streams = 100
        self.goaway = False  # no new streams: the peer said GOAWAY or ids ran out
        self.closed = False
        self.error: UpstreamProtocolError | None = None
        self.requests = 0
        self.idle_since = trio.current_time()

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        nursery: trio.Nursery,
        label: str = "",
        on_change: Callable[[H2UpstreamConnection], None] = _noop,
    ) -> H2UpstreamConnection:
        """Connect and handshake; bounded by the caller's cancel scope. Tasks run in `nursery`."""
        label = label or f"{host}:{port}"
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise UpstreamConnectError(f"upstream {label}: connect failed: {exc}", upstream=label) from exc
        conn = cls(stream, label, on_change, nursery)
        h = conn._h2
        h.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            },
        )
        h.initiate_connection()
        h.increment_flow_control_window(CONNECTION_WINDOW - 65_535)
        nursery.start_soon(conn._read_loop)
        nursery.start_soon(conn._write_loop)
        conn._flush()
        try:
            await conn._ready.wait()
        except BaseException:
            conn.close()
            raise
        if conn.error is not None:
            raise conn.error
        return conn

    @classmethod
    @asynccontextmanager
    async def connect(cls, host: str, port: int, *, label: str = "") -> AsyncIterator[H2UpstreamConnection]:
        """Standalone use (load generator, tests): a connection with its own nursery."""
        async with trio.open_nursery() as nursery:
            conn = await cls.open(host, port, nursery=nursery, label=label)
            try:
                yield conn
            finally:
                conn.close()

    def has_capacity(self) -> bool:
        return not self.goaway and not self.closed and len(self._streams) < self.max_streams

    @property
    def active_streams(self) -> int:
        return len(self._streams)

    def close(self) -> None:
        """Close the socket now; streams still owned fail. Synchronous (cancel-safe)."""
        if self.closed:
            return
        if self.error is None:  # a clean close: say GOAWAY if the socket takes it at once
            self._h2.close_connection()
            self._flush()
            if self.closed:  # the write failed and _fail() closed it
                return
        self.closed = True
        self._stream.socket.close()
        for s in self._streams.values():
            if not s.ended and s.error is None:
                s.error = UpstreamProtocolError(
                    f"upstream {self.label}: connection lost ({self.error or 'closed'})",
                    upstream=self.label,
                    request_sent=True,
                )
            s.wake_all()
        self._ready.set()
        self._flushed.set()
        self._wake.set()  # lets the writer task see `closed` and end
        self.on_change(self)

    def _fail(self, why: str) -> None:
        if self.error is None:
            self.error = UpstreamProtocolError(f"upstream {self.label}: {why}", upstream=self.label, request_sent=False)
        self.close()

    def _flush(self) -> None:
        """Send what h2 has produced: straight into the socket if it takes it now, else via the writer.

        The synchronous non-blocking write saves the writer's task switch on
        almost every request. Order holds: we write directly only when nothing
        is queued or being written ahead of us.
        """
        if not self._h2._data_to_send or self.closed:  # (data_to_send() makes a new buffer even when empty)
            return
        data = self._h2.data_to_send()
        if self._outbox or self._writing:
            self._queue(data)
            return
        try:
            sent = os.write(self._fd, data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._fail(f"send failed: {exc!r}")
            return
        if sent < len(data):
            self._queue(data[sent:])

    def _queue(self, data: bytes) -> None:
        self._outbox.append(data)
        self._queued += len(data)
        self._wake.set()

    async def send_request(
        self, method: bytes, target: bytes, headers: Headers, body: Any = b"", *, scheme: bytes = b"http"
    ) -> H2Response:
        """HTTP/1.1-style request (Host header, no pseudo-headers) for direct use."""
        return await self.send(
            h2_request_headers(method, target, headers, scheme=scheme, authority=self.label.encode()), body
        )

    async def send(
        self, block: Headers, body: bytes | AsyncIterable[bytes] = b"", trailers: Headers | None = None
    ) -> H2Response:
        """Open a stream with header `block` (pseudo-headers first), upload `body`, wait for the head.

        `trailers`: a trailing HEADERS with END_STREAM after the body (the client's request
        trailers); such a body always goes by the upload task (rare: gRPC clients send none)."""
        await trio.lowlevel.checkpoint_if_cancelled()  # the HEADERS write below does not checkpoint
        if not self.has_capacity():
            raise UpstreamProtocolError(f"upstream {self.label}: connection takes no new streams", upstream=self.label)
        h = self._h2
        sid = h.get_next_available_stream_id()
        s = _Stream(sid)
        small = trailers is None and isinstance(body, _BYTES_LIKE) and len(body) <= SMALL_BODY_BYTES
        empty = small and not body
        try:
            state = self._open_stream(sid, block, empty)
            # A body the windows take whole leaves with the head: one write, not two.
            inline = (
                small
                and not empty
                and len(body) <= min(h.outbound_flow_control_window, state.outbound_flow_control_window)  # type: ignore[arg-type]  # small: bytes-like
            )
            if inline:
                self._send_body(state, body)  # type: ignore[arg-type]  # small: bytes-like
        except h2.exceptions.ProtocolError as exc:
            raise ProtocolError(f"upstream {self.label}: cannot send request headers: {exc}") from exc
        s.local_done = empty or inline
        self._streams[sid] = s
        self.requests += 1
        self.goaway = self.goaway or sid >= _LAST_STREAM_ID
        self._flush()
        try:
            if not small:
                s.uploader = scope = trio.CancelScope()
                self._nursery.start_soon(self._upload_task, s, scope, body, trailers)
            elif not s.local_done:
                await self._upload(s, body, True)
            while s.status is None:
                if s.error is not None:
                    raise s.error
                if s.ended:
                    raise UpstreamProtocolError(
                        f"upstream {self.label}: stream {sid} ended without a response",
                        upstream=self.label,
                        request_sent=True,
                    )
                await s.wait()
        except BaseException:
            self.forget(s)
            raise
        return H2Response(self, s)

    def _open_stream(self, sid: int, block: Headers, end_stream: bool) -> Any:
        """h2's send_headers for a new request stream, the frames serialised by h2frames.

        What h2 keeps is moved as send_headers would move it: the connection's state machine,
        a new stream (`_begin_new_stream`: its windows from both sides' settings), the stream's
        state machine, and the request method it remembers for the answer (a HEAD response's
        content-length). The HEADERS go into h2's own output buffer, so they leave in order
        with everything h2 produced before them (HPACK state depends on it)."""
        h = self._h2
        limit = h.remote_settings.max_concurrent_streams
        if h.open_outbound_streams + 1 > limit:  # as h2 checks it; the property also prunes closed streams
            raise h2.exceptions.TooManyStreamsError(f"Max outbound streams is {limit}")
        h.state_machine.process_input(_CONN_SEND_HEADERS)
        state = h._begin_new_stream(sid, _CLIENT_IDS)
        state.state_machine.process_input(_SEND_HEADERS)
        if end_stream:
            state.state_machine.process_input(_SEND_END)
        for name, value in block:
            if name[:1] != b":":
                break
            if name == b":method":
                state.request_method = value
            elif name == b":authority":
                state._authority = value
        frames = h2frames.header_block(sid, h.encoder.encode(block), end_stream, h.max_outbound_frame_size)
        h._data_to_send += frames
        return state

    def _send_body(self, state: Any, body: bytes) -> None:
        """h2's send_data(end_stream=True) for a body the windows take whole (`send`'s inline case)."""
        h = self._h2
        h.state_machine.process_input(_CONN_SEND_DATA)
        state.state_machine.process_input(_SEND_DATA)
        state.state_machine.process_input(_SEND_END)
        parts, _ = h2frames.data(state.stream_id, body, True, h.max_outbound_frame_size)
        state.outbound_flow_control_window -= len(body)
        h.outbound_flow_control_window -= len(body)
        h._data_to_send += b"".join(parts)

    async def _upload_task(
        self, s: _Stream, scope: trio.CancelScope, body: Body, trailers: Headers | None = None
    ) -> None:
        """The body, uploaded while the caller reads the response. Never raises into the nursery."""
        with scope:
            try:
                if isinstance(body, _BYTES_LIKE):
                    await self._upload(s, body, trailers is None)
                else:
                    async for chunk in body:
                        if chunk:
                            await self._upload(s, chunk, False)
                    # A body passed as it arrives knows its trailers only at its end (h2stream.PassingBody).
                    trailers = trailers or getattr(body, "trailers", None)
                if not (s.local_done or s.ended or s.reset or self.closed):
                    if trailers:
                        self._h2.send_headers(s.id, trailers, end_stream=True)
                    else:
                        self._h2.end_stream(s.id)
                    s.local_done = True
                    self._flush()
            except Exception as exc:
                if isinstance(exc, h2.exceptions.ProtocolError):
                    exc = UpstreamProtocolError(
                        f"upstream {self.label}: stream {s.id}: {exc}", upstream=self.label, request_sent=True
                    )
                if s.error is None:
                    s.error = exc  # the reader raises it unless the response already ended
                s.wake()
            finally:
                s.uploader = None

    async def _upload(self, s: _Stream, data: Any, end: bool) -> None:
        """Send `data` as DATA frames as windows allow; stops if the peer already ended or reset."""
        h = self._h2
        view = memoryview(data)
        offset, total = 0, len(view)
        while offset < total:
            if s.error is not None:
                raise s.error
            if s.ended or s.reset:
                return  # the peer answered early; forget() resets our half
            try:
                size = min(h.local_flow_control_window(s.id), h.max_outbound_frame_size, total - offset)
                if size > 0:
                    h.send_data(s.id, view[offset : offset + size], end_stream=end and offset + size == total)
            except h2.exceptions.ProtocolError as exc:
                raise UpstreamProtocolError(
                    f"upstream {self.label}: stream {s.id}: {exc}", upstream=self.label, request_sent=True
                ) from exc
            if size <= 0:
                s.blocked = True
                try:
                    await s.wait_writer()
                finally:
                    s.blocked = False
                continue
            offset += size
            self._flush()
            while self._queued >= FLUSH_BYTES and not self.closed:  # the socket is not keeping up
                await self._flushed.wait()
        s.local_done = s.local_done or end

    def consumed(self, s: _Stream, flow: int) -> None:
        """Hand `flow` bytes of window back for DATA the caller has taken."""
        if self.closed or not flow:
            return
        self._h2.acknowledge_received_data(flow, s.id)
        self._flush()

    def forget(self, s: _Stream) -> None:
        """The caller is done with `s`: reset it unless finished, return unread credit. Once per stream."""
        if self._streams.pop(s.id, None) is None:
            return
        if s.uploader is not None:
            s.uploader.cancel()
        if not self.closed:
            h = self._h2
            unread = sum(flow for _, flow in s.chunks)
            s.chunks.clear()
            try:
                if not (s.ended and s.local_done) and not s.reset:
                    h.reset_stream(s.id, ErrorCodes.CANCEL)
                if unread:
                    h.acknowledge_received_data(unread, s.id)
            except h2.exceptions.ProtocolError:
                pass  # the stream closed meanwhile: nothing to reset
            self._flush()
        if not self._streams:
            self.idle_since = trio.current_time()
            if self.goaway:
                self.close()
        self.on_change(self)

    async def _write_loop(self) -> None:
        h = self._h2
        try:
            while True:
                await self._wake.wait()
                if self.closed:
                    return
                self._wake = trio.Event()
                data = b"".join(self._outbox) + h.data_to_send()  # h2's own buffer is the newer part
                self._outbox.clear()
                self._queued = 0
                if data:
                    self._writing = True
                    await sockio.send_all(self._stream.socket, data)
                    self._writing = False
                flushed, self._flushed = self._flushed, trio.Event()
                flushed.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._fail(f"send failed: {exc!r}")

    async def _read_loop(self) -> None:
        h = self._h2
        dispatch = self._DISPATCH
        data = b""
        try:
            while True:
                # After a short read the peer has nothing more for now: wait, then read once.
                data = await sockio.receive(self._stream.socket, RECV_BYTES, len(data) < RECV_BYTES)
                if not data:
                    self._fail("closed the connection")
                    return
                self._flush()  # h2 would drop unsent bytes on GOAWAY (module doc)
                for event in h.receive_data(data):
                    handler = dispatch.get(type(event))
                    if handler is not None:
                        handler(self, event)
                self._flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._fail(f"receive failed: {exc!r}")
        except h2.exceptions.ProtocolError as exc:
            self._fail(f"HTTP/2 protocol error: {exc}")

    def _on_response(self, event: h2.events.ResponseReceived) -> None:
        s = self._streams.get(event.stream_id)
        if s is None:
            return
        head = h2rules.parse_response(event.headers)
        if isinstance(head, str):
            self._malformed(s, f"malformed response head: {head}")
            return
        s.status, s.headers = head
        s.wake()

    def _malformed(self, s: _Stream, why: str) -> None:
        """A response head or trailers break RFC 9113 8: a stream error (8.1.1), reset PROTOCOL_ERROR."""
        s.error = UpstreamProtocolError(
            f"upstream {self.label} stream {s.id}: {why}", upstream=self.label, request_sent=True
        )
        try:
            self._h2.reset_stream(s.id, ErrorCodes.PROTOCOL_ERROR)
        except h2.exceptions.ProtocolError:
            pass  # closed already
        s.reset = True
        s.wake_all()

    def _on_data(self, event: h2.events.DataReceived) -> None:
        s = self._streams.get(event.stream_id)
        if s is None:  # nobody reads it: give the connection credit back at once (flushed by the reader)
            if event.flow_controlled_length:
                self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            return
        s.chunks.append((event.data, event.flow_controlled_length))
        s.wake()

    def _on_trailers(self, event: h2.events.TrailersReceived) -> None:
        # h2 reports StreamEnded right after; the reader sees both in the same wake-up.
        s = self._streams.get(event.stream_id)
        if s is not None:
            trailers = h2rules.parse_trailers(event.headers)
            if isinstance(trailers, str):
                self._malformed(s, f"malformed trailers: {trailers}")
                return
            s.trailers = trailers
            s.wake()

    def _on_end(self, event: h2.events.StreamEnded) -> None:
        s = self._streams.get(event.stream_id)
        if s is not None:
            # A stream reset with an error (we reset it for malformed trailers in this same read) did
            # not end well: the caller gets the error, not a complete response.
            s.ended = not (s.reset and s.error is not None)
            s.wake_all()

    def _on_reset(self, event: h2.events.StreamReset) -> None:
        s = self._streams.get(event.stream_id)
        if s is None:
            return
        s.reset = True
        if not s.ended:  # after a complete response, a reset only stops our upload (RFC 9113 8.1)
            code = event.error_code
            name = code.name if isinstance(code, ErrorCodes) else str(code)
            s.error = UpstreamProtocolError(
                f"upstream {self.label} reset stream {s.id}: {name}",
                upstream=self.label,
                request_sent=code != ErrorCodes.REFUSED_STREAM,
            )
        s.wake_all()

    def _on_window(self, event: h2.events.WindowUpdated) -> None:
        if event.stream_id:
            s = self._streams.get(event.stream_id)
            if s is not None and s.blocked:
                s.wake_writer()
            return
        self._wake_blocked()

    def _wake_blocked(self) -> None:
        for s in self._streams.values():
            if s.blocked:
                s.wake_writer()

    def _on_settings(self, event: h2.events.RemoteSettingsChanged) -> None:
        self.max_streams = self._h2.remote_settings.max_concurrent_streams
        self._settings_seen = True
        if self._settings_acked:
            self._ready.set()
        self._wake_blocked()  # INITIAL_WINDOW_SIZE may have grown
        self.on_change(self)

    def _on_settings_ack(self, event: h2.events.SettingsAcknowledged) -> None:
        self._settings_acked = True
        if self._settings_seen:
            self._ready.set()

    def _on_goaway(self, event: h2.events.ConnectionTerminated) -> None:
        self.goaway = True
        last = event.last_stream_id or 0
        for s in self._streams.values():
            if s.id > last and not s.ended and s.error is None:
                s.error = UpstreamProtocolError(
                    f"upstream {self.label}: GOAWAY before stream {s.id} was processed",
                    upstream=self.label,
                    request_sent=False,
                )
                s.wake_all()
        if not self._streams:
            self._fail("GOAWAY")
        self.on_change(self)

    _DISPATCH: ClassVar[dict[type, Callable[[H2UpstreamConnection, Any], None]]] = {
        h2.events.ResponseReceived: _on_response,
        h2.events.DataReceived: _on_data,
        h2.events.TrailersReceived: _on_trailers,
        h2.events.StreamEnded: _on_end,
        h2.events.StreamReset: _on_reset,
        h2.events.WindowUpdated: _on_window,
        h2.events.RemoteSettingsChanged: _on_settings,
        h2.events.SettingsAcknowledged: _on_settings_ack,
        h2.events.ConnectionTerminated: _on_goaway,
    }

    def statistics(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "streams": len(self._streams),
            "max_streams": self.max_streams,
            "uploading": sum(1 for s in self._streams.values() if s.uploader is not None),
            "requests": self.requests,
            "goaway": self.goaway,
            "closed": self.closed,
        }

    def __repr__(self) -> str:
        state = "closed" if self.closed else "goaway" if self.goaway else "open"
        return f"<H2UpstreamConnection {self.label} {state} streams={len(self._streams)}/{self.max_streams} requests={self.requests}>"


class H2Response:
    """A response being received on one stream. `owner` (the pool) is told once when it is closed."""

    __slots__ = ("_s", "closed", "complete", "connection", "failed", "headers", "owner", "started_at", "status")
    http_version = "2"

    def __init__(self, connection: H2UpstreamConnection, stream: _Stream) -> None:
        self.status: int = stream.status or 0
        self.headers = stream.headers
        self.connection = connection
        self._s = stream
        self.complete = False
        self.failed = False  # receive() raised: the upstream broke the response
        self.closed = False
        self.owner: Any = None
        self.started_at = 0.0

    async def receive(self) -> bytes:
        """The DATA that has arrived, as soon as there is any; b"" once the stream has ended.

        Every DATA frame already received comes back as one piece, its credit returned in one
        WINDOW_UPDATE: one client write for the frames of a stream that arrived together, and
        no frame waits for another, since only what is here is joined.
        """
        s = self._s
        while True:
            chunks = s.chunks
            if chunks:
                if len(chunks) == 1:
                    data, flow = chunks.popleft()
                else:
                    data = b"".join([c[0] for c in chunks])
                    flow = sum([c[1] for c in chunks])
                    chunks.clear()
                self.connection.consumed(s, flow)
                if data:
                    return data
                continue
            if s.ended:
                self.complete = True
                return b""
            if s.error is not None:
                self.failed = isinstance(s.error, UpstreamProtocolError)  # else the body source failed
                raise s.error
            await s.wait()

    @property
    def all_received(self) -> bool:
        """Every DATA frame has been handed out by `receive()` and the stream has ended (trailers, if any,
        are in): the next `receive()` returns b"" without waiting (the relay's whole-answer path)."""
        s = self._s
        return s.ended and not s.chunks

    @property
    def trailers(self) -> Headers | None:
        """The trailer fields (pseudo-headers dropped), known once `receive()` returned b""; None if none came."""
        return self._s.trailers

    async def read(self) -> bytes:
        """The whole remaining body (for small responses and tests)."""
        parts = []
        while chunk := await self.receive():
            parts.append(chunk)
        return b"".join(parts)

    async def aclose(self) -> None:
        """Finish with the stream (RST_STREAM CANCEL if unfinished). Never awaits (cancel-safe)."""
        if self.closed:
            return
        self.closed = True
        self.connection.forget(self._s)
        if self.owner is not None:
            self.owner.release(self)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = "complete" if self.complete else "streaming"
        return f"<H2Response {self.status} {state} stream={self._s.id} via {self.connection!r}>"
