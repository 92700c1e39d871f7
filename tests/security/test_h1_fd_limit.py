"""Issue 13 defect 12: listen.max_connections is held to what the open-file limit allows.

The sidecar runs with a small RLIMIT_NOFILE (soft = hard, so it cannot raise it) and the
default max_connections (4096, far above it). At start it must say, in one line, that it
caps the limit, keeping descriptors for upstream connections and the admin port. Then a
client opening more idle connections than there are descriptors must not lock anyone
out: newcomers are still served (the oldest idle connections are closed to make room),
the admin port keeps answering fresh connections, and nothing floods the log.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.security.harness import Bystander, assert_clean_log, attacked_stack, connect

pytestmark = pytest.mark.integration

NOFILE = 1600  # the upstream pool's 1024 and the admin port's 64 still fit, with room left
ATTACKERS = 1800  # more connections than the sidecar has descriptors


def test_max_connections_is_capped_to_the_fd_limit_and_nobody_is_locked_out():
    with attacked_stack(nofile=NOFILE) as stack:
        startup = stack.sidecar.log()
        assert "max_connections" in startup and "open-file limit" in startup, startup[-2000:]
        idle: list[socket.socket] = []
        healthz: list[int] = []
        try:
            with Bystander(stack, rate=20, keepalive=False) as bystander:
                for i in range(ATTACKERS):
                    try:
                        idle.append(connect(stack))
                    except OSError:
                        pass
                    if i % 50 == 49:
                        time.sleep(0.02)
                        healthz.append(httpx.get(stack.admin + "/healthz", timeout=5).status_code)
                time.sleep(1.0)
            bystander.report().check(min_success=0.95, max_p99_s=1.0)
        finally:
            for sock in idle:
                sock.close()
        assert healthz and all(code == 200 for code in healthz), healthz
        log = stack.sidecar.log()
        noisy = [line for line in log.splitlines() if "accept" in line.lower()]
        assert len(noisy) <= 10, "\n".join(noisy[:20])
        assert_clean_log(stack.sidecar)
