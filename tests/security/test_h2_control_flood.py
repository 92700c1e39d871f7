"""Defect 1: control-frame floods (PING, 1-byte WINDOW_UPDATE, empty DATA) must not starve the loop.

The attacker floods as fast as it can, reading what comes back (so the write queue is
not what stops it), and reconnects after each GOAWAY, for the whole attack. Wanted: each
flooding connection gets GOAWAY(ENHANCE_YOUR_CALM) once past its control-frame budget,
one rate-limited log line and a counter per flood, and ordinary clients on other
connections (HTTP/1.1 and h2c) keep being served quickly while /readyz stays 200.
"""

from __future__ import annotations

import threading
import time

import pytest
from hyperframe.frame import DataFrame

from tests.security.h2attack import ENHANCE_YOUR_CALM, RawH2, goaway_of, log_lines, metric, ping, window_update
from tests.security.harness import Bystander, assert_clean_log, attacked_stack

pytestmark = pytest.mark.integration

ATTACK_S = 3.0
FRAMES_PER_SEND = 500


def _blob(kind: str, conn: RawH2) -> bytes:
    if kind == "ping":
        return ping() * FRAMES_PER_SEND
    if kind == "window_update":
        return window_update(0, 1) * FRAMES_PER_SEND
    sid, head = conn.head()  # a request whose body never comes: empty DATA frames on it
    conn.send(head)
    return DataFrame(sid, data=b"").serialize() * FRAMES_PER_SEND


def _flood(stack, kind: str, stop_at: float, codes: list[int], connections: list[int]) -> None:
    """Flood, reconnecting after every GOAWAY, until `stop_at`; the GOAWAY codes go to `codes`."""
    while time.monotonic() < stop_at:
        connections.append(1)
        with RawH2(stack) as conn:
            blob = _blob(kind, conn)
            while time.monotonic() < stop_at:
                try:
                    conn.send(blob)
                except OSError:
                    break
                goaway = goaway_of(conn.reader.read(time.monotonic() + 0.002))
                if goaway is not None:
                    codes.append(goaway.error_code)
                    break
                if conn.reader.eof:
                    break


@pytest.mark.parametrize("kind", ["ping", "window_update", "empty_data"])
def test_control_frame_flood_gets_enhance_your_calm_and_bystanders_are_served(kind):
    with attacked_stack() as stack:
        with Bystander(stack, rate=20) as h1, Bystander(stack, rate=20, http2=True) as h2c:
            codes: list[int] = []
            connections: list[int] = []
            args = (stack, kind, time.monotonic() + ATTACK_S, codes, connections)
            attacker = threading.Thread(target=_flood, args=args)
            attacker.start()
            attacker.join(ATTACK_S + 10)
        assert codes, "no GOAWAY: the flood went on unanswered"
        assert set(codes) == {ENHANCE_YOUR_CALM}, codes
        h1.report().check(min_success=0.95, max_p99_s=1.0, max_rss_mib=256)
        h2c.report().check(min_success=0.95, max_p99_s=1.0, max_rss_mib=256)
        # Every GOAWAY the attacker read was counted; the last connection may end before it reads one.
        assert len(codes) <= metric(stack, "rampmeter_h2_floods_total", kind="control_frames") <= len(connections)
        lines = log_lines(stack, "h2 flood")
        assert 1 <= len(lines) <= 5 + ATTACK_S + 2, lines  # rate-limited: a burst of 5, then 1 a second
        assert_clean_log(stack.sidecar)
