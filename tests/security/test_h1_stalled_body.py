"""Issue 13 defect 2 (HTTP/1.1): stalled request bodies must not hold the sidecar's connections.

The attack: heads announcing a 100 kB body, a few body bytes, then nothing, from
thousands of connections, more than the connection limit (lowered to keep the test
small). Wanted: every stalled body is answered 408 by its own deadline
(x-request-timeout-ms applies while the body is read) or closed to make room, and
clients that arrive during the attack are still served (the limit keeps headroom:
the slowest connections go first).
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from proxy.testing.procs import wait_for
from tests.security.harness import CHAT, Bystander, assert_clean_log, attacked_stack, connect

pytestmark = pytest.mark.integration

MAX_CONNECTIONS = 128
ATTACKERS = 2000
ATTACK_DEADLINE_MS = 2000
SETTLE_S = 10.0  # after the deadlines: far below body_timeout_s (30 s), so only the deadline can close them
HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b'content-length: 100000\r\nx-request-timeout-ms: %d\r\n\r\n{"model": '
)


def answered(sock: socket.socket) -> bytes | None:
    """What the sidecar said on `sock` (b"" = closed without a word); None if it is still open and silent."""
    sock.setblocking(False)
    out = b""
    try:
        while data := sock.recv(65536):
            out += data
    except BlockingIOError:
        return out or None
    except OSError:
        return out  # reset: closed
    return out


def test_stalled_bodies_are_answered_408_and_newcomers_are_still_served(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(f"[listen]\nmax_connections = {MAX_CONNECTIONS}\n")
    with attacked_stack(policy=str(policy)) as stack:
        attackers: list[socket.socket] = []
        try:
            with Bystander(stack, rate=20, keepalive=False) as bystander:
                for i in range(ATTACKERS):
                    sock = connect(stack)
                    try:
                        sock.sendall(HEAD % ATTACK_DEADLINE_MS)
                    except OSError:
                        pass  # closed at once: also not holding anything
                    attackers.append(sock)
                    if i % 10 == 9:
                        time.sleep(0.02)  # ~500 connections a second: within what a busy core accepts
                sent_at = time.monotonic()
                probe = connect(stack)
                probe.sendall(HEAD % 1000)
                probe.settimeout(10)
                answer = probe.recv(65536)
                probe_s = time.monotonic() - sent_at
                time.sleep(max(0.0, sent_at + ATTACK_DEADLINE_MS / 1000 + 1.0 - time.monotonic()))
            report = bystander.report()
            # On main every newcomer is refused once the slots are full (success ~0); the latency
            # bound is loose because accepting thousands of attackers is work on a shared core.
            report.check(min_success=0.95, max_p99_s=3.0)
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            # By its own 1 s deadline, not by body_timeout_s (30 s): a backlog of attackers to accept may delay it.
            assert probe_s < 8.0, f"408 after {probe_s:.1f}s for a 1 s deadline"
            # Every deadline has passed; a sidecar on a shared core may still be working through the
            # backlog of expiries, so read the sockets until each has its outcome, for at most SETTLE_S.
            outcomes: dict[int, bytes] = {}
            give_up = time.monotonic() + SETTLE_S
            while len(outcomes) < ATTACKERS and time.monotonic() < give_up:
                for i, sock in enumerate(attackers):
                    if i not in outcomes and (o := answered(sock)) is not None:
                        outcomes[i] = o
                if len(outcomes) < ATTACKERS:
                    time.sleep(0.2)
            still_open = ATTACKERS - len(outcomes)
            assert still_open == 0, f"{still_open} of {ATTACKERS} stalled bodies still hold a connection"
            spoken = [o for o in outcomes.values() if o]
            assert spoken and all(o.startswith(b"HTTP/1.1 408 ") for o in spoken), {o[:40] for o in spoken}
        finally:
            for sock in attackers:
                sock.close()
        assert_clean_log(stack.sidecar)


def test_a_stalled_body_is_read_by_its_connection_not_by_a_running_request():
    """A body that has not arrived is read before the handler starts (h1server, "request bodies"): a stalled
    body holds a connection, not a request in flight (which drain and the request path count), and still
    gets its 408 by its own deadline. On main each of these was a request in flight until its 408."""
    stalled = 20
    with attacked_stack() as stack:
        socks = []
        try:
            for _ in range(stalled):
                sock = connect(stack)
                sock.sendall(HEAD % 1500)
                socks.append(sock)

            # Each one accepted and its head read (past detection), its body waited for; waited for, not
            # slept on (a late accept on a loaded machine), and well inside the bodies' 1.5 s deadline.
            wait_for(lambda: stack.server_stats()["connections_http1"] >= stalled, timeout_s=1.0, interval_s=0.02)
            stats = stack.server_stats()
            assert stats["connections_http1"] >= stalled, stats
            assert stats["requests_in_flight"] == 0, stats
            for sock in socks:
                sock.settimeout(5)
                assert sock.recv(65536).startswith(b"HTTP/1.1 408 ")
        finally:
            for sock in socks:
                sock.close()
        # The request path is still run for a body that did arrive, if late.
        sock = connect(stack)
        body = json.dumps(CHAT).encode()
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body) + body[:5]
        )
        time.sleep(0.2)
        sock.sendall(body[5:])
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        sock.close()
        assert_clean_log(stack.sidecar)
