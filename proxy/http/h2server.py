"""One HTTP/2 server connection (h2c, prior knowledge), on h2.

Theory of operation: three kinds of task per connection.
- The reader (the connection's own task) feeds received bytes to h2 and acts on
  the events without ever waiting on a stream: HEADERS start a stream task, DATA
  goes into that stream's body buffer (bounded by the window we granted it),
  RST_STREAM cancels that stream's handler, WINDOW_UPDATE wakes blocked senders.
  So one slow request body cannot stall the other streams (hypercorn's reader
  awaits each stream's consumer; ours never does).
- Streams run on worker tasks (`_Worker`), one stream at a time each: a worker
  runs a stream's exchange (`h2stream.H2Stream.run`) inside its own cancel scope,
  hands over whatever of the response is still held for the client's window, then
  waits for the reader to give it the next stream. So a request costs neither a task
  spawn nor a cancel scope of its own (measured: ~10% of an h2c request's CPU); a
  stream's RST_STREAM cancels its worker's scope, and that worker goes on in a new one.
- The writer is the only task that sends: whoever changed h2's state calls
  `kick()`, which moves h2's pending output into the writer's queue; the writer
  sends everything queued meanwhile in one write (coalescing the answers of many
  streams and every control frame of a read into one system call; measured: one
  write per answer straight from `kick()` cost 14% more CPU per request than this
  task switch) and `flush()` waits for that: one socket write per batch of ready
  frames, whichever streams made them. The write itself skips trio's post-send
  yield, and its send timeout costs a cancel scope only when the kernel does not
  take the batch at once (sockio's stall bound).

Timeouts apply to the reader: header_timeout_s from accept until the first
request head, then idle_timeout_s whenever no stream is open; either ends the
connection with GOAWAY(NO_ERROR).

Bounds: one client, whatever it sends, gets a bounded share of CPU and memory
(docs/security.md, "HTTP/2 specifics"; every number is a `[listen]` key or a constant here).
- Frames are judged by their 9-byte header (`_Inbound`): longer than our
  SETTINGS_MAX_FRAME_SIZE is FRAME_SIZE_ERROR before a byte of the payload is kept,
  and a header block (HEADERS + CONTINUATION) past 4 x max_header_bytes, or a
  SETTINGS frame with more than 32 settings (nghttp2's limit), is ENHANCE_YOUR_CALM.
  So the inbound buffer holds one read plus one frame at most.
- Control frames spend the connection's `FloodBudget` (proxy/core/flood.py);
  streams the client resets before their answer spend its reset budget. An empty
  budget is GOAWAY(ENHANCE_YOUR_CALM), one rate-limited log line and a count in
  `rampmeter_h2_floods_total`.
- Fairness: a turn handles at most FRAMES_PER_TURN frames and ends after the frame
  that passes TURN_BUDGET_S of CPU; with more buffered the reader yields to every
  other ready task first. A read is only made once the buffered frames are handled,
  so one busy connection cannot hold the loop (the sidecar's own health checks of
  the pod run on it too). The time bound is what makes it fair whatever a frame
  costs: 64 SETTINGS frames (each acknowledged through h2) took ~0.9 ms, and every
  scheduler pass an ordinary request went through waited for that.
- Request bodies: unread, at most h2_connection_window_bytes per connection (the
  receive window we grant; bytes are acknowledged as the handler reads them); read
  or not, at most h2_body_bytes_per_connection for all open streams together (a
  stream's content-length is reserved when it is accepted; one that would pass the
  bound is refused with REFUSED_STREAM, which says it was not processed).
- Output: past OUT_HIGH bytes queued for the socket the reader stops reading (a
  client that floods and never reads stops being read); a write that makes no
  progress for h2_send_timeout_s closes the connection. Response bytes waiting for
  the client's flow-control window are held per stream, at most
  h2_send_buffer_bytes per connection (h2stream).

Where we step around h2, and why:
- Response frames are ours (h2stream, "Frames"): HEADERS, CONTINUATION and DATA are
  serialised there and h2's state machines and windows are moved as its
  send_headers / send_data would move them; h2's frame objects, per-frame
  serialisation and debug-log calls were ~20% of the transport's CPU per request.
  `send_frames` keeps h2's own pending output (SETTINGS ACKs, WINDOW_UPDATEs,
  RST_STREAM) ahead of them, so bytes still leave in the order they were made.
- Header validation is ours (h2rules): h2's own, on, costs a tenth of the front
  end's CPU and treats a malformed request as a connection error; RFC 9113 8.1.1
  makes it a stream error, answered 400 here.
- REFUSED_STREAM: h2 raises TooManyStreamsError, a connection error, for a
  HEADERS frame past SETTINGS_MAX_CONCURRENT_STREAMS, before decoding its header
  block (so HPACK state would desync). RFC 9113 5.1.2 allows a stream error and
  REFUSED_STREAM tells the client that retrying is safe, so `_H2State` lets h2
  accept the stream and we refuse it.
- Drain GOAWAY: h2's close_connection() moves its state machine to CLOSED, after
  which in-flight streams can no longer send; for a graceful drain we write the
  GOAWAY frames ourselves (hyperframe). An idle connection gets one GOAWAY with the
  real last-stream-id (nothing is in flight to lose; a stream racing it has a higher
  id, which every client, httpx included, retries elsewhere), and so does a busy one
  that goes idle within `drain_idle_wait_s` (a quarter of drain_timeout_s, at most 5 s;
  meanwhile it is served as usual). Past that, two GOAWAYs as RFC 9113 6.8 and
  nghttp2 do: first last-stream-id 2^31-1 with a PING, then, at the PING's ACK (one
  round trip: every stream the client started before it saw the first GOAWAY has
  arrived) or after DRAIN_RTT_MAX_S, the real last-stream-id; streams above it are
  refused. Why not always two: python-h2 clients (httpx) treat any GOAWAY as the end
  of every stream not yet answered (docs/security.md; tests/security/test_h2_drain.py).
- Header list size: we advertise limits.max_header_bytes; HPACK decoding allows
  4x that (beyond it: COMPRESSION/ENHANCE_YOUR_CALM connection error), and a list
  between the two gets 431 on its own stream.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hyperframe.frame
import trio
from h2.connection import AllowedStreamIDs, ConnectionInputs
from h2.errors import ErrorCodes
from h2.frame_buffer import FrameBuffer
from h2.settings import SettingCodes, Settings
from hyperframe.frame import GoAwayFrame

from proxy.core.flood import FloodBudget, FloodLimits
from proxy.errors import ClientGone
from proxy.http import h2frames, h2rules, hpack_memo, sockio
from proxy.http.exchange import ServerContext
from proxy.http.h2stream import H2Sink, H2Stream, build_request
from proxy.policy.schema import Listen

RECEIVE_SIZE = 65_536
STREAM_WINDOW = 262_144  # per-stream receive window: the most one stream's body buffer holds
IDLE_WORKERS = 16  # stream tasks a connection keeps waiting for its next streams (_Worker)
IDLE_WORKERS_AT_REST = 1  # ... once it has had no stream in flight for REST_RELEASE_S (H2ServerConnection._at_rest)
REST_RELEASE_S = 0.5  # a connection idle this long lets go of what its last burst of streams left behind
FRAMES_PER_TURN = 64  # frames handled before the reader lets the other tasks run (when more are buffered)
TURN_BUDGET_S = 0.0002  # ... or CPU time: the frame that passes it ends the turn (module doc, fairness)
OUT_HIGH = 262_144  # bytes queued for the socket past which the reader stops reading
CLOSE_GRACE_S = 1.0  # time to flush a final GOAWAY before closing
DRAIN_IDLE_WAIT_MAX_S = 5.0  # drain: a busy connection may take min(this, drain_timeout_s / 4) to go idle
DRAIN_RTT_MAX_S = 1.0  # two-step GOAWAY: the second one at the PING ACK, or after this long
HEADER_LIST_HARD_FACTOR = 4
MAX_SETTINGS_PER_FRAME = 32  # nghttp2's default: a SETTINGS frame is one control frame, not thousands
MAX_STREAM_ID = 2**31 - 1
_DRAIN_PING = b"rm-drain"
_clock = time.perf_counter  # the turn's CPU budget: real time, whatever clock trio runs on (tests' virtual one)
_REFUSAL_SLACK = RECEIVE_SIZE // 9 + 1  # HEADERS frames h2 may have open that we have not seen yet

# Frame types (RFC 9113 6) and the flags the budget looks at.
_DATA, _HEADERS, _SETTINGS, _CONTINUATION = 0x0, 0x1, 0x4, 0x9
_END_STREAM, _END_HEADERS, _PADDED, _PRIORITY = 0x1, 0x4, 0x8, 0x20

_CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,
    validate_inbound_headers=False,  # h2rules.parse_request checks what RFC 9113 section 8 asks, once
    normalize_inbound_headers=False,
    validate_outbound_headers=False,  # our own headers: lower-case bytes, hop-by-hop stripped
    normalize_outbound_headers=False,
)


class _Flood(h2.exceptions.DenialOfServiceError):
    """A budget ran out while h2 was reading frames: h2 answers GOAWAY(ENHANCE_YOUR_CALM)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _Inbound(FrameBuffer):
    """h2's frame buffer, with what must be decided from a frame's 9-byte header.

    `__next__` runs once per frame (h2's own recursion included): it refuses an
    oversized frame before its payload is buffered, bounds the header block being
    assembled, charges control frames to the budget, and ends the turn after
    FRAMES_PER_TURN frames (the rest stays buffered; `ready()` says so).
    """

    def __init__(self, budget: FloodBudget, max_block_bytes: int) -> None:
        super().__init__(server=True)
        self.budget = budget
        self.max_block_bytes = max_block_bytes
        self.block_bytes = 0
        self.turn = 0
        self.last_sid = 0  # the highest stream id a HEADERS frame carried (a new stream earns control frames)
        self.turn_ends = 0.0  # perf_counter() past which the turn ends (set per turn by the reader)
        self.now = 0.0

    def ready(self) -> bool:
        """A whole frame (or an oversized frame's header) is buffered, not yet handled."""
        data = self._data
        if len(data) < 9:
            return False
        length = int.from_bytes(data[:3], "big")
        return len(data) >= 9 + length or length > self.max_frame_size

    # A _WholeHeaders is not a Frame: _H2State takes it before h2 could see it (hence the override).
    def __next__(self) -> hyperframe.frame.Frame | _WholeHeaders:  # type: ignore[override]
        data = self._data
        if len(data) < 9:
            raise StopIteration
        length = int.from_bytes(data[:3], "big")
        if length > self.max_frame_size:
            raise h2.exceptions.FrameTooLargeError(f"frame of {length} bytes, max {self.max_frame_size}")
        if len(data) < 9 + length or self.turn >= FRAMES_PER_TURN or (self.turn and _clock() > self.turn_ends):
            raise StopIteration
        self.turn += 1
        kind, flags = data[3], data[4]
        if kind == _DATA:
            empty = length == 0 or (flags & _PADDED and length <= data[9] + 1)
            if empty and not flags & _END_STREAM:
                self._control("an empty DATA frame")
        elif kind == _HEADERS:
            self.block_bytes = 0 if flags & _END_HEADERS else length
            if length == 0 and not flags & _END_STREAM:
                self._control("an empty HEADERS frame")
            sid = int.from_bytes(data[5:9], "big") & MAX_STREAM_ID
            if sid > self.last_sid:
                # A new stream earns its control frames here, in frame order: earned when the stream
                # was accepted (after the turn), frames behind it in the same turn were charged first.
                self.last_sid = sid
                self.budget.stream_opened()
            if flags & _END_HEADERS and not flags & (_PADDED | _PRIORITY) and sid and not self._headers_buffer:
                # A whole header block in one frame (every request head we see): no hyperframe object.
                block = bytes(data[9 : 9 + length])
                del data[: 9 + length]
                return _WholeHeaders(sid, block, bool(flags & _END_STREAM))
        elif kind == _CONTINUATION:
            self.block_bytes += length
            if self.block_bytes > self.max_block_bytes:
                raise _Flood("header_block", f"header block over {self.max_block_bytes} bytes")
            if flags & _END_HEADERS:
                self.block_bytes = 0
            self._control("CONTINUATION")
        else:  # PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, unknown
            if kind == _SETTINGS and length > 6 * MAX_SETTINGS_PER_FRAME:
                raise _Flood("control_frames", f"a SETTINGS frame with over {MAX_SETTINGS_PER_FRAME} settings")
            self._control("control frames")
        frame = super().__next__()
        quiet = _QUIET.get(frame.__class__)
        if quiet is not None:
            frame.__class__ = quiet  # (hyperframe frames have no __slots__: same layout)
        return frame

    def _control(self, what: str) -> None:
        if not self.budget.control(self.now):
            raise _Flood("control_frames", f"{what} past the control frame budget")


