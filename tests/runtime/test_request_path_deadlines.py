"""Deadlines on the request path, in virtual time: expiry, cancellation, shedding, quotas.

The real `App` and `RequestPath` in front of the simulated pod (`Pod` + `PodAPI`),
both in this trio run: the upstream pool is replaced by `PodPool`, which serves each
upstream exchange from the pod's handler in-process, so cancelling the exchange
cancels the pod's sequence exactly as a closed connection would. Under the autojump
clock every time below is exact: the llm profile at SPEED 0.25 makes a lone decode
step 24.6 ms, and `oracle()` gives each request's true service time.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
import pytest
import trio
import trio.testing

from proxy.app import App
from proxy.core.arrival import service_key
from proxy.errors import UpstreamProtocolError
from proxy.http.messages import Headers, Request, header_value
from proxy.policy.load import policy_from_builtins
from proxy.policy.schema import Policy
from proxy.runtime.reload import PolicyVersion
from proxy.simpod import get_profile, oracle
from proxy.simpod.api import PodAPI
from proxy.simpod.driver import Pod

SPEED = 0.25
PROFILE = get_profile("llm", speed=SPEED)
CHAT = "/v1/chat/completions"
VERSION = PolicyVersion("test", 1, "", 0.0)


def chat(max_tokens: int, *, stream: bool = False) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": max_tokens}
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


def service_s(body: bytes) -> float:
    """The pod's true time for `body` alone (one sequence running)."""
    return oracle(CHAT, body, PROFILE).service_s


def policy(*, limit: int = 4, rules: tuple[str, ...] = (), **sections: dict) -> Policy:
    """Defaults, one in-process upstream, a fixed limit, no slow start, no GPU, `rules` shedding."""
    data = msgspec.to_builtins(Policy())
    # The llm profile stops work on a disconnect, as vLLM does: no phantom leases for cut requests
    # (the default "auto" would assume the worst, with no engine gauges to learn from).
    data["upstreams"] = [{"url": "http://pod.inproc:80", "stops_on_cancel": True}]
    data["limits"].update(kind="fixed", initial_limit=limit, min_limit=1, max_limit=max(limit, 256))
    data["slow_start"]["window_s"] = 0.0
    data["gpu"]["enabled"] = False
    data["shedding"]["rules"] = list(rules)
    for name, values in sections.items():
        data[name].update(values)
    return policy_from_builtins(data, "test")


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self.content_length = len(data)

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._data:
            yield self._data

    async def read_all(self) -> bytes:
        return self._data


class Pipe:
    """One exchange with an in-process handler: its ResponseSink and the reader's response.

    The handler runs in its own task and cancel scope, as the server runs it;
    `aclose()` before the end is a client that went away (client_gone, scope cancelled).
    """

    http_version = "1.1"

    all_received = False  # the relay's whole-answer shortcut: never taken for these (they arrive late)

    def __init__(self, request: Request, write_delay_s: float = 0.0) -> None:
        self.request = request
        self.write_delay_s = write_delay_s  # a slow reader: the head takes this long to write
        self.scope = trio.CancelScope()
        self.status = 0
        self.headers: Headers = []
        self.headers_sent = False
        self.aborted = False  # the handler failed after its head went out: the stream is cut
        self.answered_at: float | None = None
        self._ended = False
        self._body = b""
        self._head = trio.Event()
        self._send, self._recv = trio.open_memory_channel[bytes](math.inf)

    # --- ResponseSink (the handler's side) ---
    async def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        await self.start(status, headers)
        await self.send(body)
        await self.end()

    async def start(self, status: int, headers: Headers) -> None:
        self.headers_sent = True  # committed: a real sink cannot take back a head it began to write
        if self.write_delay_s:
            await trio.sleep(self.write_delay_s)
        self.status, self.headers = status, list(headers)
        self.answered_at = trio.current_time()
        self._head.set()

    async def send(self, data: bytes) -> None:
        if data:
            self._send.send_nowait(bytes(data))

    async def end(self) -> None:
        self._ended = True
        self._send.close()

    # --- the reader's side (UpstreamResponse for the relay; the client in tests) ---
    async def head(self) -> None:
        await self._head.wait()

    async def receive(self) -> bytes:
        try:
            return await self._recv.receive()
        except trio.EndOfChannel:
            if self.aborted:
                raise UpstreamProtocolError("stream cut", request_sent=True) from None
            return b""

    async def read_all(self) -> bytes:
        return b"".join([chunk async for chunk in self._recv])

    async def aclose(self) -> None:
        if not self._ended:  # the reader went away before the end
            self.request.client_gone = True
            self.scope.cancel()

    def header(self, name: str) -> str | None:
        value = header_value(self.headers, name.encode())
        return None if value is None else value.decode()

    def error(self) -> dict:
        return json.loads(self._body)["error"]

    async def answer(self) -> tuple[int, bytes]:
        await self.head()
        self._body = await self.read_all()
        return self.status, self._body

    async def _serve(self, handler) -> None:
        with self.scope:
            try:
                await handler(self.request, self)
            except Exception:
                self.aborted = self._ended = True
                self._head.set()
                self._send.close()


