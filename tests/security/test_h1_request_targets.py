"""Issue 13 defect 7 (HTTP/1.1): request targets that do not start with "/".

Absolute-form (`GET http://x/v1/... HTTP/1.1`, which RFC 9112 3.2.2 says a server must
accept) is normalised and served; `OPTIONS *` is answered by the sidecar itself;
anything else (authority-form, `GET *`, other schemes) is 400, with at most a few
rate-limited log lines however many arrive, and never a traceback.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.security.harness import CHAT, Bystander, assert_clean_log, attacked_stack, connect

pytestmark = pytest.mark.integration

BAD = [b"GET * HTTP/1.1", b"CONNECT pod:8000 HTTP/1.1", b"GET ftp://x/v1/models HTTP/1.1", b"GET pod:8000 HTTP/1.1"]
FLOOD = 300


def exchange(stack, raw: bytes) -> bytes:
    """Send one request, read one content-length framed answer (or up to EOF)."""
    with connect(stack) as sock:
        sock.sendall(raw)
        buf = b""
        while b"\r\n\r\n" not in buf and (data := sock.recv(65536)):
            buf += data
        head, _, body = buf.partition(b"\r\n\r\n")
        length = next(
            (int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")) if k.lower() == b"content-length"),
            0,
        )
        while len(body) < length and (data := sock.recv(65536)):
            body += data
        return head + b"\r\n\r\n" + body


def test_absolute_form_is_served_asterisk_answered_and_the_rest_refused_quietly():
    body = json.dumps(CHAT).encode()
    absolute = (
        b"POST http://pod.internal/v1/chat/completions HTTP/1.1\r\nhost: pod.internal\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )
    with attacked_stack() as stack:
        with Bystander(stack, rate=20) as bystander:
            started = time.monotonic()
            served = exchange(stack, absolute)
            options = exchange(stack, b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n")
            refused = [exchange(stack, BAD[i % len(BAD)] + b"\r\nhost: x\r\n\r\n") for i in range(FLOOD)]
            time.sleep(max(0.0, started + 1.5 - time.monotonic()))  # long enough for the bystander to have a say
        bystander.report().check(min_success=0.95, max_p99_s=1.0)
        assert served.startswith(b"HTTP/1.1 200 "), served[:300]
        assert json.loads(served.partition(b"\r\n\r\n")[2])["object"] == "chat.completion"
        assert options.split(b" ", 2)[1] in (b"200", b"204") and b"\r\nallow: " in options.lower()
        assert all(r.startswith(b"HTTP/1.1 400 ") for r in refused), {r[:40] for r in refused}
        assert_clean_log(stack.sidecar)
        log = stack.sidecar.log()
        lines = [line for line in log.splitlines() if "target" in line.lower()]
        assert len(lines) <= 10, f"{len(lines)} log lines for {FLOOD} bad targets:\n" + "\n".join(lines[:20])
