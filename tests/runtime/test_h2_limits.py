"""The HTTP/2 server's bounds, frame by frame over in-memory streams on trio's autojump clock.

One test per bound (docs/security.md, "HTTP/2 specifics"), each with exact virtual time where a timeout
is involved; tests/security/test_h2_*.py attack the same bounds over real TCP.
"""

from __future__ import annotations

import contextlib
from contextlib import asynccontextmanager

import msgspec
import pytest
import trio
import trio.testing
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from proxy.http import h2server
from proxy.http.exchange import ServerContext
from proxy.http.h2server import FRAMES_PER_TURN, H2ServerConnection
from proxy.metrics import Metrics
from proxy.policy.schema import Listen
from proxy.testing.handlers import Gate, H2Peer, Router, blob, echo, hello

LIMITS = Listen(
    max_body_bytes=2_000_000,
    max_header_bytes=2048,
    max_concurrent_streams=16,
    header_timeout_s=5.0,
    idle_timeout_s=30.0,
    body_timeout_s=7.0,
    h2_send_timeout_s=11.0,
    h2_control_frame_burst=100,
    h2_control_frames_per_s=10.0,
    h2_reset_burst=20,
    h2_resets_per_s=2.0,
    h2_send_buffer_bytes=200_000,
    h2_connection_window_bytes=500_000,
)


@asynccontextmanager
async def connection(handler, limits: Listen = LIMITS, *, stream_pair=trio.testing.memory_stream_pair, **peer_options):
    client_stream, server_stream = stream_pair()
    metrics = Metrics()
    ctx = ServerContext(handler, limits, metrics)
    conn = H2ServerConnection(ctx, server_stream, "192.0.2.9", trio.current_time())
    done = trio.Event()

    async def run() -> None:
        await conn.run(b"")
        done.set()

    with trio.fail_after(3600):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            peer = H2Peer(client_stream, **peer_options)
            await peer.start()
            await peer.until(lambda: peer.remote_max_streams is not None)
            yield peer, conn, done, metrics
            nursery.cancel_scope.cancel()


def counted(metrics: Metrics, family: str) -> dict[str, float]:
    metric = getattr(metrics, family)
    return {s.labels["kind"]: s.value for s in metric.collect()[0].samples if s.value and s.name.endswith("_total")}


async def goaway_after(peer: H2Peer, raw: bytes) -> tuple[int, int]:
    await peer.stream.send_all(raw)
    await peer.until(lambda: peer.goaway is not None)
    return peer.goaway


PING = PingFrame(0, opaque_data=b"12345678").serialize()


# --- frames judged by their header ---
async def test_an_oversized_frame_is_refused_from_its_header_alone(autojump_clock):
    async with connection(hello) as (peer, _, done, _):
        header = (2**24 - 1).to_bytes(3, "big") + b"\x01\x04\x00\x00\x00\x01"  # HEADERS, 16 MiB announced
        code, _ = await goaway_after(peer, header + b"x" * 100)  # no payload to speak of: still refused
        assert code == ErrorCodes.FRAME_SIZE_ERROR
        await done.wait()


async def test_a_header_block_past_four_times_max_header_bytes_is_enhance_your_calm(autojump_clock):
    async with connection(hello) as (peer, _, done, metrics):
        fragment = b"\x00" * 2000
        raw = HeadersFrame(1, data=fragment).serialize()
        raw += b"".join(ContinuationFrame(1, data=fragment).serialize() for _ in range(4))  # 10,000 > 8,192
        code, _ = await goaway_after(peer, raw)
        assert code == ErrorCodes.ENHANCE_YOUR_CALM
        assert counted(metrics, "h2_floods") == {"header_block": 1}
        await done.wait()


async def test_a_settings_frame_with_thousands_of_settings_is_enhance_your_calm(autojump_clock):
    async with connection(hello) as (peer, _, done, _):
        entries = b"".join((0x1).to_bytes(2, "big") + (4096).to_bytes(4, "big") for _ in range(33))
        many = len(entries).to_bytes(3, "big") + b"\x04\x00\x00\x00\x00\x00" + entries  # SETTINGS, 33 entries
        code, _ = await goaway_after(peer, many)
        assert code == ErrorCodes.ENHANCE_YOUR_CALM
        await done.wait()


