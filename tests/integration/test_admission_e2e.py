"""Admission control end to end: sim-pod <- rampmeter serve <- httpx, real processes on 127.0.0.1.

Every sidecar here has one class ("chat"), a small fixed limit, shedding and slow
start off, so what is observed is the admission queue alone. Assertions are on
order of completion and on counters (the pod's /sim/stats, the sidecar's
/admin/stats and /metrics), never on how long something took. The pod runs the
llm profile at speed 1, so a 600-token answer holds its slot ~4 s: long enough
for the test to line up the queue behind it (checked, not assumed).
"""

from __future__ import annotations

import json
from functools import partial

import httpx
import pytest
import trio

from proxy.core import wire
from proxy.testing.procs import Proc, wait_for

pytestmark = pytest.mark.integration

BLOCKER_TOKENS = 600  # ~3.8 s of engine time at speed 1: the queue forms behind it


def policy(order: str = "sjf", limit: int = 2, max_queue_length: int = 1000) -> str:
    return f"""
[warmup]
health_interval_s = 0.2
[slow_start]
window_s = 0.0
[gpu]
enabled = false
[shedding]
rules = []
[scheduling]
order = "{order}"
default_class = "chat"
# The tests line a queue up behind requests sent at once into a fresh sidecar: trust the
# priors instead of sending a route's first request alone until it answers.
unjudged_in_flight = 0
[classes.chat]
max_queue_length = {max_queue_length}
on_unmeetable = "try"
[limits]
kind = "fixed"
initial_limit = {limit}
min_limit = 1
"""


@pytest.fixture(scope="module")
def pod():
    with Proc(["sim-pod", "--listen", "127.0.0.1:0", "--profile", "llm", "--speed", "1"], name="sim-pod") as proc:
        yield proc


@pytest.fixture
def start_sidecar(pod, tmp_path):
    """start_sidecar(policy_text) -> a ready `rampmeter serve` in front of the pod (pod counters reset)."""
    started: list[Proc] = []

    def start(text: str) -> Proc:
        path = tmp_path / f"policy{len(started)}.toml"
        path.write_text(text)
        argv = [
            "serve",
            "--policy",
            str(path),
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--upstream",
            pod.url(),
            "--log-level",
            "warning",
        ]
        proc = Proc(argv, name="sidecar")
        started.append(proc)
        wait_for(lambda: _ready(proc), timeout_s=20)
        httpx.post(pod.url() + "/sim/reset-stats", timeout=5).raise_for_status()
        return proc

    yield start
    for proc in started:
        proc.stop()


def _ready(proc: Proc) -> bool:
    try:
        return httpx.get(proc.url("admin") + "/readyz", timeout=2).is_success
    except httpx.HTTPError:
        return False


def chat(max_tokens: int, text: str = "hello") -> dict:
    return {"model": "sim-llm", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}


async def admission(client: httpx.AsyncClient, proc: Proc) -> dict:
    return (await client.get(proc.url("admin") + "/admin/stats")).json()["admission"]


async def until(probe, timeout_s: float = 20.0):
    """Poll the async `probe()` until it returns something truthy; fail after `timeout_s`."""
    with trio.fail_after(timeout_s):
        while not (value := await probe()):
            await trio.sleep(0.02)
        return value


async def metric(client: httpx.AsyncClient, proc: Proc, line_prefix: str) -> float:
    text = (await client.get(proc.url("admin") + "/metrics")).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_prefix)]
    return sum(values)


@pytest.mark.parametrize("order", ["sjf", "fcfs"])
async def test_queued_short_requests_finish_first_under_sjf_only(start_sidecar, order):
    proxy = start_sidecar(policy(order, limit=2))
    done: list[str] = []
    async with httpx.AsyncClient(timeout=60) as client:

        async def send(name: str, max_tokens: int) -> None:
            resp = await client.post(proxy.url() + "/v1/chat/completions", json=chat(max_tokens, name))
            assert resp.status_code == 200, resp.text
            done.append(name)

        async with trio.open_nursery() as nursery:
            for name in ("blocker1", "blocker2"):
                nursery.start_soon(send, name, BLOCKER_TOKENS)
            await until(lambda: _stat(client, proxy, lambda a: a["inflight_requests"] == 2))
            for name in ("long1", "long2"):  # queued first ...
                nursery.start_soon(send, name, 60)
            await until(lambda: _stat(client, proxy, lambda a: a["queued"] == 2))
            for name in ("short1", "short2", "short3"):  # ... then the short ones
                nursery.start_soon(send, name, 2)
            await until(lambda: _stat(client, proxy, lambda a: a["queued"] == 5))
            # The queue really was lined up behind the blockers (they still hold both slots).
            assert (await admission(client, proxy))["inflight_requests"] == 2
    queued = [n for n in done if not n.startswith("blocker")]
    shorts = [queued.index(n) for n in ("short1", "short2", "short3")]
    longs = [queued.index(n) for n in ("long1", "long2")]
    if order == "sjf":
        assert max(shorts) < min(longs), done
    else:
        assert max(longs) < min(shorts), done


async def _stat(client, proxy, predicate) -> bool:
    return predicate(await admission(client, proxy))


