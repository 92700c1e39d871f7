"""client_sdk against the real sidecar: sim-pod <- rampmeter serve <- the SDK (and the OpenAI SDK over it).

Real processes on loopback. The module's pod (llm profile at --speed 20: a
16-token answer takes a few ms) sits behind one sidecar; tests that need a pod
that is down, or a pod stand-in that records what it receives, start their
own. The pod's /sim/stats is the witness of what reached the engine; an inner
httpx transport that records every attempt (`Recorder`) is the witness of what
the SDK sent. Waits on other processes are bounded polls, never timed
assertions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
import openai
import pytest

import client_sdk
from proxy.testing.procs import Proc, wait_for
from tests.conftest import free_port

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
POLICY = """
[slow_start]
window_s = 0
[gpu]
enabled = false
[warmup]
health_interval_s = 0.1
[readiness]
retry_after_ms = 400
[classes.realtime]
priority = 0
[classes.interactive]
priority = 1
[classes.batch]
priority = 2
on_unmeetable = "try"
"""


def chat(max_tokens: int, *, stream: bool = False) -> dict:
    return {
        "model": "sim-llm",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0


@contextlib.contextmanager
def sidecar(upstream: str, tmp_path, *, ready: bool = True) -> Iterator[Proc]:
    policy = tmp_path / f"policy-{time.monotonic_ns()}.toml"
    policy.write_text(POLICY)
    argv = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "--policy",
        str(policy),
        "--log-level",
        "warning",
    ]
    with Proc(argv, name="sidecar") as proc:
        if ready:
            wait_for(lambda: _status(proc.url("admin") + "/readyz") == 200, timeout_s=20)
        yield proc


@pytest.fixture(scope="module")
def pod() -> Iterator[Proc]:
    with Proc(["sim-pod", "--listen", "127.0.0.1:0", "--profile", "llm", "--speed", "20"], name="sim-pod") as p:
        yield p


@pytest.fixture(scope="module")
def proxy(pod, tmp_path_factory) -> Iterator[Proc]:
    with sidecar(pod.url(), tmp_path_factory.mktemp("sdk-e2e")) as proc:
        yield proc


@pytest.fixture
def stats(pod, proxy):
    """Reset the pod's counters; returns a function reading them."""
    httpx.post(pod.url() + "/sim/reset-stats", timeout=5).raise_for_status()
    return lambda: httpx.get(pod.url() + "/sim/stats", timeout=5).json()