# --- the control frame budget ---
@pytest.mark.parametrize(
    "frame",
    [
        PING,
        SettingsFrame(0).serialize(),
        WindowUpdateFrame(0, window_increment=1).serialize(),
        PriorityFrame(1, depends_on=0, stream_weight=15).serialize(),
        b"\x00\x00\x00\x0f\x00\x00\x00\x00\x00",  # an unknown frame type, empty
    ],
    ids=["ping", "settings", "window_update", "priority", "unknown"],
)
async def test_control_frames_past_the_burst_get_enhance_your_calm(frame, autojump_clock):
    async with connection(hello) as (peer, _, done, metrics):
        # A burst and a little more (what time refills meanwhile) trips it.
        code, _ = await goaway_after(peer, frame * (LIMITS.h2_control_frame_burst + 20))
        assert code == ErrorCodes.ENHANCE_YOUR_CALM
        assert counted(metrics, "h2_floods") == {"control_frames": 1}
        await done.wait()


async def test_empty_data_frames_count_too(autojump_clock):
    async with connection(Gate()) as (peer, _, done, _):
        sid = await peer.request(method=b"POST", end=False)
        code, _ = await goaway_after(peer, DataFrame(sid, data=b"").serialize() * 3 * LIMITS.h2_control_frame_burst)
        assert code == ErrorCodes.ENHANCE_YOUR_CALM
        await done.wait()


async def test_empty_continuations_count_too(autojump_clock):
    # Below h2's own cap of 64 CONTINUATION frames per block, so the budget is what trips.
    limits = Listen(h2_control_frame_burst=30, h2_control_frames_per_s=0)
    async with connection(hello, limits) as (peer, _, done, _):
        raw = HeadersFrame(1, data=b"").serialize()  # no END_HEADERS: a block that never ends
        code, _ = await goaway_after(peer, raw + ContinuationFrame(1, data=b"").serialize() * 40)
        assert code == ErrorCodes.ENHANCE_YOUR_CALM
        await done.wait()


async def test_keepalive_pings_at_the_allowed_rate_never_trip(autojump_clock):
    async with connection(hello) as (peer, _, done, _):
        first = await peer.request()  # within header_timeout_s; PINGs keep nobody past idle_timeout_s
        await peer.until(lambda: peer.streams[first].ended)
        for _ in range(2 * LIMITS.h2_control_frame_burst):  # twice the burst, over 20 virtual seconds
            await peer.stream.send_all(PING)
            await trio.sleep(1 / LIMITS.h2_control_frames_per_s)
        sid = await peer.request()
        await peer.until(lambda: peer.streams[sid].ended)
        assert peer.goaway is None and not done.is_set()


async def test_control_frames_in_proportion_to_requests_never_trip(autojump_clock):
    async with connection(hello) as (peer, _, done, _):
        for _ in range(60):
            sid = await peer.request()
            await peer.stream.send_all(PING * 50 + WindowUpdateFrame(0, window_increment=1).serialize() * 40)
            await peer.until(lambda sid=sid: peer.streams[sid].ended)
        assert peer.goaway is None and not done.is_set()


# --- fairness ---
async def test_a_burst_of_frames_is_handled_in_turns_that_let_others_run(autojump_clock):
    limits = Listen(h2_control_frame_burst=100_000, h2_control_frames_per_s=0)
    turns = 0

    async def bystander() -> None:
        nonlocal turns
        while True:
            await trio.lowlevel.checkpoint()
            turns += 1

    async with connection(hello, limits) as (peer, _, _, _), trio.open_nursery() as nursery:
        nursery.start_soon(bystander)  # never blocks: no wait_all_tasks_blocked() from here on
        await trio.sleep(0)
        frames, turns = 3000, 0  # 51 KiB: one read
        await peer.stream.send_all(PING * frames)
        sid = await peer.request()  # answered only after every PING before it was handled
        await peer.until(lambda: peer.streams[sid].ended)
        nursery.cancel_scope.cancel()
    assert turns >= frames // FRAMES_PER_TURN - 2, turns


