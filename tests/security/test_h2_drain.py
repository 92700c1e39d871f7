"""Graceful drain on h2: in-flight requests of real clients finish when the sidecar gets SIGTERM.

What real clients do with GOAWAY decides the design (proxy/http/h2server.py, drain):
- httpx (python-h2 + httpcore) ends every stream not yet answered at the first GOAWAY,
  whatever its last-stream-id: h2's state machine closes on it and rejects the frames
  that follow, and httpcore raises RemoteProtocolError for a stream still waiting.
  Before the fix the sidecar sent GOAWAY at once, so an in-flight httpx request always
  failed. Now a busy connection is first given time to go idle (a quarter of
  drain_timeout_s, at most 5 s) and then gets a single GOAWAY, so requests that end
  within that time survive;
- nghttp2 clients (curl, nghttp, Envoy) honour last-stream-id, so a request still
  running after that wait finishes under the two-step GOAWAY (2^31-1 with a PING, then
  the real one a round trip later).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading

import httpx
import pytest

from proxy.testing.stack import sidecar, sim_pod, wait_pod_busy
from tests.conftest import require_binary
from tests.security.harness import assert_clean_log

pytestmark = pytest.mark.integration

# drain_timeout_s 4: a busy connection waits 1 s to go idle, then gets the two-step GOAWAY.
POLICY = "[listen]\ndrain_timeout_s = 4.0\n"


def _chat(tokens: int) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}


@pytest.fixture
def pod_and_stack(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    with sim_pod(speed=1.0) as pod, sidecar(pod.url(), policy=str(policy)) as proxy:
        yield pod, proxy


def test_an_in_flight_httpx_request_survives_the_drain(pod_and_stack):
    pod, stack = pod_and_stack
    url = stack.url("data") + "/v1/chat/completions"
    outcome: list = []
    with httpx.Client(http2=True, http1=False, timeout=10) as client:
        assert client.post(url, json=_chat(1)).http_version == "HTTP/2"  # the connection exists

        def in_flight() -> None:
            try:
                outcome.append(client.post(url, json=_chat(50)).status_code)  # ~0.5 s
            except httpx.HTTPError as exc:
                outcome.append(repr(exc))

        thread = threading.Thread(target=in_flight)
        thread.start()
        wait_pod_busy(pod)
        stack.signal(signal.SIGTERM)
        thread.join(10)
    assert outcome == [200]
    assert stack.wait(10) == 0
    assert_clean_log(stack)


def test_a_long_in_flight_request_survives_the_two_step_goaway(pod_and_stack, tmp_path):
    """Still running after the idle wait: the two-step GOAWAY, and nghttp2 keeps the stream."""
    pod, stack = pod_and_stack
    nghttp = require_binary("nghttp")
    body = tmp_path / "chat.json"
    body.write_text(json.dumps(_chat(400)))  # ~2.5 s at speed 1: outlives the 1 s idle wait
    url = stack.url("data") + "/v1/chat/completions"
    proc = subprocess.Popen(
        [nghttp, "-nv", "-H", "content-type: application/json", "-d", str(body), url], stdout=subprocess.PIPE, text=True
    )
    wait_pod_busy(pod)
    stack.signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    seen = [
        line.split("]", 1)[1].strip() for line in out.splitlines() if re.search(r"recv (GOAWAY|PING)|:status", line)
    ]
    last_ids = re.findall(r"last_stream_id=(\d+)", out.split(":status")[0])
    assert seen[:3] == [
        "recv GOAWAY frame <length=8, flags=0x00, stream_id=0>",
        "recv PING frame <length=8, flags=0x00, stream_id=0>",
        "recv GOAWAY frame <length=8, flags=0x00, stream_id=0>",
    ], out
    assert int(last_ids[0]) == 2**31 - 1 and int(last_ids[1]) < 2**31 - 1, last_ids
    assert "recv (stream_id=" in out and ":status: 200" in out, out
    assert stack.wait(10) == 0
    assert_clean_log(stack)