# h2 logs every received frame at trace level with `repr(frame)` evaluated first, whether or not
# anything logs (~4% of an h2c request's CPU): the frames `_Inbound` hands h2 are of h2frames.QUIET's
# subclasses (a class name for a repr); `_H2State` dispatches them as their bases.
_QUIET = h2frames.QUIET


class _WholeHeaders:
    """A HEADERS frame carrying a whole header block, without padding or priority, as `_Inbound`
    cuts it from the buffer: what h2's hyperframe parse would have made of it, minus the objects."""

    __slots__ = ("data", "end_stream", "stream_id")

    def __init__(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        self.stream_id, self.data, self.end_stream = stream_id, data, end_stream

    def __repr__(self) -> str:
        return "HeadersFrame"

    def as_frame(self) -> hyperframe.frame.HeadersFrame:
        flags = ("END_HEADERS", "END_STREAM") if self.end_stream else ("END_HEADERS",)
        return hyperframe.frame.HeadersFrame(self.stream_id, self.data, flags=flags)


class _H2State(h2.connection.H2Connection):
    owned: dict[int, H2Stream]  # the connection's streams (H2ServerConnection.streams)

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config)
        table = self._frame_dispatch_table
        h2frames.quiet_dispatch(table)
        table[_WholeHeaders] = self._receive_whole_headers  # type: ignore[index]  # dispatched by class, as h2 does

    def release(self) -> None:
        """The connection is over: break h2's own reference cycle (its frame dispatch table holds this
        object's bound methods), so that refcounting frees it, the streams h2 still keeps (closed ones are
        dropped lazily) and the HPACK tables at once rather than the cyclic GC later: ~100 objects a
        connection, which under bench.attacks' bad_targets (~100 h2 connections a second) and rapid_reset
        made most of the young passes' work."""
        self._frame_dispatch_table.clear()
        self.streams.clear()

    def prune(self) -> None:
        """Drop the closed streams h2 still holds: its own count of open streams prunes as it scans."""
        super().open_inbound_streams  # noqa: B018 - the property's scan is the point

    def _receive_whole_headers(self, frame: _WholeHeaders) -> tuple[list[Any], list[h2.events.Event]]:
        """h2's `_receive_headers_frame` for a new stream's head (the same steps, in order); anything
        else (trailers, a HEADERS on a known or closed stream) goes to h2's own as a real frame."""
        sid = frame.stream_id
        if sid in self.streams or sid <= self.highest_inbound_stream_id:
            return self._receive_headers_frame(frame.as_frame())
        limit = self.local_settings.max_concurrent_streams
        if self.open_inbound_streams + 1 > limit:
            raise h2.exceptions.TooManyStreamsError(f"Max inbound streams is {limit}")
        headers = h2.connection._decode_headers(self.decoder, frame.data)
        events = self.state_machine.process_input(ConnectionInputs.RECV_HEADERS)
        stream = self._begin_new_stream(sid, AllowedStreamIDs.ODD)
        frames, stream_events = stream.receive_headers(headers, frame.end_stream, self.config.header_encoding)
        return frames, events + stream_events

    @property
    def open_inbound_streams(self) -> int:
        # h2's check is `open + 1 > SETTINGS_MAX_CONCURRENT_STREAMS`; reporting fewer lets it
        # decode the HEADERS of a stream we then refuse (see module doc). h2 counts by scanning
        # every stream it holds, on every new stream, pruning the closed ones; we count ours
        # (O(1): `_open` enforces the limit) and let h2 scan, to prune, only once the streams it
        # holds outnumber ours (amortised O(1), as upstream_h2._ClientState does).
        if len(self.streams) > 2 * len(self.owned) + 32:
            return super().open_inbound_streams - _REFUSAL_SLACK
        return len(self.owned) - _REFUSAL_SLACK