async def test_a_turn_ends_once_its_frames_took_the_turn_budget(autojump_clock, monkeypatch):
    """Frames that cost more than a PING (a SETTINGS frame goes through h2's acknowledgement: ~14 us
    each) end the turn by time, not count: here each frame "takes" a third of TURN_BUDGET_S (the
    turn's clock advances by that at every frame), so a turn handles at most 4 of them and a burst
    of 600 takes at least 150 turns, where FRAMES_PER_TURN alone would give 10."""
    limits = Listen(h2_control_frame_burst=100_000, h2_control_frames_per_s=0)
    now = [0.0]

    def clock() -> float:
        now[0] += h2server.TURN_BUDGET_S / 3
        return now[0]

    monkeypatch.setattr(h2server, "_clock", clock)
    turns = 0

    async def bystander() -> None:
        nonlocal turns
        while True:
            await trio.lowlevel.checkpoint()
            turns += 1

    async with connection(hello, limits) as (peer, _, _, _), trio.open_nursery() as nursery:
        nursery.start_soon(bystander)
        await trio.sleep(0)
        frames, turns = 600, 0
        await peer.stream.send_all(SettingsFrame(0).serialize() * frames)
        sid = await peer.request()
        await peer.until(lambda: peer.streams[sid].ended)
        nursery.cancel_scope.cancel()
    assert turns >= frames // 4 - 2, turns


# --- rapid reset ---
async def test_rapid_reset_gets_goaway_and_never_reaches_the_handler(autojump_clock):
    gate = Gate()
    # None refused (all count), and 2 frames a pair: the read is handled in several turns.
    limits = msgspec.structs.replace(LIMITS, max_concurrent_streams=200, h2_reset_burst=120)
    async with connection(gate, limits) as (peer, _, done, metrics):
        peer.conn.ping(b"12345678")  # one frame first: every turn boundary falls inside a pair
        for _ in range(limits.h2_reset_burst + 5):
            sid = peer.conn.get_next_available_stream_id()
            peer.conn.send_headers(
                sid,
                [(b":method", b"GET"), (b":path", b"/"), (b":scheme", b"http"), (b":authority", b"t")],
                end_stream=True,
            )
            peer.conn.reset_stream(sid, 8)
        await peer.flush()  # every HEADERS and its RST_STREAM in one write
        await peer.until(lambda: peer.goaway is not None)
        assert peer.goaway[0] == ErrorCodes.ENHANCE_YOUR_CALM
        await done.wait()
        assert gate.requests == []  # reset in the read that opened them: no handler ran
        assert counted(metrics, "h2_floods") == {"rapid_reset": 1}


async def test_resets_at_the_allowed_rate_are_fine(autojump_clock):
    gate = Gate()
    async with connection(gate) as (peer, _, done, _):
        for _ in range(3 * LIMITS.h2_reset_burst):
            sid = await peer.request()
            await trio.sleep(1 / LIMITS.h2_resets_per_s)
            await peer.reset(sid)
        await trio.testing.wait_all_tasks_blocked()
        assert peer.goaway is None and not done.is_set()


async def test_a_refused_stream_the_client_already_reset_is_no_error(autojump_clock):
    """The traceback of defect 6: refusing (REFUSED_STREAM) a stream h2 has already closed."""
    gate = Gate()
    limits = Listen(max_concurrent_streams=2)
    async with connection(gate, limits, obey_stream_limit=False) as (peer, _, done, _):
        a, b = await peer.request(b"/"), await peer.request(b"/")
        await trio.testing.wait_all_tasks_blocked()
        sid = peer.conn.get_next_available_stream_id()
        peer.conn.send_headers(
            sid, [(b":method", b"GET"), (b":path", b"/"), (b":scheme", b"http"), (b":authority", b"t")], end_stream=True
        )
        peer.conn.reset_stream(sid, 8)
        await peer.flush()
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set() and peer.goaway is None
        gate.release.set()
        await peer.until(lambda: peer.streams[a].ended and peer.streams[b].ended)