class Recorder(httpx.BaseTransport):
    """Inner transport that records each attempt: when, its headers, the answer's status and headers."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.attempts: list[dict] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        seen = {"at": time.monotonic(), "headers": dict(request.headers), "status": None, "answer": {}}
        self.attempts.append(seen)
        response = self.inner.handle_request(request)
        seen["status"], seen["answer"] = response.status_code, dict(response.headers)
        return response

    def close(self) -> None:
        self.inner.close()


# --- the OpenAI SDK over the transport -------------------------------------------------------


def openai_client(proxy: Proc, transport: client_sdk.ResilientTransport) -> openai.OpenAI:
    # max_retries=0: the SDK's transport does the retrying (two layers would multiply load).
    return openai.OpenAI(
        base_url=proxy.url() + "/v1", api_key="x", max_retries=0, http_client=httpx.Client(transport=transport)
    )


def test_openai_sdk_non_streaming_through_the_transport(proxy, stats) -> None:
    transport = client_sdk.ResilientTransport()
    oai = openai_client(proxy, transport)
    raw = oai.chat.completions.with_raw_response.create(
        model="sim-llm", messages=[{"role": "user", "content": "hello"}], max_tokens=12
    )
    completion = raw.parse()
    assert completion.usage.completion_tokens == 12 and completion.choices[0].message.content
    assert "x-rampmeter-queue-ms" in raw.headers  # it went through the sidecar
    summary = raw.http_response.extensions["rampmeter"]
    assert (summary.attempts, summary.outcome, summary.stop) == (1, "200", None)
    key = raw.http_request.headers["idempotency-key"]  # the transport keyed the POST
    assert stats()["executions_by_idempotency_key"] == {key: 1}
    # The hint is learned for this kind of request only: the SDK's kind and the sidecar's key
    # (route#cost bucket: 2 prompt tokens + 12 output tokens = 14, bucket 4) agree.
    assert raw.headers["x-rampmeter-timeout-hint-key"] == "/v1/chat/completions#4"
    assert list(transport.statistics().hosts[summary.host].timeout_hints) == ["POST /v1/chat/completions#4"]
    oai.close()


def test_openai_sdk_streaming_through_the_transport(proxy, stats) -> None:
    transport = client_sdk.ResilientTransport()
    oai = openai_client(proxy, transport)
    stream = oai.chat.completions.create(
        model="sim-llm", messages=[{"role": "user", "content": "hello"}], max_tokens=9, stream=True
    )
    deltas = [chunk.choices[0].delta.content for chunk in stream if chunk.choices and chunk.choices[0].delta.content]
    assert len(deltas) == 9
    assert stream.response.extensions["rampmeter"].attempts == 1
    assert stats()["requests_completed"] == 1
    s = transport.statistics()
    assert (s.calls, s.attempts, s.retries) == (1, 1, 0)
    oai.close()


# --- AsyncClient under asyncio and under trio ------------------------------------------------


async def exercise(client: client_sdk.AsyncClient) -> None:
    """The same calls under either event loop (this coroutine uses neither asyncio nor trio)."""
    response = await client.post(CHAT, json=chat(8), deadline_s=10.0, priority="interactive")
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 8
    assert int(response.headers["x-rampmeter-queue-ms"]) >= 0
    assert response.extensions["rampmeter"].attempts == 1
    models = await client.get("/v1/models", deadline_s=5.0)
    assert models.json()["data"][0]["id"] == "sim-llm"
    async with client.stream("POST", CHAT, json=chat(5, stream=True), deadline_s=10.0) as streamed:
        events = [line async for line in streamed.aiter_lines() if line.startswith("data: ")]
    assert len(events) == 5 + 1 and events[-1] == "data: [DONE]"
    s = client.statistics()
    assert (s.calls, s.attempts, s.retries) == (3, 3, 0)
    assert next(iter(s.hosts.values())).timeout_hints  # learned from the sidecar, per kind


def test_async_client_under_asyncio(proxy, stats) -> None:
    async def main() -> None:
        async with client_sdk.AsyncClient(proxy.url()) as client:
            await exercise(client)
        oai = openai.AsyncOpenAI(
            base_url=proxy.url() + "/v1",
            api_key="x",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=client_sdk.AsyncResilientTransport()),
        )
        completion = await oai.chat.completions.create(
            model="sim-llm", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert completion.usage.completion_tokens == 4
        await oai.close()

    asyncio.run(main())
    assert stats()["requests_completed"] == 3  # two POSTs and one AsyncOpenAI call: GETs do not reach the engine


async def test_async_client_under_trio(proxy, stats) -> None:
    async with client_sdk.AsyncClient(proxy.url()) as client:
        await exercise(client)
    assert stats()["requests_completed"] == 2


# --- retrying a sidecar rejection until the pod is up ----------------------------------------


def test_a_503_with_retry_after_is_retried_with_the_same_key_until_the_pod_is_up(tmp_path) -> None:
    port = free_port()  # the pod is not running yet: the sidecar answers 503 not_ready
    recorder = Recorder()
    config = client_sdk.RetryConfig(max_attempts=40)
    with (
        sidecar(f"http://127.0.0.1:{port}", tmp_path, ready=False) as proxy,
        client_sdk.Client(proxy.url(), config=config, transport=recorder) as client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        call = pool.submit(client.post, CHAT, json=chat(6), deadline_s=30.0)
        wait_for(lambda: any(a["status"] == 503 for a in recorder.attempts), timeout_s=10)
        with Proc(
            ["sim-pod", "--listen", f"127.0.0.1:{port}", "--profile", "llm", "--speed", "20"], name="sim-pod"
        ) as pod:
            response = call.result(timeout=30)
            executed = httpx.get(pod.url() + "/sim/stats", timeout=5).json()["executions_by_idempotency_key"]
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 6
    first, last = recorder.attempts[0], recorder.attempts[-1]
    assert first["status"] == 503 and first["answer"]["x-rampmeter-reason"] == "not_ready"
    assert first["answer"]["retry-after"] == "1" and first["answer"]["x-rampmeter-retry-after-ms"] == "400"
    assert last["status"] == 200
    keys = {a["headers"]["idempotency-key"] for a in recorder.attempts}
    assert len(keys) == 1 and executed == {keys.pop(): 1}  # one key on every attempt, run once
    assert response.extensions["rampmeter"].attempts == len(recorder.attempts) >= 2
    # Each retry waited at least what the sidecar asked for (the SDK's floor; jitter comes on top).
    gaps = [b["at"] - a["at"] for a, b in zip(recorder.attempts, recorder.attempts[1:], strict=False)]
    assert min(gaps) >= 0.4


# --- deadlines --------------------------------------------------------------------------------


class _StandIn(BaseHTTPRequestHandler):
    """A pod stand-in that records each inference request's headers; the first answer is 503."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[dict]] = []

    def do_GET(self) -> None:  # /health
        self._answer(200, {}, {"status": "ok"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.seen.append({k.lower(): v for k, v in self.headers.items()})
        if len(self.seen) == 1:
            self._answer(503, {"retry-after": "0"}, {"error": {"message": "busy"}})
        else:
            self._answer(200, {}, {"choices": [{"message": {"content": "ok"}}], "usage": {"completion_tokens": 1}})

    def _answer(self, status: int, headers: dict, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        for k, v in {**headers, "content-type": "application/json", "content-length": str(len(body))}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stand_in() -> Iterator[tuple[str, list[dict]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    server.daemon_threads = True
    _StandIn.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _StandIn.seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_the_deadline_reaches_the_pod_as_x_request_timeout_ms_restamped_per_attempt(stand_in, tmp_path) -> None:
    upstream, seen = stand_in
    with sidecar(upstream, tmp_path) as proxy, client_sdk.Client(proxy.url()) as client:
        response = client.post(CHAT, json=chat(1), deadline_s=5.0)
    assert response.status_code == 200 and response.extensions["rampmeter"].attempts == 2
    budgets = [int(h["x-request-timeout-ms"]) for h in seen]
    # The pod saw the caller's remaining budget on each attempt, smaller on the retry.
    assert len(budgets) == 2 and 5000 >= budgets[0] > budgets[1] > 0
    assert seen[0]["idempotency-key"] == seen[1]["idempotency-key"]
    assert all("1.1 rampmeter" in h["via"] for h in seen)  # through the sidecar, not around it


def test_a_deadline_the_pod_cannot_meet_ends_the_call_and_the_pod_stops_the_work(proxy, stats) -> None:
    # batch, set to on_unmeetable = "try" above: the sidecar forwards even what it expects to miss, so the
    # deadline is enforced at the sidecar on a running exchange: 4000 tokens take ~1.2 s here.
    with client_sdk.Client(proxy.url()) as client, pytest.raises(client_sdk.DeadlineExceeded) as caught:
        client.post(CHAT, json=chat(4000), deadline_s=0.3, priority="batch")
    assert caught.value.attempts >= 1
    wait_for(lambda: stats()["requests_cancelled"] == 1, timeout_s=10)
    assert stats()["requests_completed"] == 0