class _Waiter:
    """Where one task waits for another's wake-up: a ParkingLot with a single parker, minus its
    dict, its closure per park and its generator per unpark (twice per h2 request: the worker
    waiting for its next stream, the writer for its next batch)."""

    __slots__ = ("task",)

    def __init__(self) -> None:
        self.task: trio.lowlevel.Task | None = None

    async def park(self) -> None:
        self.task = _current_task()
        await _wait_rescheduled(self._abort)

    def _abort(self, _: object) -> trio.lowlevel.Abort:
        self.task = None
        return _ABORTED

    def unpark(self) -> None:
        task = self.task
        if task is not None:
            self.task = None
            _reschedule(task)


_reschedule, _current_task = trio.lowlevel.reschedule, trio.lowlevel.current_task
_wait_rescheduled, _ABORTED = trio.lowlevel.wait_task_rescheduled, trio.lowlevel.Abort.SUCCEEDED


class _Worker:
    """A task that runs streams one after another, each inside the worker's cancel scope.

    Why not a task and a scope per stream: trio's spawn (a Task, a context copy) and a
    CancelScope entered and left per request cost ~10% of an h2c request's CPU. A stream's
    `cancel()` (RST_STREAM, the connection's body bound) cancels the worker's scope while the
    worker runs that stream only (`H2Stream.run` drops the reference when it ends); the
    Cancelled ends that stream and the worker carries on in a fresh scope. Idle workers wait
    for the reader's `take()`, at most IDLE_WORKERS of them per connection (the rest end), and
    IDLE_WORKERS_AT_REST once the connection has had no stream in flight for REST_RELEASE_S
    (`retire`); all end with the connection's nursery.
    """

    __slots__ = ("_conn", "_lot", "_next", "_retired")

    def __init__(self, conn: H2ServerConnection, stream: H2Stream) -> None:
        self._conn = conn
        self._next: H2Stream | None = stream
        self._lot = _Waiter()
        self._retired = False

    def take(self, stream: H2Stream) -> None:
        """The reader hands this idle worker its next stream."""
        self._next = stream
        self._lot.unpark()

    def retire(self) -> None:
        """This idle worker (taken out of the idle list by the caller) ends instead of waiting on."""
        self._retired = True
        self._lot.unpark()

    async def run(self) -> None:
        idle = self._conn._idle_workers
        while True:
            with trio.CancelScope() as scope:
                while True:
                    stream = self._next
                    if stream is None:
                        if len(idle) >= IDLE_WORKERS:
                            return
                        idle.append(self)
                        try:
                            await self._lot.park()
                        finally:
                            if self._next is None and self in idle:
                                idle.remove(self)  # cancelled while idle (a stale cancel, or the connection ends)
                        if self._retired:
                            return
                        continue
                    self._next = None
                    await stream.run(scope)


