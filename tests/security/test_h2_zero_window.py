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

from tests.security.h2attack import CANCEL, RST_STREAM, RawH2
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


def _zero_window_client(stack, resets: list[tuple[int, float]], sent_at: list[float]) -> None:
    """32 requests on a connection whose streams never get a window; the RST_STREAMs it got go to `resets`."""
    with RawH2(stack, {SettingCodes.INITIAL_WINDOW_SIZE: 0}) as conn:
        blob = b""
        sids = []
        for _ in range(STREAMS_PER_CONNECTION):
            sid, data = conn.chat()
            sids.append(sid)
            blob += data
        conn.send(blob)
        sent_at.append(time.monotonic())
        frames = conn.reader.until(
            lambda fs: sum(f.kind == RST_STREAM for f in fs) >= STREAMS_PER_CONNECTION, SEND_TIMEOUT_S + 8
        )
        resets += [(f.error_code, time.monotonic()) for f in frames if f.kind == RST_STREAM and f.sid in sids]


def test_zero_window_streams_release_their_slots_and_are_reset_after_the_send_timeout(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    with attacked_stack(policy=str(policy)) as stack:
        resets: list[tuple[int, float]] = []
        sent_at: list[float] = []
        attackers = [threading.Thread(target=_zero_window_client, args=(stack, resets, sent_at)) for _ in range(2)]
        for t in attackers:
            t.start()
        time.sleep(0.5)  # the attack's 64 streams are in before the bystanders start
        with Bystander(stack, rate=20) as h1, Bystander(stack, rate=20, http2=True) as h2c:
            time.sleep(3.0)
        for t in attackers:
            t.join(SEND_TIMEOUT_S + 10)
        h1.report().check(min_success=0.95, max_p99_s=1.0)
        h2c.report().check(min_success=0.95, max_p99_s=1.0)
        assert len(resets) == 2 * STREAMS_PER_CONNECTION, f"{len(resets)} of 64 stuck streams were reset"
        assert {code for code, _ in resets} == {CANCEL}
        last_reset = max(at for _, at in resets)
        assert last_reset - min(sent_at) < SEND_TIMEOUT_S + 4, "stuck streams outlived the send timeout"
        assert_clean_log(stack.sidecar)
