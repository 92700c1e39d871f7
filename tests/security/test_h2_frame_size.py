"""Defect 3: a frame is judged by its 9-byte header, and a connection's memory is bounded.

Two ways to make a connection hold memory it never asked for:
- a frame header announcing 16 MiB, then the payload (h2 buffered the whole frame before
  checking its length): wanted GOAWAY(FRAME_SIZE_ERROR) right after the header;
- a header block that never ends (HEADERS without END_HEADERS, then CONTINUATION
  fragments, the 2024 CONTINUATION floods): wanted GOAWAY(ENHANCE_YOUR_CALM) once the
  block passes the connection's header block bound, long before h2's own 64-frame cap.
Twenty attacking connections at once; the sidecar's RSS must stay bounded throughout.
"""

from __future__ import annotations

import threading
import time

import h2.exceptions
import pytest

from tests.security.h2attack import (
    ENHANCE_YOUR_CALM,
    FRAME_SIZE_ERROR,
    HEADERS,
    RawH2,
    continuation_raw,
    frame_header,
    goaway_of,
    headers_frame_raw,
)
from tests.security.harness import Bystander, assert_clean_log, attacked_stack, rss_bytes

pytestmark = pytest.mark.integration

CONNECTIONS = 20
HUGE = 2**24 - 1  # the largest length a frame header can announce
CHUNK = b"\0" * 65_536


def _oversized_frame(conn: RawH2) -> None:
    conn.send(frame_header(HUGE, HEADERS, 0x4, 1))
    for _ in range(HUGE // len(CHUNK)):
        conn.send(CHUNK)  # the server should have hung up long before this ends


def _endless_header_block(conn: RawH2) -> None:
    fragment = b"\0" * 16_000  # HPACK garbage: never decoded if the block never ends
    conn.send(headers_frame_raw(1, fragment, end_headers=False))
    for _ in range(63):  # h2's own cap is 64 frames (1 MiB at this size)
        conn.send(continuation_raw(1, fragment, end_headers=False))


ATTACKS = {
    "frame_header_16mib": (_oversized_frame, FRAME_SIZE_ERROR),
    "endless_header_block": (_endless_header_block, ENHANCE_YOUR_CALM),
}


def _attack(stack, how, codes: list[int], started: threading.Barrier) -> None:
    with RawH2(stack) as conn:
        started.wait(10)
        try:
            how(conn)
        except OSError:
            pass  # the server closed the connection: expected
        goaway = goaway_of(conn.reader.until(lambda frames: goaway_of(frames) is not None, 5.0))
        codes.append(-1 if goaway is None else goaway.error_code)


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_oversized_frames_and_header_blocks_are_refused_from_their_headers(attack):
    how, expected = ATTACKS[attack]
    with attacked_stack() as stack:
        baseline = rss_bytes(stack.pid)
        with Bystander(stack, rate=20, http2=True) as bystander:
            codes: list[int] = []
            started = threading.Barrier(CONNECTIONS)
            threads = [threading.Thread(target=_attack, args=(stack, how, codes, started)) for _ in range(CONNECTIONS)]
            begin = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            took = time.monotonic() - begin
            time.sleep(0.5)  # a last RSS sample after the attack
        assert codes == [expected] * CONNECTIONS, codes
        assert took < 10, f"the attack took {took:.1f}s: connections were not refused from the frame header"
        report = bystander.report()
        report.check(min_success=0.95, max_p99_s=1.0, max_rss_mib=256)
        # 20 connections: each may hold at most its bounded buffers (a few MiB), never a whole frame.
        assert report.peak_rss_bytes - baseline < 64 * 2**20, (baseline, report.peak_rss_bytes)
        assert_clean_log(stack.sidecar)


BODY_STREAMS = 20
BODY_BYTES = 4 * 2**20 - 1  # each within max_body_bytes; 20 of them: 80 MiB
BODY_POLICY = """
[listen]
max_body_bytes = 4194304
h2_body_bytes_per_connection = 8388608
"""


def _push(conn: RawH2, sid: int, size: int, deadline: float) -> int:
    """Send up to `size` body bytes on `sid` as fast as the windows allow; what was sent."""
    sent, step = 0, conn.h2.max_outbound_frame_size
    try:
        while sent < size and time.monotonic() < deadline:
            window = min(conn.h2.local_flow_control_window(sid), size - sent)
            if window <= 0:
                conn.events_until(lambda events: bool(events), 1.0)  # WINDOW_UPDATEs, or a reset
                continue
            for offset in range(0, window, step):
                conn.h2.send_data(sid, b"b" * min(step, window - offset))
            conn.send(conn.h2.data_to_send())
            sent += window
    except h2.exceptions.StreamClosedError:
        pass  # refused (REFUSED_STREAM) or reset
    return sent


def test_request_bodies_held_by_one_connection_are_bounded(tmp_path):
    """Bodies that never end, on one connection, each within max_body_bytes: what they may hold in all."""
    policy = tmp_path / "policy.toml"
    policy.write_text(BODY_POLICY)
    with attacked_stack(policy=str(policy)) as stack:
        baseline = rss_bytes(stack.pid)
        with Bystander(stack, rate=20, http2=True) as bystander, RawH2(stack) as conn:
            extra = [(b"content-type", b"application/json"), (b"content-length", b"%d" % (BODY_BYTES + 1))]
            sids, blob = [], b""
            for _ in range(BODY_STREAMS):
                sid, head = conn.head(extra=extra)
                sids.append(sid)
                blob += head
            conn.send(blob)
            conn.events_until(lambda events: False, 0.5)  # the refusals, if any
            deadline = time.monotonic() + 10
            sent = [_push(conn, sid, BODY_BYTES, deadline) for sid in sids]  # all but the last byte
            time.sleep(0.5)  # a last RSS sample with every body held
        report = bystander.report()
        report.check(min_success=0.95, max_p99_s=1.0, max_rss_mib=256)
        # h2_body_bytes_per_connection (8 MiB): two such bodies are accepted, the rest refused.
        assert sum(1 for s in sent if s == BODY_BYTES) == 2, sent
        assert report.peak_rss_bytes - baseline < 48 * 2**20, (baseline, report.peak_rss_bytes)
        assert_clean_log(stack.sidecar)