def drain_idle_wait_s(limits: Listen) -> float:
    """How long a draining connection with streams in flight may take to go idle (module doc)."""
    return min(DRAIN_IDLE_WAIT_MAX_S, limits.drain_timeout_s / 4)


def flood_limits(limits: Listen) -> FloodLimits:
    """The flood budget's numbers from `[listen]`; the per-work ratios are Envoy's (proxy/core/flood.py)."""
    return FloodLimits(
        control_burst=limits.h2_control_frame_burst,
        control_per_s=limits.h2_control_frames_per_s,
        resets_burst=limits.h2_reset_burst,
        resets_per_s=limits.h2_resets_per_s,
    )


class H2ServerConnection:
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
        self.budget = FloodBudget(flood_limits(limits), accepted_at)
        self._inbound = _Inbound(self.budget, HEADER_LIST_HARD_FACTOR * limits.max_header_bytes)
        self._inbound.max_frame_size = self.h2.max_inbound_frame_size  # h2 resets it on every receive
        self.h2.incoming_buffer = self._inbound
        self.body_timeout_s = limits.body_timeout_s
        self.send_timeout_s = limits.h2_send_timeout_s
        self.send_buffer_bytes = limits.h2_send_buffer_bytes
        self.body_bytes = 0  # request-body bytes reserved or held by open streams (h2stream.H2Body)
        self.held_bytes = 0  # response bytes held for streams' flow-control windows (h2stream)
        self.holding: dict[int, H2Sink] = {}  # the streams holding some, oldest first
        self.writes = 0  # batches handed to the kernel: progress, for senders waiting on the client
        self.streams: dict[int, H2Stream] = {}
        self.h2.owned = self.streams
        self._opened: list[H2Stream] = []  # accepted in the read being handled, not yet started
        self._idle_workers: list[_Worker] = []  # stream tasks waiting for their next stream
        self._read_scope: trio.CancelScope | None = None  # the reader's, whose deadline _read checks at
        self._release_at = math.inf  # when, if still idle, the last burst's leftovers go (_at_rest)
        self.requests = 0
        self._stream = stream
        self._io = sockio.wrap(stream)
        self._sock = stream.socket if isinstance(stream, trio.SocketStream) else None  # for the wait room
        self._client = client
        self._deadline = accepted_at + limits.header_timeout_s  # see _read
        self._reader_scope = trio.CancelScope()  # cancelled by _stop()
        self._got_request = False
        self._stop_reason = ""
        self._draining = False  # the first drain GOAWAY (2^31-1) went out
        self._goaway_last: int | None = None  # set once the final drain GOAWAY went out
        self._nursery: trio.Nursery | None = None
        self._send_lot = trio.lowlevel.ParkingLot()  # senders waiting for a window or for the writer
        # writer state: queued chunks, sequence numbers for flush(), and its parking lots
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._queued_seq = 0
        self._sent_seq = 0
        self._writer_idle = False
        self._writer_lot = _Waiter()
        self._flushed_lot = trio.lowlevel.ParkingLot()

    def __repr__(self) -> str:
        draining = "" if self._goaway_last is None else f" goaway<={self._goaway_last}"
        state = f"streams={len(self.streams)} requests={self.requests}{draining}"
        return f"<H2ServerConnection {self._client} {state}>"

    @property
    def client(self) -> str:
        return self._client

    async def run(self, initial: bytes) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._write_loop)
                self.h2.initiate_connection()
                window = self.ctx.limits.h2_connection_window_bytes
                if window > 65_535:
                    self.h2.increment_flow_control_window(window - 65_535)
                self.kick()
                if self.ctx.draining:
                    self.drain()
                peer_gone = False
                with self._reader_scope:
                    peer_gone = await self._read(initial)
                if peer_gone and not self.streams:
                    # Idle connections dropped together end in batches (proxy/http/waitroom.py).
                    await self.ctx.room.ending()
                if not peer_gone:
                    self._say_goodbye()
                    with trio.move_on_after(CLOSE_GRACE_S), contextlib.suppress(ClientGone):
                        # ClientGone: the writer found the socket gone first; the GOAWAY cannot go out.
                        await self.flush()
                self._abandon_streams()
                nursery.cancel_scope.cancel()
        finally:
            self.h2.release()  # h2's connection is a reference cycle of its own (_H2State.release)
            await self._stream.aclose()

    def drain(self) -> None:
        """Server shutdown: GOAWAY when idle, else the two-step GOAWAY (module doc); finish streams; close."""
        if self._draining or self._nursery is None:
            return
        self._draining = True
        if not self.streams:
            self._final_goaway()
        else:
            self._nursery.start_soon(self._drain_busy)

    async def _drain_busy(self) -> None:
        """Streams in flight: give them drain_idle_wait_s to end (stream_done sends the one GOAWAY
        then); past it, the two-step GOAWAY: 2^31-1 and a PING, then the real one at the ACK."""
        await trio.sleep(drain_idle_wait_s(self.ctx.limits))
        if self._goaway_last is not None:
            return
        self.kick()  # whatever h2 has pending goes before the GOAWAY
        self._queue(GoAwayFrame(0, last_stream_id=MAX_STREAM_ID, error_code=ErrorCodes.NO_ERROR).serialize())
        self.h2.ping(_DRAIN_PING)
        self.kick()
        await trio.sleep(DRAIN_RTT_MAX_S)
        self._final_goaway()

    def _final_goaway(self) -> None:
        if self._goaway_last is not None:
            return
        self._goaway_last = self.h2.highest_inbound_stream_id
        self.kick()
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
            with trio.move_on_at(check_at) as self._read_scope:
                return await self._process(data)
            data = b""
            now = trio.current_time()
            if now >= self._release_at:
                self._release_at = math.inf
                if not self.streams:
                    self._at_rest()
            if self.streams:
                check_at = now + step
            elif now >= self._deadline:
                return False
            else:
                check_at = min(self._deadline, now + step)
            check_at = min(check_at, self._release_at)  # a release pushed back by a later rest (_release_later)

    async def _process(self, data: bytes) -> bool:
        inbound = self._inbound
        while True:
            if data or inbound.ready():
                inbound.turn = 0
                inbound.turn_ends = _clock() + TURN_BUDGET_S
                inbound.now = trio.current_time()
                try:
                    events = self.h2.receive_data(data)
                except h2.exceptions.ProtocolError as exc:
                    self._protocol_error(exc)
                    return False
                self._dispatch(events)
                self.kick()
                if self._opened and not inbound.ready() and not self._stop_reason:
                    self._start_opened()  # (a connection closing starts none: they are abandoned)
                if inbound.ready():
                    # The turn ended with frames left: every other ready task runs first.
                    await trio.lowlevel.checkpoint()
                    data = b""
                    continue
            while self._out_bytes >= OUT_HIGH:
                # The client is not reading what we owe it: stop reading what it sends.
                # The writer closes the connection if it stays stuck (h2_send_timeout_s).
                await self._flushed_lot.park()
            try:
                # A full read suggests more is waiting (an upload): read at once. Otherwise
                # the client has said what it had to say for now: wait, then read once.
                if self.streams or self._sock is None:
                    data = await self._io.receive(RECEIVE_SIZE, len(data) < RECEIVE_SIZE)
                else:
                    # Idle (no stream open): the client may hold the connection for
                    # long and drop it with thousands of others at once. Park the socket in the server's
                    # wait room, which wakes such connections in bounded batches (proxy/http/waitroom.py).
                    await trio.lowlevel.checkpoint()  # as sockio's wait: every other ready task first
                    data = await self.ctx.room.receive(self._sock, RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return True
            if not data:
                return True

    def _dispatch(self, events: list[h2.events.Event]) -> None:
        for event in events:
            kind = type(event)  # `kind is` rather than isinstance: cheaper; mypy cannot narrow it, hence the ignores
            if kind is h2.events.DataReceived:
                self._data(event)  # type: ignore[arg-type]
            elif kind is h2.events.RequestReceived:
                self._open(event)  # type: ignore[arg-type]
            elif kind is h2.events.TrailersReceived:
                stream = self.streams.get(event.stream_id)  # type: ignore[attr-defined]
                if stream is not None:  # h2 bounds the block (max_header_list_size); StreamEnded follows
                    stream.request.trailers = list(event.headers)  # type: ignore[attr-defined]
            elif kind is h2.events.StreamEnded:
                stream = self.streams.get(event.stream_id)  # type: ignore[attr-defined]
                if stream is not None:
                    stream.body.finish()
            elif kind is h2.events.StreamReset:
                if not self._peer_reset(event.stream_id):  # type: ignore[attr-defined]
                    return  # rapid reset: the connection is closing
            elif kind is h2.events.WindowUpdated or kind is h2.events.RemoteSettingsChanged:
                if self.holding:
                    self._pump_held()
                if self._send_lot:
                    self._send_lot.unpark_all()
            elif kind is h2.events.PingAckReceived:
                if event.ping_data == _DRAIN_PING:  # type: ignore[attr-defined]
                    self._final_goaway()
            elif kind is h2.events.ConnectionTerminated:
                self._stop("peer_goaway")

    def _open(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        limits = self.ctx.limits
        if (self._goaway_last is not None and sid > self._goaway_last) or len(
            self.streams
        ) >= limits.max_concurrent_streams:
            self._refuse(sid)
            return
        head = h2rules.parse_request(event.headers)
        length = getattr(head, "content_length", None) or 0
        if length and length <= limits.max_body_bytes and not self.body_room(length):
            self.body_over(sid)
            return
        self._got_request = True
        self.requests += 1
        request, body, handler = build_request(self, sid, head, self._client)
        if length and length <= limits.max_body_bytes:
            body.reserve(length)
        stream = self.streams[sid] = H2Stream(self, sid, request, body, handler)
        self._opened.append(stream)  # started once the read that opened it is handled (_start_opened)

    def body_room(self, size: int) -> bool:
        """Whether the connection's open requests may hold `size` more body bytes."""
        return self.body_bytes + size <= self.ctx.limits.h2_body_bytes_per_connection

    def body_over(self, sid: int) -> None:
        """A body would pass h2_body_bytes_per_connection: refuse its stream (safe to retry)."""
        self.ctx.protocol_error("h2_connection_body_bytes", "request bodies at the connection's bound; REFUSED_STREAM")
        stream = self.streams.get(sid)
        if stream is not None:
            stream.cancel()
        self._refuse(sid)

    def _start_opened(self) -> None:
        """Start the streams this read opened. Not before: a stream the client resets within the same
        read (a rapid reset, however the turns split it) never starts a handler, so never an upstream."""
        assert self._nursery is not None
        opened, self._opened = self._opened, []
        idle = self._idle_workers
        for stream in opened:
            if stream.request.client_gone:
                stream.skip()
            elif idle:
                idle.pop().take(stream)
            else:
                self._nursery.start_soon(_Worker(self, stream).run)

    def _refuse(self, sid: int) -> None:
        try:
            self.h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass  # the client reset it already (in the same read): nothing to refuse

    def _peer_reset(self, sid: int) -> bool:
        """RST_STREAM from the client; False once that makes a rapid reset (GOAWAY sent)."""
        self._send_lot.unpark_all()
        stream = self.streams.get(sid)
        if stream is None:
            return True
        early = not stream.answered
        stream.peer_reset()
        if early and not self.budget.client_reset(self._inbound.now):
            self._flood("rapid_reset", "streams reset before their response past the reset budget")
            try:
                self.h2.close_connection(ErrorCodes.ENHANCE_YOUR_CALM)
            except h2.exceptions.ProtocolError:
                pass
            self._stop("error")  # GOAWAY queued: no second one
            return False
        return True

    def _data(self, event: h2.events.DataReceived) -> None:
        stream = self.streams.get(event.stream_id)
        if stream is None or not stream.body.feed(event.data, event.flow_controlled_length):
            # Not ours any more, or past the body cap: drop it but give the window back.
            self.acknowledge(event.flow_controlled_length, event.stream_id)

    def _protocol_error(self, exc: h2.exceptions.ProtocolError) -> None:
        if isinstance(exc, _Flood):
            self._flood(exc.kind, str(exc))
        else:
            code = getattr(exc, "error_code", None) or ErrorCodes.PROTOCOL_ERROR
            name = code.name.lower() if isinstance(code, ErrorCodes) else str(code)
            self.ctx.protocol_error(f"h2_{name}", str(exc)[:200])
        self._stop_reason = "error"  # h2 has queued GOAWAY(code) already

    def _flood(self, kind: str, what: str) -> None:
        """One count and (rate-limited) one log line; the caller sends GOAWAY(ENHANCE_YOUR_CALM)."""
        metrics = self.ctx.metrics
        if metrics is not None:
            metrics.h2_floods.labels(kind=kind).inc()
        self.ctx.events.event(f"flood_{kind}", "h2 flood from %s: %s; GOAWAY ENHANCE_YOUR_CALM", self._client, what)

    def timed_out(self, kind: str, what: str) -> None:
        """A stream or the connection stalled past its timeout: one count, one rate-limited line."""
        metrics = self.ctx.metrics
        if metrics is not None:
            metrics.h2_timeouts.labels(kind=kind).inc()
        self.ctx.events.event(f"timeout_{kind}", "h2 %s timeout from %s: %s", kind, self._client, what)

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
        """The connection ends: streams still running will never be answered.

        Streams opened by the read that ended it and never started (a rapid reset's last batch,
        whose RST_STREAM tripped the reset budget) are skipped here: no task will ever call
        `stream_done` for them, and left in `streams` each was a reference cycle with the
        connection (stream.conn), ~15 objects of cyclic garbage per stream, ~64 per connection
        under bench.attacks' rapid_reset: gen-1 passes collecting ~24,000 objects each.
        """
        opened, self._opened = self._opened, []
        for stream in opened:
            stream.peer_reset()
            stream.skip()
        for stream in list(self.streams.values()):
            stream.peer_reset()
        self._flushed_lot.unpark_all()
        self._send_lot.unpark_all()

    # --- streams' side ---
    def stream_done(self, stream: H2Stream) -> None:
        del self.streams[stream.sid]
        if not self.streams:
            if self._goaway_last is not None:
                self._stop("drained")
            elif self._draining:
                self._final_goaway()  # idle while draining: one GOAWAY loses nothing
            else:
                now = trio.current_time()
                self._deadline = now + self.ctx.limits.idle_timeout_s
                if len(self._idle_workers) > IDLE_WORKERS_AT_REST or len(self.h2.streams) > 1:
                    self._release_later(now)

    def _release_later(self, now: float) -> None:
        """Let go of the last burst's leftovers (`_at_rest`) if the connection is still idle REST_RELEASE_S
        from now: the reader's scope fires then (one wake-up; moving its deadline ~3.5 us, once per burst)."""
        scope = self._read_scope
        if scope is None:
            return
        self._release_at = at = now + REST_RELEASE_S
        if at < scope.deadline:
            scope.deadline = at

    def _at_rest(self) -> None:
        """Idle for REST_RELEASE_S: let go of what the last burst of streams left behind. h2 keeps closed
        streams until a later new stream makes it count (its H2Stream, state machine and window manager
        each), and up to IDLE_WORKERS idle workers wait on (a task and its coroutines each). A client
        that sends a burst and then holds the connection idle kept both: under bench.attacks'
        bad_targets (24 streams a connection, ~145 connections held a few seconds each) the young
        generations held 50,000-230,000 such objects, and each collector pass walked them: young passes
        of 40-120 ms and gen-1 passes of up to 167 ms, the attack's p99. Not at once when the last stream
        ends: a busy client's connection has none in flight between its bursts for a moment (h2load -m10
        at its maximum rate), and retiring the workers then only to spawn them again for the next burst
        cost ~20 us of CPU per request (bench.overhead --quick h2c, three pairs). A client with one
        stream at a time has one idle worker and one closed stream: nothing to release, no wake-up."""
        if len(self.h2.streams) > 1:
            self.h2.prune()
        idle = self._idle_workers
        while len(idle) > IDLE_WORKERS_AT_REST:
            idle.pop().retire()

    def acknowledge(self, flow_len: int, sid: int) -> None:
        if flow_len:
            try:
                self.h2.acknowledge_received_data(flow_len, sid)
            except h2.exceptions.ProtocolError:
                return
            self.kick()

    def _pump_held(self) -> None:
        """Move held response bytes into the windows that opened (oldest stream first)."""
        for sid, sink in list(self.holding.items()):
            if self.out_room() <= 0:
                return
            try:
                sink.pump()
            except ClientGone:
                self.holding.pop(sid, None)  # its stream is gone; its task drops what it held

    async def wait_send(self) -> None:
        """Until a window opens, the writer makes progress, or a stream or the connection ends."""
        await self._send_lot.park()

    def out_room(self) -> int:
        """Bytes the socket queue may still take before senders hold instead (may be <= 0)."""
        return OUT_HIGH - self._out_bytes

    def send_room(self) -> bool:
        """Whether senders may hold more: the socket queue and held bytes are below their bounds."""
        return self._out_bytes < OUT_HIGH and self._out_bytes + self.held_bytes < self.send_buffer_bytes

    # --- writer ---
    def kick(self) -> None:
        """Hand h2's pending output to the writer; does not wait."""
        if self.h2._data_to_send:  # (data_to_send() makes a new buffer even when there is nothing)
            self._queue(self.h2.data_to_send())

    def send_frames(self, data: bytes) -> None:
        """Queue frames serialised outside h2 (h2stream), after whatever h2 has pending (HPACK order)."""
        if self.h2._data_to_send:
            self._queue(self.h2.data_to_send())
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
            stalled = False
            try:
                # A client that takes nothing of a batch for h2_send_timeout_s is gone as far as we
                # are concerned. sockio pays for that timeout (a cancel scope) only when the kernel
                # does not take the batch at once: a write that completes costs no scope.
                await self._io.send_all(
                    chunks[0] if len(chunks) == 1 else b"".join(chunks), stall_s=self.send_timeout_s
                )
                broken = False
            except trio.TooSlowError:
                broken = stalled = True
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                broken = True
            if broken:
                if stalled:
                    self.timed_out("send", f"nothing written for {self.send_timeout_s:g}s; closing")
                self._abandon_streams()
                assert self._nursery is not None
                self._nursery.cancel_scope.cancel()
                return
            self._sent_seq = seq
            self.writes += 1
            if self._flushed_lot:  # (an empty lot's unpark_all still costs a generator)
                self._flushed_lot.unpark_all()
            if self.holding:
                self._pump_held()
            if self._send_lot:
                self._send_lot.unpark_all()