# --- malformed requests and OPTIONS * ---
async def test_a_malformed_request_is_400_on_its_stream_and_the_connection_goes_on(autojump_clock):
    async with connection(hello) as (peer, _, done, _):
        peer.conn.config.validate_outbound_headers = peer.conn.config.normalize_outbound_headers = False
        bad = await peer.request(headers=[(b"Upper", b"x")])
        await peer.until(lambda: peer.streams[bad].ended)
        assert peer.streams[bad].status == 400
        options = await peer.request(b"*", method=b"OPTIONS")
        await peer.until(lambda: peer.streams[options].ended)
        assert (peer.streams[options].status, peer.streams[options].header(b"content-length")) == (200, b"0")
        ok = await peer.request()
        await peer.until(lambda: peer.streams[ok].ended)
        assert peer.streams[ok].status == 200 and not done.is_set()


# --- stalled request bodies ---
async def test_a_stalled_body_is_reset_after_body_timeout(autojump_clock):
    async with connection(echo) as (peer, conn, _, metrics):
        sid = await peer.request(method=b"POST", headers=[(b"content-length", b"100")], end=False)
        await peer.send(sid, b"x" * 10)
        sent = trio.current_time()
        await peer.until(lambda: peer.streams[sid].reset_code is not None)
        assert peer.streams[sid].reset_code == ErrorCodes.CANCEL
        assert trio.current_time() - sent == pytest.approx(LIMITS.body_timeout_s)
        assert counted(metrics, "h2_timeouts") == {"body": 1}
        ok = await peer.request()
        await peer.until(lambda: peer.streams[ok].ended)


async def test_a_stalled_body_is_reset_at_the_requests_own_deadline(autojump_clock):
    async with connection(echo) as (peer, _, _, _):
        started = trio.current_time()
        sid = await peer.request(method=b"POST", headers=[(b"x-request-timeout-ms", b"2500")], end=False)
        await peer.send(sid, b"x" * 10)
        await peer.until(lambda: peer.streams[sid].reset_code is not None)
        assert trio.current_time() - started == pytest.approx(2.5)


async def test_a_slow_body_that_keeps_coming_is_not_reset(autojump_clock):
    async with connection(echo) as (peer, _, _, _):
        sid = await peer.request(method=b"POST", end=False)
        for _ in range(10):
            await peer.send(sid, b"x" * 10)
            await trio.sleep(LIMITS.body_timeout_s * 0.9)
        await peer.send(sid, b"", end=True)
        await peer.until(lambda: peer.streams[sid].ended)
        assert peer.streams[sid].body == b"x" * 100


# --- responses the client does not read ---
async def test_a_zero_window_response_lets_the_handler_finish_then_is_reset_after_the_send_timeout(autojump_clock):
    finished = []

    async def handler(request, sink) -> None:
        await blob(50_000)(request, sink)
        finished.append(trio.current_time())

    settings = {SettingCodes.INITIAL_WINDOW_SIZE: 0}
    async with connection(handler, auto_ack=False, settings=settings) as (peer, conn, _, metrics):
        sent = trio.current_time()
        sid = await peer.request()
        await peer.until(lambda: peer.streams[sid].status == 200)
        await trio.testing.wait_all_tasks_blocked()
        assert finished == [sent]  # the handler (and so the request's admission slot) is done at once
        assert conn.held_bytes == 50_000
        await peer.until(lambda: peer.streams[sid].reset_code is not None)
        assert peer.streams[sid].reset_code == ErrorCodes.CANCEL
        assert trio.current_time() - sent == pytest.approx(LIMITS.h2_send_timeout_s)
        assert conn.held_bytes == 0 and conn.streams == {}
        assert counted(metrics, "h2_timeouts") == {"stream_send": 1}


