"""Deadlines, shedding and quotas end to end: sim-pod <- rampmeter serve <- httpx, real processes.

The pod (llm profile at --speed 0.25: a lone decode step takes 24.6 ms, so 100 output
tokens take ~2.5 s) is shared by the module and its counters reset per test
(POST /sim/reset-stats); each test starts its own sidecar from a small policy
file, because what a sidecar has learnt (service times, latency windows) would
change the next test's estimates. `/sim/stats` is the honest witness of what
reached the engine and what work was stopped.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

import httpx
import pytest
import trio

from proxy.testing.procs import Proc, wait_for

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
SPEED = 0.25
# Every sidecar here: a fixed concurrency limit, no slow start, no GPU sampling; tests add their keys.
BASE_POLICY = """
[limits]
kind = "fixed"
initial_limit = {limit}
min_limit = 1
[slow_start]
window_s = 0
[gpu]
enabled = false
"""


def chat(max_tokens: int, *, stream: bool = False) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


@pytest.fixture(scope="module")
def pod() -> Iterator[Proc]:
    with Proc(
        ["sim-pod", "--listen", "127.0.0.1:0", "--profile", "llm", "--speed", str(SPEED)], name="sim-pod"
    ) as proc:
        yield proc


@pytest.fixture
def fresh_pod(pod: Proc) -> Proc:
    httpx.post(pod.url() + "/sim/reset-stats", timeout=5).raise_for_status()
    return pod


@pytest.fixture
def sidecar(fresh_pod: Proc, tmp_path):
    """`sidecar(limit=1, extra_toml)`: a sidecar in front of the pod, ready (/readyz 200)."""
    with contextlib.ExitStack() as stack:

        def start(limit: int = 4, extra: str = "") -> Proc:
            path = tmp_path / f"policy-{time.monotonic_ns()}.toml"
            path.write_text(BASE_POLICY.format(limit=limit) + extra)
            argv = [
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--upstream",
                fresh_pod.url(),
                "--policy",
                str(path),
            ]
            proc = stack.enter_context(Proc(argv, name="sidecar"))
            wait_for(lambda: _get(proc.url("admin") + "/readyz").status_code == 200, timeout_s=20)
            return proc

        yield start


def _get(url: str) -> httpx.Response:
    try:
        return httpx.get(url, timeout=5)
    except httpx.HTTPError:
        return httpx.Response(599)


async def pod_stats(pod: Proc) -> dict:
    async with httpx.AsyncClient(timeout=5) as client:
        return (await client.get(pod.url() + "/sim/stats")).json()


async def admission(proxy: Proc) -> dict:
    async with httpx.AsyncClient(timeout=5) as client:
        return (await client.get(proxy.url("admin") + "/admin/stats")).json()["admission"]


async def until(predicate, timeout_s: float = 10.0) -> None:
    """Poll an async predicate (a bounded wait on another process, not a timed assertion)."""
    with trio.fail_after(timeout_s):
        while not await predicate():
            await trio.sleep(0.02)


def reason(resp: httpx.Response) -> tuple[int, str | None]:
    return resp.status_code, resp.headers.get("x-rampmeter-reason")


async def test_deadline_shorter_than_service_is_refused_before_the_deadline_and_the_pod_does_nothing(
    sidecar, fresh_pod
):
    proxy = sidecar()
    async with httpx.AsyncClient(base_url=proxy.url(), timeout=20) as client:
        started = time.monotonic()
        resp = await client.post(CHAT, json=chat(200), headers={"x-request-timeout-ms": "1000"})
        elapsed = time.monotonic() - started
    assert reason(resp) == (503, "deadline_unmeetable")
    assert elapsed < 1.0  # the answer comes before the client's own deadline, not at or after it
    assert "retry-after" not in resp.headers  # only a larger budget helps
    assert resp.json()["error"] == {
        "type": "rampmeter_rejected",
        "code": "deadline_unmeetable",
        "retry_after_ms": None,
        "message": "the request's timeout is shorter than its expected service time; raise it",
        "request_id": resp.headers["x-request-id"],  # every rejection body names its request
    }
    stats = await pod_stats(fresh_pod)
    assert (stats["requests_submitted"], stats["busy_s"]) == (0, 0.0)


async def test_queued_request_whose_deadline_passes_gets_504_and_is_never_forwarded(sidecar, fresh_pod):
    proxy = sidecar(limit=1)
    answers: dict[str, httpx.Response] = {}
    async with httpx.AsyncClient(base_url=proxy.url(), timeout=20) as client:

        async def post(name: str, body: dict, headers: dict) -> None:
            answers[name] = await client.post(CHAT, json=body, headers=headers)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, "long", chat(100), {})
            await until(lambda: _running(fresh_pod, 1))
            nursery.start_soon(post, "queued", chat(1), {"x-request-timeout-ms": "1000"})
    assert answers["long"].status_code == 200
    assert reason(answers["queued"]) == (504, "deadline_expired")
    assert answers["queued"].json()["error"]["code"] == "deadline_expired"
    stats = await pod_stats(fresh_pod)
    assert stats["requests_submitted"] == 1  # only the long one reached the engine
    assert (await admission(proxy))["counts"]["expired"] == 1


async def _running(pod: Proc, n: int) -> bool:
    return (await pod_stats(pod))["running"] == n


async def test_upstream_call_past_the_deadline_is_cancelled_and_the_pod_counts_the_work_stopped(sidecar, fresh_pod):
    proxy = sidecar()
    async with httpx.AsyncClient(base_url=proxy.url(), timeout=20) as client:
        # The model's prior says ~1 s for 100 tokens, so it is forwarded; the pod needs ~2.5 s.
        resp = await client.post(CHAT, json=chat(100), headers={"x-request-timeout-ms": "1500"})
    assert reason(resp) == (504, "deadline_expired")
    await until(lambda: _running(fresh_pod, 0))
    stats = await pod_stats(fresh_pod)
    assert (stats["requests_submitted"], stats["requests_cancelled_running"], stats["requests_completed"]) == (1, 1, 0)
    # The work done before the cut counts as wasted (as client_gone or past-deadline: the pod's
    # clock and the sidecar's differ by the transit time, so which of the two is not asserted).
    assert stats["wasted_s"] == pytest.approx(stats["busy_s"]) and stats["wasted_s"] > 0
    assert stats["in_progress_s"] == 0
    # stops_on_cancel is "auto" and no engine gauges are read here, so the sidecar cannot tell that
    # this pod stopped: it holds the cut request's slot (a phantom lease) for its expected remaining
    # time, then lets it go.
    adm = await admission(proxy)
    assert adm["counts"]["phantoms"] == 1 and adm["stops_on_cancel"] == ["auto"]

    async def slot_free() -> bool:
        return (await admission(proxy))["inflight_requests"] == 0

    await until(slot_free)
    # Counted as the sidecar's answer (the pool ended the exchange, no scope did), and nothing failed after it.
    async with httpx.AsyncClient(timeout=5) as client:
        metrics = (await client.get(proxy.url("admin") + "/metrics")).text
    assert 'reason="deadline_expired"} 1.0' in metrics
    assert "Traceback" not in proxy.log()


@pytest.mark.parametrize("http2", [False, True])
async def test_every_proxied_response_carries_the_timeout_hint(sidecar, http2):
    proxy = sidecar()
    async with httpx.AsyncClient(base_url=proxy.url(), timeout=20, http1=not http2, http2=http2) as client:
        plain = await client.post(CHAT, json=chat(2))
        async with client.stream("POST", CHAT, json=chat(2, stream=True)) as streamed:
            events = [line async for line in streamed.aiter_lines() if line.startswith("data:")]
        missing = await client.post("/v1/nope", json={})  # the pod's own 404 is proxied too
    assert plain.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    for resp in (plain, streamed, missing):
        assert int(resp.headers["x-rampmeter-timeout-hint-ms"]) >= 100  # latency.timeout_hint_min_ms
        assert int(resp.headers["x-rampmeter-queue-ms"]) >= 0
    assert (plain.status_code, streamed.status_code, missing.status_code) == (200, 200, 404)
    assert events[-1] == "data: [DONE]"


async def test_tenant_over_quota_gets_429_tenant_quota(sidecar, fresh_pod):
    proxy = sidecar(extra="[tenants]\nenabled = true\ntrust_x_tenant = true\nrate_per_s = 0.5\nburst = 2\n")
    async with httpx.AsyncClient(base_url=proxy.url(), timeout=20) as client:
        served = [await client.post(CHAT, json=chat(1), headers={"x-tenant": "a"}) for _ in range(2)]
        over = await client.post(CHAT, json=chat(1), headers={"x-tenant": "a"})
        other = await client.post(CHAT, json=chat(1), headers={"x-tenant": "b"})
    assert [r.status_code for r in served] == [200, 200]
    assert reason(over) == (429, "tenant_quota")
    retry_ms = int(over.headers["x-rampmeter-retry-after-ms"])
    assert 0 < retry_ms <= 2000 * 1.2  # the refill time of one token at 0.5/s, plus at most 20% jitter
    assert over.headers["retry-after"] == str(math.ceil(retry_ms / 1000))
    assert over.json()["error"]["code"] == "tenant_quota" and over.json()["error"]["retry_after_ms"] == retry_ms
    assert other.status_code == 200
    assert (await pod_stats(fresh_pod))["requests_submitted"] == 3


async def test_under_overload_batch_is_shed_before_interactive(sidecar, fresh_pod):
    # Top-class queue cap 4, halved per class rank: realtime 4, interactive 2, batch 1.
    proxy = sidecar(
        limit=1, extra='[shedding]\nrules = ["queue_length"]\nmax_queued_requests = 4\nclass_step_pct = 50\n'
    )
    answers: list[httpx.Response] = []
    timeout = {"x-request-timeout-ms": "20000"}
    async with httpx.AsyncClient(base_url=proxy.url(), timeout=30) as client:

        async def post(klass: str) -> httpx.Response:
            resp = await client.post(CHAT, json=chat(1), headers={"x-priority": klass, **timeout})
            answers.append(resp)
            return resp

        async def queued(n: int) -> bool:
            return (await admission(proxy))["queued"] == n

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: client.post(CHAT, json=chat(60), headers=timeout))  # holds the one slot
            await until(lambda: _running(fresh_pod, 1))
            nursery.start_soon(post, "interactive")
            await until(lambda: queued(1))
            # One waits: batch is shed at once, interactive still queues.
            assert reason(await post("batch")) == (503, "queue_full")
            nursery.start_soon(post, "interactive")
            await until(lambda: queued(2))
            # Two wait: interactive is shed too.
            assert reason(await post("batch")) == (503, "queue_full")
            assert reason(await post("interactive")) == (503, "queue_full")
    shed = [r for r in answers if r.status_code == 503]
    assert len(shed) == 3 and all(int(r.headers["x-rampmeter-retry-after-ms"]) >= 100 for r in shed)
    assert sorted(r.status_code for r in answers) == [200, 200, 503, 503, 503]
    assert (await pod_stats(fresh_pod))["requests_submitted"] == 3  # the holder and the two queued
