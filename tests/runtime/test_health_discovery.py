"""Health discovery and fast readiness in the warm-up driver, on trio's autojump clock.

The fake servers are the habits of real ones: a llama.cpp-style server with no
/health (404) that serves /v1/models, a Triton-style one on /v2/health/ready, one
that is down for its first 1.2 s. Times are virtual, so they are arithmetic.
"""

from __future__ import annotations

import httpx
import pytest
import trio

from proxy.core.lifecycle import State
from proxy.metrics import Metrics
from proxy.policy.schema import Policy, Upstream
from proxy.policy.warmup import Probe, SlowStart, Warmup
from proxy.runtime.readiness import UpstreamLifecycles

URL = "http://model.test:8000"


class Server:
    """Answers `routes[path]` (a status) after `latency_s`; down (connection refused) before `up_at`."""

    def __init__(self, routes: dict[str, int], *, up_at: float = 0.0, latency_s: float = 0.0, hang: set | None = None):
        self.routes, self.up_at, self.latency_s, self.hang = routes, up_at, latency_s, hang or set()
        self.asked: list[str] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if trio.current_time() < self.up_at:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        self.asked.append(path)
        if path in self.hang:
            await trio.sleep_forever()
        await trio.sleep(self.latency_s)
        return httpx.Response(self.routes.get(path, 404), json={})


def policy(**warmup) -> Policy:
    return Policy(
        upstreams=[Upstream(url=URL)],
        warmup=Warmup(**({"health_interval_s": 2.0} | warmup)),
        slow_start=SlowStart(window_s=0.0),
    )


async def start(nursery, pol: Policy, server: Server) -> UpstreamLifecycles:
    lifecycles = UpstreamLifecycles(pol, metrics=Metrics(), transport=httpx.MockTransport(server))
    await nursery.start(lifecycles.run)
    return lifecycles


async def test_a_server_without_health_is_ready_through_v1_models(autojump_clock):
    server = Server({"/v1/models": 200})
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(), server)
        await lc.wait_ready()
        assert trio.current_time() == pytest.approx(0.0)
        assert server.asked == ["/health", "/healthz", "/v2/health/ready", "/ping", "/v1/models"]
        ready, why = lc.readiness()
        assert ready and "health /v1/models (discovered after /health 404, /healthz 404" in why
        await trio.sleep(4.5)
        assert server.asked[5:] == ["/v1/models", "/v1/models"]  # found: only it is asked now
        assert lc.statistics().upstreams[0].health.startswith("health /v1/models (discovered")
        nursery.cancel_scope.cancel()


async def test_not_ready_says_what_was_tried_and_what_answered(autojump_clock):
    server = Server({})  # nothing answers 2xx: the "503 not_ready for ever with no explanation"
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(), server)
        await trio.sleep(10.0)
        assert not lc.is_ready()
        reason = lc.not_ready_reason()
        assert reason == (
            "the model server is not warm yet: upstream 0 cold (health: no 2xx from any of /health 404, "
            "/healthz 404, /v2/health/ready 404, /ping 404, /v1/models 404, /models 404; set warmup.health_path)"
        )
        assert lc.readiness() == (False, "not ready: " + reason.removeprefix("the model server is not warm yet: "))
        nursery.cancel_scope.cancel()


async def test_a_model_up_after_1_2_s_is_ready_within_a_fraction_of_a_second_of_it(autojump_clock):
    # One probe shape; the model answers each in 50 ms from the start (no cold penalty).
    probes = [Probe(path="/v1/completions", body="{}", count=8)]
    server = Server({"/health": 200, "/v1/completions": 200}, up_at=1.2, latency_s=0.05)
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(probes=probes, concurrency=1), server)
        await lc.wait_ready()
        # Checks at 0, 0.1, 0.25, 0.475, 0.81, 1.31 (backing off from 0.1 s): seen at 1.31, 3 probes of 50 ms.
        assert trio.current_time() == pytest.approx(1.31 + 4 * 0.05, abs=0.01)  # + the health GET's 50 ms
        nursery.cancel_scope.cancel()


async def test_a_warm_upstream_keeps_the_plain_interval_for_unhealthy_after(autojump_clock):
    server = Server({"/health": 200})
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(unhealthy_after=3), server)
        await lc.wait_ready()
        server.up_at = float("inf")  # dies
        died = trio.current_time()
        while lc.warmers[0].lifecycle.state is not State.UNHEALTHY:
            await trio.sleep(0.01)
        assert trio.current_time() - died == pytest.approx(6.0, abs=2.01)  # three checks 2 s apart, not 0.1 s
        nursery.cancel_scope.cancel()


async def test_a_path_that_hangs_ends_the_round_within_the_health_timeout(autojump_clock):
    server = Server({"/v1/models": 200}, hang={"/healthz"})
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(health_timeout_ms=500), server)
        await trio.sleep(0.6)
        assert not lc.is_ready()
        assert lc.warmers[0].last_problem == "health: tried /health 404, /healthz timeout"
        nursery.cancel_scope.cancel()


async def test_a_configured_health_path_is_not_second_guessed(autojump_clock):
    server = Server({"/v1/models": 200})
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(health_path="/health"), server)
        await trio.sleep(5.0)
        assert not lc.is_ready() and set(server.asked) == {"/health"}
        assert "cold (health /health 404)" in lc.readiness()[1]
        nursery.cancel_scope.cancel()


async def test_changing_the_candidates_on_reload_searches_again(autojump_clock):
    server = Server({"/status": 200})
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(), server)
        await trio.sleep(1.0)
        assert not lc.is_ready()
        lc.update_policy(policy(health_candidates=["/status"]))
        await lc.wait_ready()
        assert "health /status (discovered)" in lc.readiness()[1]
        nursery.cancel_scope.cancel()
