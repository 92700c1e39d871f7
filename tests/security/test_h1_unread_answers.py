"""HTTP/1.1 answers the sidecar writes itself are bounded in time like proxied ones.

Found while documenting issue 13: a client pipelining requests the sidecar answers on its
own (`OPTIONS *` here; a served_paths 404 or a classification 400 alike) and never reading
kept its connection for ever: those answers carry no deadline, and a connection that is
writing is neither timed out nor evicted. With max_connections = 8, eight such clients
held every slot for over 30 s and newcomers were reset. Wanted: a write that makes no
progress for listen.send_timeout_s ends the connection (as nginx's send_timeout), so the
slots come back and newcomers are served.
"""

from __future__ import annotations

import socket
import time

import pytest

from tests.security.harness import Bystander, assert_clean_log, attacked_stack

pytestmark = pytest.mark.integration

SEND_TIMEOUT_S = 1.0
ATTACKERS = 8
POLICY = f"""
[listen]
max_connections = {ATTACKERS + 2}
send_timeout_s = {SEND_TIMEOUT_S}
"""


def _pipeline_and_never_read(stack) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.settimeout(0.5)
    sock.connect(stack.data)
    request = b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n" * 200
    try:
        for _ in range(200):  # far more answers than the kernel buffers on both sides hold
            sock.sendall(request)
    except (TimeoutError, OSError):
        pass  # the sidecar stopped reading: its writes are stuck
    return sock


def test_a_client_that_never_reads_the_sidecars_own_answers_loses_its_connection(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    with attacked_stack(policy=str(policy)) as stack:
        attackers = [_pipeline_and_never_read(stack) for _ in range(ATTACKERS)]
        try:
            # Each stuck write ends after send_timeout_s and its connection is closed: waited for on the
            # sidecar's count (the attackers are its only data connections), not slept on.
            give_up = time.monotonic() + SEND_TIMEOUT_S + 10.0
            while stack.server_stats()["connections_http1"] and time.monotonic() < give_up:
                time.sleep(0.1)
            closed = 0
            for sock in attackers:
                sock.settimeout(5.0)
                try:
                    while sock.recv(65536):  # drain what was written; then EOF or reset
                        pass
                    closed += 1
                except ConnectionResetError:
                    closed += 1
                except TimeoutError:
                    pass
            assert closed == ATTACKERS, f"{ATTACKERS - closed} non-reading connections still open"
            # Newcomers (a new connection per request) are served: the slots came back.
            with Bystander(stack, rate=10, keepalive=False) as bystander:
                time.sleep(2.0)
            bystander.report().check(min_success=0.95, max_p99_s=1.0)
        finally:
            for sock in attackers:
                sock.close()
        assert_clean_log(stack.sidecar)