async def test_other_streams_writes_do_not_keep_a_zero_window_stream_alive(autojump_clock):
    async def later(request, sink) -> None:
        await trio.sleep(5)
        await sink.respond(200, [], b"late")

    settings = {SettingCodes.INITIAL_WINDOW_SIZE: 0}
    async with connection(Router({b"/now": blob(10), b"/later": later}), auto_ack=False, settings=settings) as (
        peer,
        _,
        _,
        _,
    ):
        sent = trio.current_time()
        now, late = await peer.request(b"/now"), await peer.request(b"/later")
        await peer.until(lambda: peer.streams[now].reset_code is not None)
        assert trio.current_time() - sent == pytest.approx(LIMITS.h2_send_timeout_s)  # not 5 s later
        await peer.until(lambda: peer.streams[late].reset_code is not None)
        assert trio.current_time() - sent == pytest.approx(5 + LIMITS.h2_send_timeout_s)


async def test_held_bytes_flow_as_the_window_opens(autojump_clock):
    settings = {SettingCodes.INITIAL_WINDOW_SIZE: 0}
    async with connection(blob(40_000), auto_ack=False, settings=settings) as (peer, conn, _, _):
        sid = await peer.request()
        await peer.until(lambda: peer.streams[sid].status == 200)
        while not peer.streams[sid].ended:
            await trio.sleep(LIMITS.h2_send_timeout_s * 0.9)  # slow, but never silent for the whole timeout
            peer.conn.increment_flow_control_window(10_000, stream_id=sid)
            await peer.flush()
            await peer.receive()
        assert len(peer.streams[sid].body) == 40_000 and peer.streams[sid].reset_code is None


async def test_held_bytes_move_when_the_window_opens_while_the_handler_waits_for_its_upstream(autojump_clock):
    upstream_done = trio.Event()

    async def streaming(request, sink) -> None:
        await sink.start(200, [])
        await sink.send(b"token-1 ")  # no window yet: held, and send() returns
        await upstream_done.wait()  # the next token is a long way off
        await sink.send(b"token-2")
        await sink.end()

    settings = {SettingCodes.INITIAL_WINDOW_SIZE: 0}
    async with connection(streaming, auto_ack=False, settings=settings) as (peer, _, _, _):
        sid = await peer.request()
        await peer.until(lambda: peer.streams[sid].status == 200)
        peer.conn.increment_flow_control_window(1000, stream_id=sid)
        await peer.flush()
        await peer.until(lambda: peer.streams[sid].body == b"token-1 ")  # without waiting for token 2
        upstream_done.set()
        await peer.until(lambda: peer.streams[sid].ended)
        assert peer.streams[sid].body == b"token-1 token-2"


async def test_past_the_send_buffer_bound_a_sender_waits(autojump_clock):
    finished = []

    async def handler(request, sink) -> None:
        await blob(150_000)(request, sink)
        finished.append(request.target)

    settings = {SettingCodes.INITIAL_WINDOW_SIZE: 0}
    async with connection(Router({b"/a": handler, b"/b": handler}), auto_ack=False, settings=settings) as (
        peer,
        conn,
        _,
        _,
    ):
        await peer.request(b"/a")
        await trio.testing.wait_all_tasks_blocked()
        await peer.request(b"/b")  # 300,000 held would pass h2_send_buffer_bytes (200,000)
        await trio.testing.wait_all_tasks_blocked()
        assert finished == [b"/a"]
        assert conn.held_bytes <= LIMITS.h2_send_buffer_bytes + 150_000


async def test_the_connection_window_bounds_unread_request_bodies(autojump_clock):
    gate = Gate()  # never reads its body
    async with connection(gate) as (peer, conn, _, _):
        assert peer.conn.outbound_flow_control_window == LIMITS.h2_connection_window_bytes
        for _ in range(3):
            sid = await peer.request(method=b"POST", end=False)
            await peer.send(sid, b"x" * min(h2server.STREAM_WINDOW, peer.conn.outbound_flow_control_window))
        await trio.testing.wait_all_tasks_blocked()
        buffered = sum(sum(len(d) for d, _ in s.body._parts) for s in conn.streams.values())
        assert buffered == LIMITS.h2_connection_window_bytes


