"""Defect 6: rapid reset (CVE-2023-44487) is answered with GOAWAY, not a traceback.

The attacker opens streams and resets each at once (HEADERS then RST_STREAM, hundreds
per write, more than SETTINGS_MAX_CONCURRENT_STREAMS in one read). Before the fix,
`StreamClosedError` escaped `h2server._open` when the server refused a stream the client
had already reset: the connection died with a 40-line traceback and no GOAWAY. Wanted:
streams reset by the client before their response are counted, past
listen.h2_reset_burst (then h2_resets_per_s) the connection gets
GOAWAY(ENHANCE_YOUR_CALM), no upstream request is started for a stream already reset,
and ordinary clients are served throughout.
"""

from __future__ import annotations

import time

import pytest

from tests.security.h2attack import ENHANCE_YOUR_CALM, RawH2, goaway_of, log_lines, metric, pod_inference_requests, rst
from tests.security.harness import Bystander, assert_clean_log, attacked_stack

pytestmark = pytest.mark.integration

PAIRS_PER_WRITE = 300  # > max_concurrent_streams (256): the refusal path runs too
MAX_STREAMS = 20_000
ATTACK_S = 4.0


def _rapid_reset(stack) -> tuple[int | None, int]:
    """Open-and-reset until GOAWAY; (GOAWAY code or None, streams opened)."""
    opened = 0
    with RawH2(stack) as conn:
        stop_at = time.monotonic() + ATTACK_S
        while opened < MAX_STREAMS and time.monotonic() < stop_at:
            blob = b""
            for _ in range(PAIRS_PER_WRITE):
                sid, head = conn.chat()
                blob += head + rst(sid)
            try:
                conn.send(blob)
            except OSError:
                break
            opened += PAIRS_PER_WRITE
            goaway = goaway_of(conn.reader.read(time.monotonic() + 0.01))
            if goaway is not None:
                return goaway.error_code, opened
            if conn.reader.eof:
                break
        goaway = goaway_of(conn.reader.until(lambda frames: goaway_of(frames) is not None, 3.0))
        return (None if goaway is None else goaway.error_code), opened


def test_rapid_reset_gets_goaway_and_starts_no_upstream_request():
    with attacked_stack() as stack:
        with Bystander(stack, rate=20) as h1, Bystander(stack, rate=20, http2=True) as h2c:
            time.sleep(0.3)
            before = pod_inference_requests(stack)
            sent_before = h1.report().sent + h2c.report().sent
            code, opened = _rapid_reset(stack)
            upstream = pod_inference_requests(stack) - before
            bystanders = h1.report().sent + h2c.report().sent - sent_before
        assert code == ENHANCE_YOUR_CALM, f"GOAWAY code {code} after {opened} reset streams"
        assert opened < MAX_STREAMS
        # Only the bystanders' requests (and a few in flight at either end) reached the pod.
        assert upstream <= bystanders + 4, (upstream, bystanders, opened)
        h1.report().check(min_success=0.95, max_p99_s=1.0)
        h2c.report().check(min_success=0.95, max_p99_s=1.0)
        assert metric(stack, "rampmeter_h2_floods_total", kind="rapid_reset") == 1
        assert len(log_lines(stack, "h2 flood")) == 1
        assert_clean_log(stack.sidecar)