async def test_concurrency_at_the_upstream_never_exceeds_the_limit(pod, start_sidecar):
    proxy = start_sidecar(policy("sjf", limit=3))
    seen_pod, seen_sidecar = [], []
    async with httpx.AsyncClient(timeout=60) as client:

        async def sample(cancel_scope) -> None:
            with cancel_scope:
                while True:
                    s = (await client.get(pod.url() + "/sim/stats")).json()
                    seen_pod.append(s["running"] + s["waiting"])
                    seen_sidecar.append((await admission(client, proxy))["inflight_requests"])
                    await trio.sleep(0.01)

        async def send(i: int) -> None:
            resp = await client.post(proxy.url() + "/v1/chat/completions", json=chat(40 + i, f"r{i}"))
            assert resp.status_code == 200

        scope = trio.CancelScope()
        async with trio.open_nursery() as outer:
            outer.start_soon(sample, scope)
            async with trio.open_nursery() as nursery:
                for i in range(12):
                    nursery.start_soon(send, i)
            scope.cancel()
        stats = (await client.get(pod.url() + "/sim/stats")).json()
    assert stats["requests_completed"] == 12
    # Without the sidecar all 12 would run at once (the pod takes 64); with it, at most 3, and 3 were reached.
    assert max(seen_pod) == 3, seen_pod
    assert max(seen_sidecar) == 3, seen_sidecar


async def test_full_class_queue_answers_503_class_queue_full_per_the_wire_contract(start_sidecar):
    proxy = start_sidecar(policy("sjf", limit=1, max_queue_length=2))
    async with httpx.AsyncClient(timeout=60) as client:
        url = proxy.url() + "/v1/chat/completions"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(client.post, url, json=chat(BLOCKER_TOKENS)))
            await until(lambda: _stat(client, proxy, lambda a: a["inflight_requests"] == 1))
            for i in range(2):
                nursery.start_soon(partial(client.post, url, json=chat(2, f"q{i}")))
            await until(lambda: _stat(client, proxy, lambda a: a["queued"] == 2))
            resp = await client.post(url, json=chat(2, "one too many"))
            rejected = await metric(client, proxy, 'rampmeter_rejections_total{class="chat",reason="class_queue_full"}')
            nursery.cancel_scope.cancel()  # the others need not finish
    assert resp.status_code == 503
    assert resp.headers[wire.REASON] == "class_queue_full"
    assert resp.headers["content-type"].startswith("application/json")
    retry_ms = int(resp.headers[wire.RETRY_AFTER_MS])
    assert int(resp.headers[wire.RETRY_AFTER]) * 1000 >= retry_ms > 0  # whole seconds, rounded up
    error = resp.json()["error"]
    assert error["type"] == wire.ERROR_TYPE and error["code"] == "class_queue_full"
    assert error["retry_after_ms"] == retry_ms and error["message"]
    assert rejected == 1


async def test_unknown_priority_falls_back_to_the_default_class_and_is_counted(start_sidecar):
    proxy = start_sidecar(policy("sjf", limit=2))
    async with httpx.AsyncClient(timeout=30) as client:
        resp = await client.post(
            proxy.url() + "/v1/chat/completions", json=chat(2), headers={wire.PRIORITY: "platinum"}
        )
        known = await client.post(proxy.url() + "/v1/chat/completions", json=chat(2), headers={wire.PRIORITY: "chat"})
        unknown = await metric(client, proxy, "rampmeter_unknown_priority_total")
        admitted = await metric(client, proxy, 'rampmeter_admitted_total{class="chat"}')
    assert resp.status_code == 200 and known.status_code == 200
    assert json.loads(resp.content)["usage"]["completion_tokens"] == 2
    assert unknown == 1  # only "platinum"; "chat" names a class
    assert admitted == 2  # both served, as the default class


async def test_a_client_gone_while_queued_is_never_forwarded(pod, start_sidecar):
    proxy = start_sidecar(policy("sjf", limit=1))
    async with httpx.AsyncClient(timeout=60) as client:
        url = proxy.url() + "/v1/chat/completions"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(client.post, url, json=chat(300, "blocker")))
            await until(lambda: _stat(client, proxy, lambda a: a["inflight_requests"] == 1))
            queued = trio.CancelScope()

            async def impatient() -> None:
                with queued:
                    async with httpx.AsyncClient(timeout=60) as own:  # its own connection, closed on cancel
                        await own.post(url, json=chat(2, "gone"))

            nursery.start_soon(impatient)
            await until(lambda: _stat(client, proxy, lambda a: a["queued"] == 1))
            queued.cancel()
            await until(lambda: _stat(client, proxy, lambda a: a["counts"]["abandoned"] == 1))
        # The blocker has finished; nothing is queued or in flight any more.
        final = await until(lambda: _final(client, proxy))
        stats = (await client.get(pod.url() + "/sim/stats")).json()
        abandoned = await metric(client, proxy, 'rampmeter_queue_abandoned_total{class="chat"}')
    assert final["counts"]["admitted"] == 1
    assert stats["requests_submitted"] == 1 and stats["requests_executed"] == 1
    assert abandoned == 1


async def _final(client, proxy) -> dict | None:
    a = await admission(client, proxy)
    return a if a["queued"] == 0 and a["inflight_requests"] == 0 else None
