"""The sidecar's data path end to end: real processes on 127.0.0.1, real clients.

sim-pod <- rampmeter serve <- curl / httpx / h2load / raw sockets.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time

import httpx
import pytest

from proxy.testing.procs import wait_for
from proxy.testing.stack import sidecar, sim_pod
from tests.conftest import free_port, require_binary

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def pod():
    # speed 0.25: a decode step of the llm profile takes ~25 ms, so streams are visibly incremental.
    with sim_pod(speed=0.25) as proc:
        yield proc


@pytest.fixture(scope="module")
def proxy(pod):
    with sidecar(pod.url()) as proc:
        yield proc


def stats(pod) -> dict:
    return httpx.get(pod.url() + "/sim/stats").json()


@pytest.mark.parametrize("flag", ["--http1.1", "--http2-prior-knowledge"])
def test_curl_through_the_sidecar(proxy, flag):
    curl = require_binary("curl")
    out = subprocess.run(
        [curl, "-s", "-i", flag, "--max-time", "20", proxy.url() + "/v1/chat/completions", "-d", json.dumps(CHAT)],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    head, _, body = out.stdout.partition("\n\n")  # text mode turned CRLF into LF
    assert " 200" in head.splitlines()[0]
    lowered = head.lower()
    assert "via: " in lowered and "rampmeter" in lowered
    assert "x-rampmeter-queue-ms: " in lowered and "x-rampmeter-timeout-hint-ms: " in lowered
    assert json.loads(body)["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("http2", [False, True])
def test_httpx_through_the_sidecar(proxy, http2):
    # http1=False: HTTP/2 with prior knowledge (h2c); httpx only negotiates h2 by ALPN over TLS.
    with httpx.Client(http1=not http2, http2=http2, base_url=proxy.url(), timeout=20) as client:
        resp = client.post("/v1/chat/completions", json=CHAT)
    assert resp.status_code == 200
    assert resp.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    assert resp.json()["object"] == "chat.completion"


@pytest.mark.parametrize("h1", [True, False])
def test_h2load_many_concurrent_requests_all_succeed(proxy, h1):
    h2load = require_binary("h2load")
    body = f"{os.environ.get('TMPDIR', '/tmp')}/rampmeter-h2load-{os.getpid()}.json"
    with open(body, "w") as f:
        json.dump({**CHAT, "max_tokens": 1}, f)
    argv = [h2load, "-n", "200", "-c", "4", "-m", "8", "-d", body, "-H", "content-type: application/json"]
    argv += ["--h1"] if h1 else []
    out = subprocess.run(
        [*argv, proxy.url() + "/v1/chat/completions"], check=False, capture_output=True, text=True, timeout=60
    )
    assert "200 succeeded, 0 failed, 0 errored" in out.stdout, out.stdout


def test_streaming_arrives_incrementally(proxy):
    """Tokens reach the client as the engine makes them, not all at the end."""
    arrivals = []
    payload = {"model": "m", "prompt": "count", "max_tokens": 16, "stream": True}
    with httpx.Client(base_url=proxy.url(), timeout=30) as client:
        start = time.monotonic()
        with client.stream("POST", "/v1/completions", json=payload) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    arrivals.append((time.monotonic() - start, line))
    assert arrivals[-1][1] == "data: [DONE]"
    tokens = [t for t, line in arrivals if line != "data: [DONE]"]
    assert len(tokens) == 16
    # 16 engine steps of ~25 ms: a buffering proxy would deliver every token at once, at the end.
    spread = tokens[-1] - tokens[0]
    assert spread > 0.15, f"tokens arrived within {spread:.3f}s of each other: buffered?"
    assert tokens[0] < tokens[-1] * 0.5


@pytest.mark.parametrize("http2", [False, True])
def test_ten_megabytes_both_directions(proxy, http2):
    blob = os.urandom(10 * 1024 * 1024)
    with httpx.Client(http1=not http2, http2=http2, base_url=proxy.url(), timeout=60) as client:
        resp = client.post("/sim/echo", content=blob)
    assert resp.status_code == 200
    assert resp.content == blob


def test_client_disconnect_mid_stream_cancels_the_upstream_work(pod, proxy):
    before = stats(pod)
    payload = {"model": "m", "prompt": "long", "max_tokens": 400, "stream": True}
    with (
        httpx.Client(base_url=proxy.url(), timeout=30) as client,
        client.stream("POST", "/v1/completions", json=payload) as resp,
    ):
        for line in resp.iter_lines():
            if line.startswith("data: "):
                break  # one token, then hang up
    after = wait_for(lambda: (s := stats(pod))["requests_cancelled"] > before["requests_cancelled"] and s, 10)
    assert after["wasted_client_gone_s"] > before["wasted_client_gone_s"]
    assert after["output_tokens"] - before["output_tokens"] < 400


def test_malformed_requests_are_answered_and_the_sidecar_keeps_serving(proxy):
    host, port = proxy.addresses["data"].rsplit(":", 1)
    for raw, status in [
        (b"NOT A REQUEST\r\n\r\n", b"400"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"x-big: " + b"a" * 70_000 + b"\r\n\r\n", b"431"),
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", b"400"),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00garbage-frames" * 4, b""),
    ]:
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(raw)
            answer = s.recv(65536)
        assert status in answer.split(b"\r\n", 1)[0] if status else answer  # h2 garbage: a GOAWAY frame
    with httpx.Client(base_url=proxy.url(), timeout=20) as client:
        assert client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}).status_code == 200


def test_oversized_body_gets_413(proxy):
    with httpx.Client(base_url=proxy.url(), timeout=30) as client:
        resp = client.post("/sim/echo", content=b"x" * (17 * 1024 * 1024))
    assert resp.status_code == 413


def test_h1_client_reaches_an_h2c_upstream(pod):
    with sidecar(pod.url(), protocol="h2c") as proc:
        resp = httpx.post(proc.url() + "/v1/chat/completions", json=CHAT, timeout=20)
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 4
        with httpx.Client(http1=False, http2=True, timeout=20) as client:  # and h2 to h2c
            assert client.post(proc.url() + "/v1/chat/completions", json=CHAT).status_code == 200


def test_unreachable_upstream_answers_502_upstream_unavailable():
    dead = f"http://127.0.0.1:{free_port()}"
    with sidecar(dead, ready=False) as proc:
        resp = httpx.post(proc.url() + "/v1/completions", json={"model": "m", "prompt": "x"}, timeout=20)
        # Not warm yet (the health check fails), so the sidecar says not_ready rather than forwarding.
        assert resp.status_code == 503
        assert resp.headers["x-rampmeter-reason"] == "not_ready"
        assert int(resp.headers["retry-after"]) >= 1
        assert resp.json()["error"]["code"] == "not_ready"


def test_admin_endpoints(proxy):
    admin = proxy.url("admin")
    assert httpx.get(admin + "/healthz").status_code == 200
    assert httpx.get(admin + "/readyz").status_code == 200
    metrics = httpx.get(admin + "/metrics").text
    assert 'rampmeter_requests_total{class="interactive",code="200",protocol="http1"}' in metrics
    assert "rampmeter_queue_depth" in metrics
    stats_json = httpx.get(admin + "/admin/stats").json()
    assert {"server", "admission", "latency", "dedup", "readiness"} <= set(stats_json)
    policy = httpx.get(admin + "/admin/policy").json()
    assert policy["source"] == "embedded default" and policy["version"] == 1


def test_sigterm_drains_in_flight_requests_and_refuses_new_connections(pod):
    with sidecar(pod.url()) as proc:
        results = {}

        def slow_stream():
            payload = {"model": "m", "prompt": "drain", "max_tokens": 40, "stream": True}
            with (
                httpx.Client(timeout=30) as client,
                client.stream("POST", proc.url() + "/v1/completions", json=payload) as resp,
            ):
                results["status"] = resp.status_code
                results["lines"] = [line for line in resp.iter_lines() if line.startswith("data: ")]

        worker = threading.Thread(target=slow_stream)
        worker.start()
        wait_for(lambda: httpx.get(proc.url("admin") + "/admin/stats").json()["server"]["requests_in_flight"] > 0, 10)
        proc.signal(signal.SIGTERM)
        wait_for(lambda: httpx.get(proc.url("admin") + "/readyz").status_code == 503, 5)
        host, port = proc.addresses["data"].rsplit(":", 1)
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=2).close()
        worker.join(30)
        assert results["status"] == 200
        assert results["lines"][-1] == "data: [DONE]" and len(results["lines"]) == 41
        assert proc.wait(15) == 0


def test_upstream_that_dies_while_ready_answers_502_upstream_unavailable():
    with sim_pod() as dying, sidecar(dying.url()) as proc:
        dying.stop()
        # Health checks run every 2 s and need 3 failures: the sidecar is still ready.
        resp = httpx.post(proc.url() + "/v1/completions", json={"model": "m", "prompt": "x"}, timeout=20)
    assert resp.status_code == 502
    assert resp.headers["x-rampmeter-reason"] == "upstream_unavailable"
    assert resp.json()["error"]["code"] == "upstream_unavailable"


def test_upstream_slower_than_its_timeout_answers_504_upstream_timeout(pod, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[[upstreams]]\nurl = "{pod.url()}"\ntimeout_s = 0.3\n')
    with sidecar([], policy=str(policy)) as proc:
        before = stats(pod)
        slow = {"model": "m", "prompt": "slow", "max_tokens": 200}  # ~5 s at this pod's speed
        resp = httpx.post(proc.url() + "/v1/completions", json=slow, timeout=20)
        assert resp.status_code == 504
        assert resp.headers["x-rampmeter-reason"] == "upstream_timeout"
        # The exchange was cancelled, so the pod stopped generating for nobody.
        after = wait_for(lambda: (s := stats(pod))["requests_cancelled"] > before["requests_cancelled"] and s, 10)
        assert after["output_tokens"] - before["output_tokens"] < 200
