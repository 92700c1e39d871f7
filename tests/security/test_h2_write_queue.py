"""Defect 5: what is queued for writing on a connection is bounded, whatever the client does.

The attacker floods PINGs and never reads, so every PING ACK the sidecar makes has to
wait in its write queue (before the fix: RSS grew linearly, 30 MB in 40 s). The
control-frame budget is set out of the way here (this is the write queue's test, not
the flood budget's). Wanted: past the write queue's bound the sidecar stops reading
from the connection (the attacker's sends stall), and once nothing has been written for
listen.h2_send_timeout_s it closes the connection.
"""

from __future__ import annotations

import socket
import time

import pytest

from tests.security.h2attack import FrameReader, ping
from tests.security.harness import Bystander, assert_clean_log, attacked_stack

pytestmark = pytest.mark.integration

SEND_TIMEOUT_S = 2.0
POLICY = f"""
[listen]
h2_send_timeout_s = {SEND_TIMEOUT_S}
h2_control_frame_burst = 100000000
h2_control_frames_per_s = 100000000
"""
FLOOD_S = 3.0
# What the attacker could push before its sends stall: the sidecar's bound (1 MiB) plus what
# the kernel buffers on both sides (a few MiB on loopback). Without the bound: all it likes.
MAX_ACCEPTED_BYTES = 24 * 2**20


def _non_reading_socket(stack) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.settimeout(1.0)
    sock.connect(stack.data)
    return sock


def test_non_reading_ping_flood_is_bounded_then_closed(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    with attacked_stack(policy=str(policy)) as stack:
        with Bystander(stack, rate=20) as h1, Bystander(stack, rate=20, http2=True) as h2c:
            sock = _non_reading_socket(stack)
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            blob, accepted, stalled_at, reset = ping() * 1000, 0, None, False
            stop_at = time.monotonic() + FLOOD_S
            while time.monotonic() < stop_at:
                try:
                    sent = sock.send(blob)
                except TimeoutError:  # nothing accepted for 1 s: the sidecar stopped reading
                    stalled_at = stalled_at or time.monotonic()
                    continue
                except OSError:
                    # Closed already: on a slow machine the attacker fills the kernel buffers more
                    # slowly than the send timeout runs, so the sidecar (which stopped reading, or its
                    # write queue could not have held) hangs up before a send blocks for a whole second.
                    reset = True
                    break
                accepted += sent
            time.sleep(SEND_TIMEOUT_S + 1.0)
            reader = FrameReader(sock)
            reader.until(lambda frames: False, 3.0)  # read what is left: it must end (the sidecar hung up)
            closed = reader.eof
            sock.close()
        h1.report().check(min_success=0.95, max_p99_s=1.0, max_rss_mib=256)
        h2c.report().check(min_success=0.95, max_p99_s=1.0, max_rss_mib=256)
        assert accepted <= MAX_ACCEPTED_BYTES, f"the sidecar read {accepted / 2**20:.0f} MiB it could not answer"
        assert stalled_at is not None or reset, "the attacker's sends never stalled: the sidecar kept reading"
        assert reset or closed, "the sidecar kept the non-reading connection open past its send timeout"
        assert_clean_log(stack.sidecar)