def start(nursery: trio.Nursery, handler, path: str, body: bytes, headers: Headers, write_delay_s: float = 0.0) -> Pipe:
    request = Request(b"POST", path.encode(), headers, _Body(body), received_at=trio.current_time())
    pipe = Pipe(request, write_delay_s)
    nursery.start_soon(pipe._serve, handler)
    return pipe


class PodPool:
    """The upstream pool's interface, served by the pod's handler in this trio run."""

    def __init__(self, handler, nursery: trio.Nursery) -> None:
        self.handler, self.nursery = handler, nursery
        self.forwarded: list[Headers] = []  # request headers, as the pod received them

    def authority(self, upstream: int) -> bytes:
        return b"pod.inproc"

    @contextlib.asynccontextmanager
    async def request(self, upstream: int, method: bytes, target: bytes, headers: Headers, body: bytes):
        self.forwarded.append(list(headers))
        pipe = start(self.nursery, self.handler, target.decode(), body, headers)
        try:
            await pipe.head()
            yield pipe
        finally:
            await pipe.aclose()


class _Ready:
    """Upstream lifecycles that say ready (warm-up is tested elsewhere) and record results."""

    ready = True
    warmers = ()  # App seeds the service model from these

    def __init__(self) -> None:
        self.results: list[bool] = []

    def report_result(self, index: int, ok: bool, now: float | None = None) -> None:
        self.results.append(ok)


@dataclass
class Stack:
    app: App
    pod: Pod
    pool: PodPool
    nursery: trio.Nursery

    def call(self, body: bytes, *headers: tuple[str, str], path: str = CHAT, write_delay_s: float = 0.0) -> Pipe:
        hdrs = [(b"content-type", b"application/json"), *((k.encode(), v.encode()) for k, v in headers)]
        return start(self.nursery, self.app.request_path, path, body, hdrs, write_delay_s)

    def pod_stats(self):
        return self.pod.engine.statistics()

    def admission(self) -> dict:
        return self.app.scheduler.statistics()

    def expected_ms(self, body: bytes, klass: str = "interactive") -> float:
        sched = self.app.scheduler
        return sched.ticket(klass, sched.estimate(CHAT, body)).expected_ms


@contextlib.asynccontextmanager
async def stack(pol: Policy) -> AsyncIterator[Stack]:
    async with trio.open_nursery() as nursery:
        pod = Pod(PROFILE)
        await nursery.start(pod.run)
        pool = PodPool(PodAPI(pod), nursery)
        app = App(pol, VERSION, rng=random.Random(0), pool=pool, lifecycles=_Ready())
        app.nursery = app.request_path.nursery = nursery
        yield Stack(app, pod, pool, nursery)
        nursery.cancel_scope.cancel()


# --- at arrival --------------------------------------------------------------


async def test_budget_below_the_service_estimate_is_refused_at_once_and_never_reaches_the_pod(autojump_clock):
    body = chat(100)
    async with stack(policy()) as s:
        assert s.expected_ms(body) > 500  # the model's prior for 100 output tokens: ~1 s
        t0 = trio.current_time()
        pipe = s.call(body, ("x-request-timeout-ms", "500"))
        status, _ = await pipe.answer()
        assert (status, pipe.header("x-rampmeter-reason")) == (503, "deadline_unmeetable")
        assert pipe.answered_at == t0  # decided at arrival, not after any wait
        assert pipe.header("retry-after") is None  # only a larger budget helps: no Retry-After
        err = pipe.error()
        assert (err["type"], err["code"], err["retry_after_ms"]) == ("rampmeter_rejected", "deadline_unmeetable", None)
        assert s.pod_stats().requests_submitted == 0