async def test_request_bodies_of_a_connection_are_bounded_together(autojump_clock):
    limits = msgspec.structs.replace(LIMITS, max_body_bytes=1_000_000, h2_body_bytes_per_connection=2_500_000)
    gate = Gate()
    async with connection(Router({b"/wait": gate, b"/": echo}), limits) as (peer, conn, done, _):
        big = [(b"content-length", b"1000000")]
        for _ in range(2):
            await peer.request(b"/wait", method=b"POST", headers=big, end=False)
        third = await peer.request(b"/wait", method=b"POST", headers=big, end=False)  # 3 MB > 2.5 MB
        await peer.until(lambda: peer.streams[third].reset_code is not None)
        assert peer.streams[third].reset_code == ErrorCodes.REFUSED_STREAM
        assert conn.body_bytes == 2_000_000 and len(gate.requests) == 2
        # A body with no content-length is counted as it arrives: past the bound, refused too.
        streamed = await peer.request(method=b"POST", end=False)
        await peer.send(streamed, b"x" * 16_384)
        await trio.testing.wait_all_tasks_blocked()
        assert conn.body_bytes == 2_000_000 + 16_384
        while peer.streams[streamed].reset_code is None:  # within the windows, until refused
            if peer.conn.local_flow_control_window(streamed) < 16_384:
                await peer.receive()
                continue
            await peer.send(streamed, b"x" * 16_384)
            await trio.testing.wait_all_tasks_blocked()
            with trio.move_on_after(0.001):  # a RST_STREAM, if one came (before the body timeout)
                await peer.receive()
        assert peer.streams[streamed].reset_code == ErrorCodes.REFUSED_STREAM
        gate.release.set()
        await peer.until(lambda: not conn.streams)
        assert conn.body_bytes == 0 and not done.is_set()
        again = await peer.request(b"/wait", method=b"POST", headers=big, end=False)  # room again
        await peer.until(lambda: peer.streams[again].status != 0 or peer.streams[again].reset_code is not None)
        assert peer.streams[again].status == 200  # accepted, and (the gate is open) answered


async def test_a_client_that_stops_reading_is_not_read_and_is_closed_after_the_send_timeout(autojump_clock):
    limits = Listen(
        header_timeout_s=100, h2_send_timeout_s=11.0, h2_control_frame_burst=10**9, h2_control_frames_per_s=10**9
    )
    lockstep = trio.testing.lockstep_stream_pair  # a write waits until the other side reads it
    async with connection(hello, limits, stream_pair=lockstep) as (peer, conn, done, metrics):
        accepted = 0

        async def flood() -> None:  # PINGs, and never a read of the ACKs
            nonlocal accepted
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                while True:
                    await peer.stream.send_all(PING * 1000)
                    accepted += 1000 * len(PING)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood)
            stalled_at = None
            while not done.is_set():
                before = accepted
                await trio.sleep(1)
                if accepted == before and stalled_at is None:
                    stalled_at = trio.current_time()
            closed_at = trio.current_time()
            nursery.cancel_scope.cancel()
        assert accepted < 4 * h2server.OUT_HIGH  # it stopped reading once its queue was full
        assert stalled_at is not None and closed_at - stalled_at <= limits.h2_send_timeout_s + 1
        assert counted(metrics, "h2_timeouts") == {"send": 1}


# --- the connection's own end ---
async def test_a_writer_that_failed_first_leaves_a_quiet_goodbye(autojump_clock, monkeypatch):
    """The writer finds the socket gone (and cancels the connection) while the reader handles its last
    read without a checkpoint, then returns for a GOAWAY: the goodbye's flush must not escape as a bug.

    Seen under load in tests/security/test_h2_control_flood.py: ClientGone out of `run`, one traceback
    per flooding connection."""

    async def last_read(self, initial: bytes) -> bool:
        self._nursery.cancel_scope.cancel()  # what _write_loop does on BrokenResourceError
        return False  # a protocol error (a flood): GOAWAY queued, to be flushed

    monkeypatch.setattr(H2ServerConnection, "_read", last_read)
    _, server_stream = trio.testing.memory_stream_pair()
    conn = H2ServerConnection(ServerContext(hello, LIMITS, None), server_stream, "192.0.2.9", trio.current_time())
    await conn.run(b"")  # returns; before the fix: ExceptionGroup(ClientGone)
    assert conn.streams == {}
