"""Answers the HTTP/1.1 layer writes itself carry an x-request-id, and the log line about them names it.

Parse errors (400, 431), a head or body that never arrives (408) and a body over the
limit (413) are answered before (or without) the request path, which gives every
other answer its id. A real sidecar on 127.0.0.1, raw sockets: each answer must
carry an id in the proxy's format (32 lower-case hex digits when made here; the
client's own when it sent an acceptable one and its head was parsed), and that id
must be in the sidecar's log, so a client's report of the answer can be found there.
"""

from __future__ import annotations

import re
import socket
import time

import pytest

from tests.security.harness import assert_clean_log, attacked_stack, connect
from tests.security.reload_helpers import BASE

pytestmark = pytest.mark.integration

POLICY = (
    BASE + "[listen]\nheader_timeout_s = 0.5\nbody_timeout_s = 0.5\nmax_header_bytes = 2048\nmax_body_bytes = 1000\n"
)
MADE = re.compile(rb"[0-9a-f]{32}")


def exchange(sock: socket.socket, data: bytes) -> bytes:
    """Send `data`, then read until the sidecar closes the connection (each case's answer closes it)."""
    sock.settimeout(5.0)
    sock.sendall(data)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def request_id_of(answer: bytes) -> bytes:
    head = answer.split(b"\r\n\r\n", 1)[0]
    ids = [
        line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")[1:] if line.lower().startswith(b"x-request-id:")
    ]
    assert len(ids) == 1, answer
    return ids[0]


def test_own_answers_carry_a_request_id_that_the_log_names(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    cases = {
        400: b"GET / HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
        431: b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 4000 + b"\r\n\r\n",
        413: b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5000\r\n\r\n",
        408: b"GET / HTTP/1.1\r\nhost: x\r\n",  # the head never ends: header_timeout_s
    }
    with attacked_stack(policy=str(policy)) as stack:
        seen: dict[int, bytes] = {}
        for status, data in cases.items():
            with connect(stack) as sock:
                answer = exchange(sock, data)
            assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:200]
            seen[status] = rid = request_id_of(answer)
            assert MADE.fullmatch(rid), rid
        # A body that stops (408 from body_timeout_s) and a client that sent an id of its own: kept.
        with connect(stack) as sock:
            answer = exchange(
                sock,
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n"
                b'x-request-id: client-id-1\r\n\r\n{"mo',
            )
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert request_id_of(answer) == b"client-id-1"
        assert len(set(seen.values())) == len(seen)  # made per answer
        deadline = time.monotonic() + 5.0
        wanted = [rid.decode() for rid in seen.values() if rid] + ["client-id-1"]
        while True:
            stack.sidecar.log()  # flushes
            log = stack.sidecar.log_path.read_text(errors="replace")
            missing = [rid for rid in wanted if rid not in log]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not missing, f"request ids not in the sidecar log: {missing}\n{log[-3000:]}"
        assert_clean_log(stack.sidecar)
