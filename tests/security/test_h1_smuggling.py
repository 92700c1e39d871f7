"""Issue 13 defect 11: Content-Length together with Transfer-Encoding is refused (400) and the connection closed.

RFC 9112 6.1: such a request may be processed, but the connection must close after it,
because a front proxy that framed it by Content-Length and the sidecar that frames it
by chunked disagree on where the next request starts: behind such a proxy the bytes
after the chunked body (here `GET /SMUGGLED`) would reach the model server as a request
nobody sent. Refusing it outright, as HAProxy does, leaves nothing to disagree about.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.security.harness import Bystander, assert_clean_log, attacked_stack, connect

pytestmark = pytest.mark.integration

SMUGGLED = b"GET /SMUGGLED HTTP/1.1\r\nhost: x\r\n\r\n"
BODY = b"0\r\n\r\n" + SMUGGLED  # a front proxy framing by content-length sees this as the body


def read_all(sock) -> bytes:
    out = b""
    while data := sock.recv(65536):
        out += data
    return out


@pytest.mark.parametrize("order", ["cl-first", "te-first"])
def test_content_length_with_transfer_encoding_is_refused_and_closed(order):
    cl, te = b"content-length: %d\r\n" % len(BODY), b"transfer-encoding: chunked\r\n"
    fields = cl + te if order == "cl-first" else te + cl
    attack = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" + fields + b"\r\n" + BODY
    with attacked_stack() as stack:
        before = httpx.get(stack.pod.url() + "/sim/stats").json()["not_found"]
        with Bystander(stack, rate=20) as bystander:
            answers = []
            until = time.monotonic() + 1.5  # long enough for the bystander to have a say
            while len(answers) < 50 or (time.monotonic() < until and len(answers) < 5000):
                with connect(stack) as sock:
                    sock.sendall(attack)
                    answers.append(read_all(sock))  # returns only once the sidecar closed the connection
        bystander.report().check(min_success=0.95, max_p99_s=1.0)
        assert all(a.startswith(b"HTTP/1.1 400 ") for a in answers), answers[0][:200]
        assert all(a.count(b"HTTP/1.1 ") == 1 for a in answers), "a second answer: the smuggled request ran"
        assert all(b"connection: close" in a.lower() for a in answers)
        assert httpx.get(stack.pod.url() + "/sim/stats").json()["not_found"] == before  # /SMUGGLED never arrived
        assert_clean_log(stack.sidecar)