async def test_a_refusal_reaches_the_client_even_when_the_deadline_passes_while_it_is_written(autojump_clock):
    """A 1 ms budget, a client that reads slowly: the 503 must still arrive whole, not a cut connection."""
    async with stack(policy()) as s:
        pipe = s.call(chat(100), ("x-request-timeout-ms", "5"), write_delay_s=0.01)
        status, body = await pipe.answer()
        assert not pipe.aborted
        assert (status, pipe.header("x-rampmeter-reason")) == (503, "deadline_unmeetable")
        assert json.loads(body)["error"]["code"] == "deadline_unmeetable"


async def test_unmeetable_behind_a_queue_gets_a_retry_after(autojump_clock):
    long, short = chat(100), chat(4)
    async with stack(policy(limit=1)) as s:
        first = s.call(long)
        await trio.testing.wait_all_tasks_blocked()
        # The short one alone fits its budget, but not behind the long one in flight.
        assert s.expected_ms(short) < 400 < s.expected_ms(short) + s.expected_ms(long) / 2
        pipe = s.call(short, ("x-request-timeout-ms", "400"))
        status, _ = await pipe.answer()
        assert (status, pipe.header("x-rampmeter-reason")) == (503, "deadline_unmeetable")
        assert int(pipe.header("x-rampmeter-retry-after-ms")) >= 100  # [shedding] retry_after_min_ms
        assert int(pipe.header("retry-after")) >= 1
        assert (await first.answer())[0] == 200
        assert s.pod_stats().requests_submitted == 1


# --- while queued --------------------------------------------------------------


async def test_queued_request_expires_when_its_budget_no_longer_covers_service_and_is_never_forwarded(autojump_clock):
    long, short = chat(100), chat(1)
    async with stack(policy(limit=1)) as s:
        first = s.call(long)  # holds the only slot for 2.46 s
        await trio.testing.wait_all_tasks_blocked()
        t0 = trio.current_time()
        expected_s = s.expected_ms(short) / 1000
        queued = s.call(short, ("x-request-timeout-ms", "1000"))
        await trio.testing.wait_all_tasks_blocked()
        assert s.admission()["queued"] == 1
        status, _ = await queued.answer()
        assert (status, queued.header("x-rampmeter-reason")) == (504, "deadline_expired")
        # Dropped as soon as the remaining budget fell below the expected service time.
        assert queued.answered_at - t0 == pytest.approx(1.0 - expected_s)
        assert queued.error()["code"] == "deadline_expired"
        assert (await first.answer())[0] == 200
        assert s.pod_stats().requests_submitted == 1  # the expired one never reached the pod
        assert s.admission()["counts"]["expired"] == 1


@pytest.mark.parametrize(("klass", "forwarded"), [("interactive", False), ("batch", True)])
async def test_at_dequeue_a_budget_below_the_p99_service_time_is_not_forwarded(autojump_clock, klass, forwarded):
    """The queue expires on the mean expected time; before forwarding, the observed p99 decides
    (docs/shedding.md), except for on_unmeetable = "try" classes (batch here), which go while time is left."""
    long, short = chat(100), chat(1)  # the long one really takes 2.46 s; the model expects ~1 s
    async with stack(policy(limit=1, classes={"batch": {"priority": 2, "on_unmeetable": "try"}})) as s:
        first = s.call(long)
        await trio.testing.wait_all_tasks_blocked()
        queued = s.call(short, ("x-priority", klass), ("x-request-timeout-ms", "3000"))
        await trio.testing.wait_all_tasks_blocked()
        assert s.admission()["queued"] == 1  # admitted to the queue: ~0.5 s wait + 30 ms fit in 3 s
        # Meanwhile the sidecar has seen this kind of request take 1.5 s (p99 over >= 20 samples).
        ticket = s.app.scheduler.ticket(klass, s.app.scheduler.estimate(CHAT, short))
        for _ in range(20):
            s.app.observatory.service.record(service_key(ticket), 1500.0, trio.current_time())
        assert (await first.answer())[0] == 200  # at 2.46 s: 0.54 s left, the queue's own expiry not yet due
        status, _ = await queued.answer()
        if forwarded:
            assert status == 200
        else:
            assert (status, queued.header("x-rampmeter-reason")) == (504, "deadline_expired")
            assert queued.answered_at == pytest.approx(service_s(long))
        assert s.pod_stats().requests_submitted == (2 if forwarded else 1)
        assert s.admission()["inflight_requests"] == 0


