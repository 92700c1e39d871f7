"""`python -m proxy sim-pod` as a real process, driven by curl, httpx and the OpenAI SDK."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import httpx
import openai
import pytest

from proxy.testing.procs import Proc, wait_for
from tests.conftest import require_binary

pytestmark = pytest.mark.integration

# llm shape at 20x speed: a 16-token answer takes ~5 ms of engine time.
POD_ARGS = ["sim-pod", "--listen", "127.0.0.1:0", "--profile", "llm", "--speed", "20", "--seed", "3"]


@pytest.fixture(scope="module")
def pod():
    with Proc(POD_ARGS, name="sim-pod") as proc:
        yield proc


@pytest.fixture
def url(pod) -> str:
    httpx.post(pod.url() + "/sim/reset-stats", timeout=5).raise_for_status()
    return pod.url()


def stats(url: str) -> dict:
    return httpx.get(url + "/sim/stats", timeout=5).json()


def chat_body(max_tokens: int, stream: bool = False) -> dict:
    return {
        "model": "sim-llm",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def curl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [require_binary("curl"), "-sS", "--max-time", "10", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=15,
    )


def sse_events(text: str) -> list:
    frames = [f for f in text.split("\n\n") if f.strip()]
    return [f[6:] if f == "data: [DONE]" else json.loads(f[6:]) for f in frames]


@pytest.mark.parametrize("proto", ["--http1.1", "--http2-prior-knowledge"])
def test_curl_non_streaming_and_streaming(url, proto) -> None:
    out = curl(
        proto, "-H", "content-type: application/json", "-d", json.dumps(chat_body(6)), url + "/v1/chat/completions"
    )
    doc = json.loads(out.stdout)
    assert doc["usage"]["completion_tokens"] == 6 and doc["choices"][0]["message"]["role"] == "assistant"
    out = curl(
        proto,
        "-N",
        "-H",
        "content-type: application/json",
        "-d",
        json.dumps(chat_body(5, True)),
        url + "/v1/chat/completions",
    )
    events = sse_events(out.stdout)
    assert len(events) == 6 and events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"]["content"] for e in events[:-1])
    s = stats(url)
    assert (s["requests_executed"], s["requests_completed"], s["output_tokens"]) == (2, 2, 11)


def test_curl_reports_protocol_errors_as_openai_errors(url) -> None:
    out = curl("-w", "\n%{http_code}", "-d", "{broken", url + "/v1/completions")
    body, code = out.stdout.rsplit("\n", 1)
    assert code == "400" and json.loads(body)["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("http2", [False, True])
def test_httpx_h1_and_h2c_concurrent_requests(url, http2) -> None:
    with httpx.Client(http1=not http2, http2=http2, timeout=10) as client:
        responses = [
            client.post(
                url + "/v1/completions", json={"prompt": f"p{i}", "max_tokens": 4}, headers={"idempotency-key": "same"}
            )
            for i in range(5)
        ]
        assert {r.http_version for r in responses} == {"HTTP/2" if http2 else "HTTP/1.1"}
        assert all(r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4 for r in responses)
        with client.stream("POST", url + "/v1/completions", json={"prompt": "s", "max_tokens": 3, "stream": True}) as r:
            lines = [line for line in r.iter_lines() if line]
        assert len(lines) == 4 and lines[-1] == "data: [DONE]"
        health = client.get(url + "/health")
        assert health.status_code == 200 and len(health.json()["instance_id"]) == 32
        assert "vllm:num_requests_running" in client.get(url + "/metrics").text
    s = stats(url)
    assert s["requests_executed"] == 6 and s["executions_by_idempotency_key"] == {"same": 5}


def test_openai_sdk_chat_completions_and_embeddings(url) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=10)
    chat = client.chat.completions.create(model="sim-llm", messages=[{"role": "user", "content": "hi"}], max_tokens=7)
    assert chat.usage.completion_tokens == 7 and chat.choices[0].finish_reason == "length"
    stream = client.chat.completions.create(
        model="sim-llm",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta.content for c in chunks if c.choices]
    assert len(deltas) == 5 and all(deltas) and chunks[-1].usage.completion_tokens == 5
    text = client.completions.create(model="sim-llm", prompt="once upon", max_tokens=3)
    assert text.choices[0].text and text.usage.prompt_tokens == 3
    emb = client.embeddings.create(model="sim-llm", input=["a", "b"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 8
    assert [m.id for m in client.models.list()] == ["sim-llm"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="sim-llm", messages=[], max_tokens=1)
    assert stats(url)["requests_completed"] == 4


@pytest.mark.parametrize("http2", [False, True])
def test_disconnect_mid_stream_is_counted_as_cancelled_and_wasted(url, http2) -> None:
    body = chat_body(4000, stream=True)
    with httpx.Client(timeout=10, http1=not http2, http2=http2) as client:
        with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(5)]  # a few tokens, then hang up
        assert r.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    # (httpx never resets an h2 stream it stops reading; closing the client drops the connection)
    assert all(line.startswith("data: ") or not line for line in got)
    wait_for(lambda: stats(url)["requests_cancelled_running"] == 1, 5)
    s = stats(url)
    assert s["running"] == 0 and s["kv_reserved_tokens"] == 0
    assert s["wasted_client_gone_s"] > 0 and s["output_tokens"] < 4000


def test_runtime_fault_injection_over_http(url) -> None:
    assert httpx.post(url + "/sim/faults", json={"error_rate": 1.0, "duration_s": 30}, timeout=5).status_code == 200
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=5)
    assert r.status_code == 500 and r.json()["error"]["type"] == "internal_server_error"
    assert httpx.post(url + "/sim/faults", json={}, timeout=5).json()["windows"] == []
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=5)
    assert r.status_code == 200
    s = stats(url)
    assert (s["injected_errors"], s["requests_executed"]) == (1, 1)


def test_cold_start_then_graceful_sigterm() -> None:
    with Proc(
        ["sim-pod", "--listen", "127.0.0.1:0", "--cold-start-s", "1", "--profile", "fixed"], name="sim-pod-cold"
    ) as proc:
        first = httpx.get(proc.url() + "/health", timeout=5)
        assert first.status_code == 503 and first.json()["status"] == "starting"
        wait_for(lambda: httpx.get(proc.url() + "/health", timeout=5).status_code == 200, 10)
        assert httpx.get(proc.url() + "/health", timeout=5).json()["instance_id"] == first.json()["instance_id"]
        proc.signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_help_lists_every_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "proxy", "sim-pod", "--help"], check=True, capture_output=True, text=True, timeout=30
    ).stdout
    for flag in (
        "--listen",
        "--profile",
        "--speed",
        "--seed",
        "--cold-start-s",
        "--cold-penalty-requests",
        "--fault-slowdown",
        "--fault-error-rate",
        "--fault-start-s",
        "--fault-duration-s",
        "--max-num-seqs",
        "--kv-capacity-tokens",
        "--base-ms",
        "--fixed-steps",
        "--stop-mean-tokens",
    ):
        assert flag in out


def test_h2_rst_stream_cancels_only_that_stream(url) -> None:
    import socket

    import h2.config
    import h2.connection
    import h2.events

    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        conn.initiate_connection()

        def request(body: dict) -> int:
            sid = conn.get_next_available_stream_id()
            conn.send_headers(
                sid,
                [
                    (":method", "POST"),
                    (":path", "/v1/chat/completions"),
                    (":scheme", "http"),
                    (":authority", "pod"),
                    ("content-type", "application/json"),
                ],
            )
            conn.send_data(sid, json.dumps(body).encode(), end_stream=True)
            sock.sendall(conn.data_to_send())
            return sid

        def events():
            while True:
                data = sock.recv(65536)
                assert data, "connection closed"
                yield from conn.receive_data(data)
                sock.sendall(conn.data_to_send())

        long_id = request(chat_body(4000, stream=True))
        seen = 0
        for ev in events():
            if isinstance(ev, h2.events.DataReceived) and ev.stream_id == long_id:
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                seen += ev.data.count(b"data: ")
                if seen >= 5:
                    break
        conn.reset_stream(long_id)
        short_id = request(chat_body(3))
        answer = b""
        for ev in events():
            if isinstance(ev, h2.events.DataReceived) and ev.stream_id == short_id:
                answer += ev.data
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            if isinstance(ev, h2.events.StreamEnded) and ev.stream_id == short_id:
                break
    assert json.loads(answer)["usage"]["completion_tokens"] == 3  # same connection still serves
    s = stats(url)
    assert (s["requests_cancelled_running"], s["requests_completed"], s["running"]) == (1, 1, 0)
    assert s["wasted_client_gone_s"] > 0


def test_habit_flags_on_a_real_process_serial_no_health_no_v1_keeps_computing() -> None:
    args = ["sim-pod", "--listen", "127.0.0.1:0", "--profile", "serial", "--speed", "20"]
    with Proc([*args, "--health-path", "", "--api-prefix", ""], name="sim-pod") as proc:
        url = proc.url()
        assert httpx.get(url + "/health", timeout=5).status_code == 404
        assert httpx.post(url + "/v1/chat/completions", json=chat_body(2), timeout=5).status_code == 404
        with pytest.raises(httpx.ReadTimeout):  # ~0.26 s of work; the client leaves after 0.05 s
            httpx.post(url + "/chat/completions", json=chat_body(256), timeout=0.05)
        done = httpx.post(url + "/chat/completions", json=chat_body(2), timeout=10)
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 2
        s = stats(url)
        assert (s["profile"], s["max_num_seqs"], s["requests_orphaned"], s["requests_completed"]) == ("serial", 1, 1, 2)
        assert s["wasted_client_gone_s"] >= 0.2  # the orphan ran to its end before the next one
    bad = subprocess.run(
        [sys.executable, "-m", "proxy", *args, "--stops-on-cancel", "maybe"], capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2 and "expected true or false" in bad.stderr
