"""Defect 4: clients that never open their flow-control window must not hold admission slots.

The attacker opens 2 connections advertising SETTINGS_INITIAL_WINDOW_SIZE = 0 and sends
64 ordinary chat requests on them, against a fixed admission limit of 8. The upstream
answers them all; the responses cannot be sent. Wanted: once an upstream response is
complete its slot is released (the rest is held within the connection's send buffer),
so ordinary clients keep being served; and each stuck stream is reset (RST_STREAM
CANCEL) once the client has read nothing for listen.h2_send_timeout_s.
"""

from __future__ import annotations

import threading
import time

import pytest
from h2.settings import SettingCodes

from tests.security.h2attack import CANCEL, HEADERS, RST_STREAM, RawH2
from tests.security.harness import Bystander, assert_clean_log, attacked_stack

pytestmark = pytest.mark.integration

SEND_TIMEOUT_S = 2.0
POLICY = f"""
[listen]
h2_send_timeout_s = {SEND_TIMEOUT_S}
[limits]
kind = "fixed"
initial_limit = 8
min_limit = 8
max_limit = 8
"""
STREAMS_PER_CONNECTION = 32


def _zero_window_client(stack, streams: dict[tuple[int, int], dict], index: int) -> None:
    """32 requests on a connection whose streams never get a window; when each got its head and its reset."""
    with RawH2(stack, {SettingCodes.INITIAL_WINDOW_SIZE: 0}) as conn:
        blob = b""
        for _ in range(STREAMS_PER_CONNECTION):
            sid, data = conn.chat()
            streams[(index, sid)] = {}
            blob += data
        conn.send(blob)
        deadline = time.monotonic() + 30
        mine = [key for key in streams if key[0] == index]
        while time.monotonic() < deadline and not all("reset" in streams[k] for k in mine) and not conn.reader.eof:
            for frame in conn.reader.read(deadline):
                seen = streams.get((index, frame.sid))
                if seen is not None and frame.kind == HEADERS:
                    seen["head_at"] = time.monotonic()  # the response is ready (held: no window)
                elif seen is not None and frame.kind == RST_STREAM:
                    seen["reset"], seen["reset_at"] = frame.error_code, time.monotonic()


def test_zero_window_streams_release_their_slots_and_are_reset_after_the_send_timeout(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    with attacked_stack(policy=str(policy)) as stack:
        streams: dict[tuple[int, int], dict] = {}
        attackers = [threading.Thread(target=_zero_window_client, args=(stack, streams, i)) for i in range(2)]
        for t in attackers:
            t.start()
        time.sleep(0.5)  # the attack's 64 streams are in before the bystanders start
        with Bystander(stack, rate=20) as h1, Bystander(stack, rate=20, http2=True) as h2c:
            time.sleep(3.0)
        for t in attackers:
            t.join(30)
        h1.report().check(min_success=0.95, max_p99_s=1.0)
        h2c.report().check(min_success=0.95, max_p99_s=1.0)
        assert len(streams) == 2 * STREAMS_PER_CONNECTION
        assert all(s.get("reset") == CANCEL for s in streams.values()), streams
        # Each stuck stream lived h2_send_timeout_s from the moment its response was ready, no longer.
        lived = sorted(s["reset_at"] - s["head_at"] for s in streams.values())
        assert lived[0] >= SEND_TIMEOUT_S - 0.2 and lived[-1] <= SEND_TIMEOUT_S + 1.5, lived
        assert_clean_log(stack.sidecar)