async def test_client_leaving_while_queued_leaves_the_queue_and_is_never_forwarded(autojump_clock):
    long, short = chat(40), chat(1)
    async with stack(policy(limit=1)) as s:
        first = s.call(long)
        await trio.testing.wait_all_tasks_blocked()
        queued = s.call(short)
        await trio.sleep(0.3)
        assert s.admission()["queued"] == 1
        await queued.aclose()  # the client disconnects
        await trio.testing.wait_all_tasks_blocked()
        assert s.admission()["queued"] == 0
        assert (await first.answer())[0] == 200
        await trio.sleep(5)
        stats = s.admission()
        assert stats["counts"]["abandoned"] == 1 and stats["inflight_requests"] == 0
        assert s.pod_stats().requests_submitted == 1


# --- upstream -------------------------------------------------------------------


async def test_upstream_call_past_the_deadline_is_cancelled_and_the_pod_stops_the_work(autojump_clock):
    body = chat(100)  # the prior estimates ~1 s; the pod really takes 2.46 s
    async with stack(policy()) as s:
        assert s.expected_ms(body) < 1500 < service_s(body) * 1000
        t0 = trio.current_time()
        pipe = s.call(body, ("x-request-timeout-ms", "1500"))
        status, _ = await pipe.answer()
        assert (status, pipe.header("x-rampmeter-reason")) == (504, "deadline_expired")
        assert pipe.answered_at - t0 == pytest.approx(1.5)
        await trio.testing.wait_all_tasks_blocked()
        pod = s.pod_stats()
        assert (pod.requests_submitted, pod.requests_cancelled_running, pod.running) == (1, 1, 0)
        assert pod.requests_completed == 0
        # The pod knew the deadline (x-request-timeout-ms): the stopped work counts as past it.
        assert pod.wasted_deadline_s == pytest.approx(pod.busy_s) and pod.busy_s > 0
        stats = s.admission()
        assert stats["inflight_requests"] == 0 and stats["counts"]["released"] == 1


async def test_stream_past_the_deadline_is_cut_and_the_pod_stops_the_work(autojump_clock):
    body = chat(100, stream=True)
    async with stack(policy()) as s:
        pipe = s.call(body, ("x-request-timeout-ms", "1500"))
        await pipe.head()
        assert pipe.status == 200  # the head went out before the deadline: only a cut is left
        with pytest.raises(UpstreamProtocolError, match="stream cut"):
            while await pipe.receive():
                pass
        assert pipe.aborted
        await trio.testing.wait_all_tasks_blocked()
        pod = s.pod_stats()
        assert (pod.requests_cancelled_running, pod.running, pod.requests_completed) == (1, 0, 0)
        assert s.admission()["inflight_requests"] == 0


async def test_client_leaving_mid_call_cancels_the_upstream_exactly_once(autojump_clock):
    body = chat(100)
    async with stack(policy()) as s:
        pipe = s.call(body)
        await trio.sleep(1.0)
        assert s.pod_stats().running == 1
        await pipe.aclose()
        await trio.testing.wait_all_tasks_blocked()
        pod = s.pod_stats()
        assert (pod.requests_cancelled_running, pod.running) == (1, 0)
        assert pod.wasted_client_gone_s == pytest.approx(pod.busy_s) and pod.busy_s > 0  # deadline 30 s away
        stats = s.admission()
        assert stats["inflight_requests"] == 0 and stats["counts"]["released"] == 1


