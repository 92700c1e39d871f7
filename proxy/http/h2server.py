"""One HTTP/2 server connection (h2c, prior knowledge), on h2.

Theory of operation: three kinds of task per connection.
- The reader (the connection's own task) feeds received bytes to h2 and acts on
  the events without ever waiting on a stream: HEADERS start a stream task, DATA
  goes into that stream's body buffer (bounded by the window we granted it),
  RST_STREAM cancels that stream's handler, WINDOW_UPDATE wakes blocked senders.
  So one slow request body cannot stall the other streams (hypercorn's reader
  awaits each stream's consumer; ours never does).
- One task per stream runs its exchange (`h2stream.H2Stream.run`).
- The writer is the only task that sends: whoever changed h2's state calls
  `kick()`, which moves h2's pending output into the writer's queue; the writer
  sends everything queued meanwhile in one write (coalescing the answers of many
  streams; measured: with many streams answered at once, one write per answer
  straight from `kick()` cost 14% more CPU per request than this task switch)
  and `flush()` waits for that. The write itself skips trio's post-send yield
  (sockio).

Timeouts apply to the reader: header_timeout_s from accept until the first
request head, then idle_timeout_s whenever no stream is open; either ends the
connection with GOAWAY(NO_ERROR).

Where we step around h2, and why:
- REFUSED_STREAM: h2 raises TooManyStreamsError, a connection error, for a
  HEADERS frame past SETTINGS_MAX_CONCURRENT_STREAMS, before decoding its header
  block (so HPACK state would desync). RFC 9113 5.1.2 allows a stream error and
  REFUSED_STREAM tells the client that retrying is safe, so `_H2State` lets h2
  accept the stream and we refuse it.
- Drain GOAWAY: h2's close_connection() moves its state machine to CLOSED, after
  which in-flight streams can no longer send; for a graceful drain we write the
  GOAWAY frame ourselves (hyperframe) and refuse streams above its last-stream-id.
- Header list size: we advertise limits.max_header_bytes; HPACK decoding allows
  4x that (beyond it: COMPRESSION/ENHANCE_YOUR_CALM connection error), and a list
  between the two gets 431 on its own stream.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import trio
from h2.errors import ErrorCodes
from h2.settings import SettingCodes, Settings
from hyperframe.frame import GoAwayFrame

from proxy.errors import ClientGone
from proxy.http import hpack_memo, sockio
from proxy.http.exchange import ServerContext
from proxy.http.h2stream import H2Stream, build_request

RECEIVE_SIZE = 65_536
STREAM_WINDOW = 262_144  # per-stream receive window: the most one stream's body buffer holds
CONNECTION_WINDOW = 16_777_216  # >= many stream windows, so unread bodies do not block the rest
CLOSE_GRACE_S = 1.0  # time to flush a final GOAWAY before closing
HEADER_LIST_HARD_FACTOR = 4
_REFUSAL_SLACK = RECEIVE_SIZE // 9 + 1  # HEADERS frames one receive can carry (>= 9 bytes each)

_CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,
    validate_inbound_headers=True,
    normalize_inbound_headers=True,
    validate_outbound_headers=False,  # our own headers: lower-case bytes, hop-by-hop stripped
    normalize_outbound_headers=False,
)


class _H2State(h2.connection.H2Connection):
    @property
    def open_inbound_streams(self) -> int:
        # h2's check is `open + 1 > SETTINGS_MAX_CONCURRENT_STREAMS`; reporting fewer lets it
        # decode the HEADERS of a stream we then refuse (see module doc). The property also
        # prunes closed streams, so call it.
        return super().open_inbound_streams - _REFUSAL_SLACK


class H2Connection:
    protocol = "h2"

    def __init__(self, ctx: ServerContext, stream: trio.SocketStream, client: str, accepted_at: float) -> None:
        limits = ctx.limits
        self.ctx = ctx
        self.h2 = _H2State(_CONFIG)
        self.h2.local_settings = Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
                SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_bytes,
                SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                SettingCodes.ENABLE_PUSH: 0,
            },
        )
        self.h2.decoder.max_header_list_size = HEADER_LIST_HARD_FACTOR * limits.max_header_bytes
        hpack_memo.install(self.h2)
        self.streams: dict[int, H2Stream] = {}
        self.requests = 0
        self._stream = stream
        self._io = sockio.wrap(stream)
        self._client = client
        self._deadline = accepted_at + limits.header_timeout_s  # see _read
        self._reader_scope = trio.CancelScope()  # cancelled by _stop()
        self._got_request = False
        self._stop_reason = ""
        self._goaway_last: int | None = None  # set once a drain GOAWAY went out
        self._nursery: trio.Nursery | None = None
        self._window_lot = trio.lowlevel.ParkingLot()
        # writer state: queued chunks, sequence numbers for flush(), and its parking lots
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._queued_seq = 0
        self._sent_seq = 0
        self._writer_idle = False
        self._writer_lot = trio.lowlevel.ParkingLot()
        self._flushed_lot = trio.lowlevel.ParkingLot()

    def __repr__(self) -> str:
        draining = "" if self._goaway_last is None else f" goaway<={self._goaway_last}"
        state = f"streams={len(self.streams)} requests={self.requests}{draining}"
        return f"<H2Connection {self._client} {state}>"

    async def run(self, initial: bytes) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._write_loop)
                self.h2.initiate_connection()
                self.h2.increment_flow_control_window(CONNECTION_WINDOW - 65_535)
                self.kick()
                if self.ctx.draining:
                    self.drain()
                peer_gone = False
                with self._reader_scope:
                    peer_gone = await self._read(initial)
                if not peer_gone:
                    self._say_goodbye()
                    with trio.move_on_after(CLOSE_GRACE_S):
                        await self.flush()
                self._abandon_streams()
                nursery.cancel_scope.cancel()
        finally:
            await self._stream.aclose()

    def drain(self) -> None:
        """Server shutdown: GOAWAY(last processed stream), finish open streams, then close."""
        if self._goaway_last is None:
            self._goaway_last = self.h2.highest_inbound_stream_id
            frame = GoAwayFrame(0, last_stream_id=self._goaway_last, error_code=ErrorCodes.NO_ERROR)
            self._queue(frame.serialize())
        if not self.streams:
            self._stop("drained")

    # --- reader ---
    async def _read(self, initial: bytes) -> bool:
        """Process input until EOF (True), a protocol error, or a timeout (False).

        The timeout is a plain float (`_deadline`): header_timeout_s from accept until the
        first request, then idle_timeout_s after the last stream ended. The scope around
        the reads is re-entered only when it fires (at the latest every min(header, idle)
        timeout), never per stream: moving a live scope's deadline costs more.
        """
        limits = self.ctx.limits
        step = min(limits.header_timeout_s, limits.idle_timeout_s)
        check_at = self._deadline
        data = initial
        while True:
            with trio.move_on_at(check_at):
                return await self._process(data)
            data = b""
            now = trio.current_time()
            if self.streams:
                check_at = now + step
            elif now >= self._deadline:
                return False
            else:
                check_at = min(self._deadline, now + step)

    async def _process(self, data: bytes) -> bool:
        while True:
            if data:
                try:
                    events = self.h2.receive_data(data)
                except h2.exceptions.ProtocolError as exc:
                    self._protocol_error(exc)
                    return False
                self._dispatch(events)
                self.kick()
            try:
                # A full read suggests more is waiting (an upload): read at once. Otherwise
                # the client has said what it had to say for now: wait, then read once.
                data = await self._io.receive(RECEIVE_SIZE, len(data) < RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return True
            if not data:
                return True

    def _dispatch(self, events: list[h2.events.Event]) -> None:
        for event in events:
            kind = type(event)
            if kind is h2.events.DataReceived:
                self._data(event)
            elif kind is h2.events.RequestReceived:
                self._open(event)
            elif kind is h2.events.StreamEnded:
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream.body.finish()
            elif kind is h2.events.StreamReset:
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream.peer_reset()
                self._window_lot.unpark_all()
            elif kind is h2.events.WindowUpdated or kind is h2.events.RemoteSettingsChanged:
                self._window_lot.unpark_all()
            elif kind is h2.events.ConnectionTerminated:
                self._stop("peer_goaway")

    def _open(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        limits = self.ctx.limits
        if (self._goaway_last is not None and sid > self._goaway_last) or len(
            self.streams
        ) >= limits.max_concurrent_streams:
            self.h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
            return
        self._got_request = True
        self.requests += 1
        request, body, handler = build_request(self, sid, event.headers, self._client)
        stream = self.streams[sid] = H2Stream(self, sid, request, body, handler)
        assert self._nursery is not None
        self._nursery.start_soon(stream.run)

    def _data(self, event: h2.events.DataReceived) -> None:
        stream = self.streams.get(event.stream_id)
        if stream is None or not stream.body.feed(event.data, event.flow_controlled_length):
            # Not ours any more, or past the body cap: drop it but give the window back.
            self.acknowledge(event.flow_controlled_length, event.stream_id)

    def _protocol_error(self, exc: h2.exceptions.ProtocolError) -> None:
        code = getattr(exc, "error_code", None) or ErrorCodes.PROTOCOL_ERROR
        name = code.name.lower() if isinstance(code, ErrorCodes) else str(code)
        self.ctx.protocol_error(f"h2_{name}", str(exc)[:200])
        self._stop_reason = "error"  # h2 has queued GOAWAY(code) already

    def _stop(self, reason: str) -> None:
        self._stop_reason = reason
        self._reader_scope.cancel()

    def _say_goodbye(self) -> None:
        """Before closing: GOAWAY, unless h2 already queued one (protocol error) or we did (drain)."""
        reason = self._stop_reason
        if reason in ("error", "peer_goaway"):
            return
        if not reason and not self._got_request:
            self.ctx.protocol_error("header_timeout", "no request head in time")
        if self._goaway_last is None:
            try:
                self.h2.close_connection(ErrorCodes.NO_ERROR)
            except h2.exceptions.ProtocolError:
                return
        self.kick()

    def _abandon_streams(self) -> None:
        """The connection ends: streams still running will never be answered."""
        for stream in list(self.streams.values()):
            stream.peer_reset()
        self._flushed_lot.unpark_all()

    # --- streams' side ---
    def stream_done(self, stream: H2Stream) -> None:
        del self.streams[stream.sid]
        if not self.streams:
            if self._goaway_last is not None:
                self._stop("drained")
            else:
                self._deadline = trio.current_time() + self.ctx.limits.idle_timeout_s

    def acknowledge(self, flow_len: int, sid: int) -> None:
        if flow_len:
            try:
                self.h2.acknowledge_received_data(flow_len, sid)
            except h2.exceptions.ProtocolError:
                return
            self.kick()

    async def wait_window(self) -> None:
        await self._window_lot.park()

    # --- writer ---
    def kick(self) -> None:
        """Hand h2's pending output to the writer; does not wait."""
        data = self.h2.data_to_send()
        if data:
            self._queue(data)

    def _queue(self, data: bytes) -> None:
        self._out.append(data)
        self._out_bytes += len(data)
        self._queued_seq += 1
        if self._writer_idle:
            self._writer_lot.unpark()

    def queued_bytes(self) -> int:
        return self._out_bytes

    async def flush(self) -> None:
        """Wait until everything queued so far was handed to the kernel."""
        self.kick()
        target = self._queued_seq
        while self._sent_seq < target:
            if self._nursery is None or self._nursery.cancel_scope.cancel_called:
                raise ClientGone("connection closed")
            await self._flushed_lot.park()

    async def _write_loop(self) -> None:
        while True:
            if not self._out:
                self._writer_idle = True
                await self._writer_lot.park()
                self._writer_idle = False
                continue
            chunks, seq = self._out, self._queued_seq
            self._out, self._out_bytes = [], 0
            try:
                await self._io.send_all(chunks[0] if len(chunks) == 1 else b"".join(chunks))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._abandon_streams()
                assert self._nursery is not None
                self._nursery.cancel_scope.cancel()
                return
            self._sent_seq = seq
            self._flushed_lot.unpark_all()