async def test_upstream_gets_the_remaining_budget_not_the_original_one(autojump_clock):
    """x-request-timeout-ms is the caller's *remaining* budget: time queued here is gone."""
    first_body, body = chat(20), chat(1)
    async with stack(policy(limit=1)) as s:
        first = s.call(first_body)
        await trio.testing.wait_all_tasks_blocked()
        t0 = trio.current_time()
        queued = s.call(body, ("x-request-timeout-ms", "5000"), ("grpc-timeout", "7S"))
        assert (await queued.answer())[0] == 200
        assert (await first.answer())[0] == 200
        forwarded = dict(s.pool.forwarded[1])
        waited_ms = (first.answered_at - t0) * 1000
        assert waited_ms > 400  # it did queue behind the first request
        remaining = int(forwarded[b"x-request-timeout-ms"])
        assert 5000 - waited_ms - 1 <= remaining <= 5000 - waited_ms
        assert forwarded[b"grpc-timeout"] == b"%dm" % remaining  # the smaller budget is the one in force
        assert int(queued.header("x-rampmeter-queue-ms")) == pytest.approx(waited_ms, abs=1)


async def test_every_proxied_response_carries_queue_time_and_timeout_hint(autojump_clock):
    body = chat(4)
    async with stack(policy()) as s:
        expected = s.expected_ms(body)
        pipe = s.call(body)
        assert (await pipe.answer())[0] == 200
        assert pipe.header("x-rampmeter-queue-ms") == "0"
        # No end-to-end samples yet: the hint is the expected service time x timeout_hint_factor (2.5).
        assert int(pipe.header("x-rampmeter-timeout-hint-ms")) == math.ceil(expected * 2.5)
        streamed = s.call(chat(4, stream=True))
        await streamed.answer()
        assert streamed.status == 200 and int(streamed.header("x-rampmeter-timeout-hint-ms")) >= 100


# --- shedding and quotas --------------------------------------------------------------


async def test_batch_is_shed_before_interactive_and_interactive_before_realtime(autojump_clock):
    # Top-class queue cap 4, halved per class: realtime 4, interactive 2, batch 1 (docs/shedding.md).
    pol = policy(limit=1, rules=("queue_length",), shedding={"max_queued_requests": 4, "class_step_pct": 50})
    long, short = chat(100), chat(1)
    async with stack(pol) as s:
        first = s.call(long)
        await trio.testing.wait_all_tasks_blocked()
        queued = [s.call(short, ("x-priority", "interactive"))]
        await trio.testing.wait_all_tasks_blocked()

        async def outcome(klass: str) -> tuple[int, str | None]:
            pipe = s.call(short, ("x-priority", klass), ("x-request-timeout-ms", "10000"))
            queued.append(pipe)
            await trio.testing.wait_all_tasks_blocked()
            if not pipe.headers_sent:
                return 0, "queued"
            return pipe.status, pipe.header("x-rampmeter-reason")

        # One request waits: batch is shed, interactive still queues.
        assert await outcome("batch") == (503, "queue_full")
        assert await outcome("interactive") == (0, "queued")
        # Two wait: interactive is shed now too, realtime still queues.
        assert await outcome("batch") == (503, "queue_full")
        assert await outcome("interactive") == (503, "queue_full")
        assert await outcome("realtime") == (0, "queued")
        shed = queued[1]
        assert int(shed.header("x-rampmeter-retry-after-ms")) >= 100
        assert (await first.answer())[0] == 200
        statuses = [(await p.answer())[0] for p in queued]
        assert statuses.count(200) == 3  # the queued ones were all served in the end
        assert s.pod_stats().requests_submitted == 4


async def test_tenant_over_quota_gets_429_with_the_refill_time_and_other_tenants_pass(autojump_clock):
    pol = policy(tenants={"enabled": True, "trust_x_tenant": True, "rate_per_s": 1.0, "burst": 2})
    body = chat(1)
    async with stack(pol) as s:
        for _ in range(2):
            assert (await s.call(body, ("x-tenant", "a")).answer())[0] == 200
        over = s.call(body, ("x-tenant", "a"))
        status, _ = await over.answer()
        assert (status, over.header("x-rampmeter-reason")) == (429, "tenant_quota")
        # The next token is ~1 s away (less the time the two served requests took); jitter adds up to 20%.
        retry_ms = int(over.header("x-rampmeter-retry-after-ms"))
        assert 1000 - 2 * service_s(body) * 1000 - 1 <= retry_ms <= 1200
        assert over.header("retry-after") == str(math.ceil(retry_ms / 1000))  # whole seconds, rounded up
        assert (await s.call(body, ("x-tenant", "b")).answer())[0] == 200
        assert s.pod_stats().requests_submitted == 3
