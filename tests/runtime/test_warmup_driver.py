"""The warm-up driver against an in-process fake model server (httpx.MockTransport), on trio's autojump clock.

Virtual time makes the latencies and deadlines exact: a probe that the fake
answers after `trio.sleep(0.4)` took 0.4 s, so assertions on times are about
arithmetic, not about how fast this machine is. The one worker thread in the
driver (reading a probe's body_file) is made inline here: while a thread runs,
every task is blocked and the autojump clock races ahead (376 virtual seconds
of health checks during a 0.5 s read), so on a busy machine a slow read ran
past overall_timeout_s and a second warm-up sent more probes.
"""

from __future__ import annotations

import pathlib

import httpx
import msgspec
import pytest
import trio
import trio.testing

from proxy.core.lifecycle import State
from proxy.metrics import Metrics
from proxy.policy.schema import Policy, Upstream
from proxy.policy.warmup import Probe, Readiness, SlowStart, Warmup
from proxy.runtime.probes import identity_of
from proxy.runtime.readiness import UpstreamLifecycles
from tests.runtime.threaded import poll_until

URL = "http://model.test:8000"


class FakeModel:
    """A model server: 503 on /health until `up`, slow first probes, restartable."""

    def __init__(self, *, up: bool = True, cold_latencies=(2.0, 1.0, 0.5), warm_latency=0.4):
        self.up = up
        self.refuse = False
        self.probe_status = 200
        self.instance = 1
        self.cold_latencies = list(cold_latencies)
        self.warm_latency = warm_latency
        self.served = 0  # probes served by this instance
        self.paths: list[str] = []
        self.bodies: list[bytes] = []

    def restart(self) -> None:
        self.instance += 1
        self.served = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.refuse:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/health":
            if not self.up:
                return httpx.Response(503, text="loading")
            return httpx.Response(200, json={"instance_id": f"i{self.instance}", "started_at": 1000 + self.instance})
        self.paths.append(request.url.path)
        self.bodies.append(request.content)
        latency = self.cold_latencies[self.served] if self.served < len(self.cold_latencies) else self.warm_latency
        self.served += 1
        await trio.sleep(latency)
        return httpx.Response(self.probe_status, json={"choices": []})


def policy(probes=None, **warmup) -> Policy:
    probes = [Probe(path="/v1/completions", body='{"prompt": "hi"}', count=8)] if probes is None else probes
    args = {"health_interval_s": 1.0, "probes": probes, "concurrency": 1, "stable_last_n": 3, "stable_within_pct": 10.0}
    return Policy(
        upstreams=[Upstream(url=URL)],
        warmup=Warmup(**(args | warmup)),
        slow_start=SlowStart(window_s=10.0, aggression=1.0, min_weight=0.1),
    )


async def wait_state(lifecycles: UpstreamLifecycles, state: State, index: int = 0) -> float:
    with trio.fail_after(600):
        while lifecycles.warmers[index].lifecycle.state is not state:
            await trio.sleep(0.01)
    return trio.current_time()


@pytest.fixture(autouse=True)
def read_files_inline(monkeypatch):
    """trio.Path.read_bytes without its worker thread (module doc: threads and the autojump clock)."""

    async def read_bytes(self: trio.Path) -> bytes:
        await trio.lowlevel.checkpoint()
        return pathlib.Path(self).read_bytes()

    monkeypatch.setattr(trio.Path, "read_bytes", read_bytes)


@pytest.fixture
def metrics():
    return Metrics()


def sample(metrics: Metrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value("rampmeter_" + name, labels)


async def start(nursery, pol: Policy, model: FakeModel, metrics: Metrics) -> UpstreamLifecycles:
    lifecycles = UpstreamLifecycles(pol, metrics=metrics, transport=httpx.MockTransport(model))
    await nursery.start(lifecycles.run)
    return lifecycles


async def test_cold_to_warm_through_probes_and_ramp(autojump_clock, metrics):
    model = FakeModel()
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(), model, metrics)
        t0 = trio.current_time()
        assert not lc.is_ready() and lc.readiness()[0] is False
        await lc.wait_ready()
        # Probes one at a time: 2.0 + 1.0 + 0.5 + 0.4 + 0.4 + 0.4; the last three agree (0 % spread).
        assert trio.current_time() - t0 == pytest.approx(4.7)
        assert lc.warmers[0].lifecycle.state is State.RAMPING
        assert lc.warmers[0].last_warmup_s == pytest.approx(4.7)
        assert model.served == 6 and model.bodies[0] == b'{"prompt": "hi"}'
        assert lc.limit_factor(0) == pytest.approx(0.1)  # min_weight at the start of the ramp
        await trio.sleep(5.0)
        assert lc.limit_factor(0) == pytest.approx(0.5)
        assert lc.readiness()[1] == "ready: upstream 0 ramping (slow start 0.50; health /health (discovered))"
        ramped_at = await wait_state(lc, State.WARM)
        assert ramped_at - t0 == pytest.approx(14.7, abs=0.02)
        assert lc.limit_factor(0) == 1.0
        nursery.cancel_scope.cancel()
    assert sample(metrics, "warmup_probes_total", upstream="0", outcome="ok") == 6
    assert sample(metrics, "warmup_probe_duration_seconds_count", upstream="0", shape="0") == 6
    assert sample(metrics, "upstream_state", upstream="0", state="warm") == 1
    assert sample(metrics, "upstream_state", upstream="0", state="cold") == 0
    assert sample(metrics, "upstreams_ready") == 1
    assert sample(metrics, "warmup_duration_seconds", upstream="0") == pytest.approx(4.7)


async def test_not_ready_while_the_model_loads(autojump_clock, metrics):
    model = FakeModel(up=False)
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(), model, metrics)
        await trio.sleep(30.0)
        assert not lc.is_ready() and model.served == 0
        assert lc.readiness() == (False, "not ready: upstream 0 cold (health: tried /health 503)")
        model.up = True
        await lc.wait_ready()
        assert model.served == 6
        nursery.cancel_scope.cancel()


async def test_no_probes_means_ready_once_healthy(autojump_clock, metrics):
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(probes=[]), FakeModel(), metrics)
        await lc.wait_ready()
        assert trio.current_time() == pytest.approx(0.0)
        nursery.cancel_scope.cancel()


async def test_several_shapes_are_all_warmed(autojump_clock, metrics, tmp_path):
    body_file = tmp_path / "long.json"
    body_file.write_bytes(b'{"prompt": "' + b"x" * 1000 + b'"}')
    probes = [
        Probe(path="/v1/completions", body='{"prompt": "hi"}'),
        Probe(path="/v1/embeddings", body_file=str(body_file)),
    ]
    model = FakeModel()
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(probes, concurrency=2, success="count", min_successes=2), model, metrics)
        await lc.wait_ready()
        # Every shape got its two successes (a probe already in flight when its shape was met may add one).
        assert 2 <= model.paths.count("/v1/completions") <= 3 and 2 <= model.paths.count("/v1/embeddings") <= 3
        assert body_file.read_bytes() in model.bodies
        nursery.cancel_scope.cancel()


async def test_restart_detected_by_instance_id_goes_cold_and_warms_again(autojump_clock, metrics):
    model = FakeModel()
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(), model, metrics)
        await wait_state(lc, State.WARM)
        model.restart()
        await wait_state(lc, State.PROBING)  # cold, then probing on the same check
        assert not lc.is_ready()
        await lc.wait_ready()
        assert model.served == 6  # the new instance got a full warm-up
        assert lc.warmers[0].lifecycle.statistics().identity == ("instance_id=i2", "started_at=1002")
        nursery.cancel_scope.cancel()
    assert sample(metrics, "upstream_losses_total", upstream="0", cause="restarted") == 1


async def test_restart_during_probing_abandons_the_old_attempt(autojump_clock, metrics):
    model = FakeModel(cold_latencies=(5.0, 3.0, 2.0))
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(), model, metrics)
        await wait_state(lc, State.PROBING)
        await trio.sleep(2.5)
        model.restart()  # mid-probe: the next health check sees a new instance
        await lc.wait_ready()
        # The old attempt's probes did not count: the new instance served a full sequence.
        assert model.served == 6
        nursery.cancel_scope.cancel()
    assert sample(metrics, "upstream_transitions_total", upstream="0", state="cold") == 1


async def test_passive_failure_streak_unhealthy_then_cold_then_warm(autojump_clock, metrics):
    model = FakeModel()
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(failure_streak=3, health_interval_s=5.0), model, metrics)
        await wait_state(lc, State.WARM)
        for _ in range(3):
            lc.report_result(0, ok=False)
        assert lc.warmers[0].lifecycle.state is State.UNHEALTHY and not lc.is_ready()
        # The next good health check takes it to cold and straight into a new warm-up.
        await wait_state(lc, State.PROBING)
        await lc.wait_ready()
        nursery.cancel_scope.cancel()
    assert sample(metrics, "upstream_losses_total", upstream="0", cause="failure_streak") == 1


async def test_dead_server_turns_unhealthy_after_n_checks(autojump_clock, metrics):
    model = FakeModel()
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(unhealthy_after=3), model, metrics)
        await wait_state(lc, State.WARM)
        model.refuse = True
        lost_at = trio.current_time()
        await wait_state(lc, State.UNHEALTHY)
        assert trio.current_time() - lost_at <= 3.0  # three 1 s checks
        assert "ConnectError" in lc.readiness()[1]
        model.refuse = False
        model.restart()
        await lc.wait_ready()
        nursery.cancel_scope.cancel()
    assert sample(metrics, "upstream_losses_total", upstream="0", cause="health_lost") == 1


async def test_failing_probes_retry_after_the_interval(autojump_clock, metrics):
    model = FakeModel(cold_latencies=())
    model.probe_status = 500
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy([Probe(body="{}", count=3)], retry_interval_s=30.0), model, metrics)
        await trio.sleep(10.0)
        assert not lc.is_ready()
        assert "criterion not met in 3 probes (3 failed, last: 500)" in lc.warmers[0].last_problem
        assert model.served == 3
        model.probe_status = 200
        await lc.wait_ready()
        assert trio.current_time() >= 30.0  # waited out retry_interval_s
        nursery.cancel_scope.cancel()
    assert sample(metrics, "warmup_probes_total", upstream="0", outcome="error") == 3


async def test_overall_timeout_fails_the_attempt(autojump_clock, metrics):
    model = FakeModel(cold_latencies=(), warm_latency=20.0)
    pol = policy([Probe(body="{}", count=5)], overall_timeout_s=30.0, probe_timeout_ms=25_000, retry_interval_s=1000.0)
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, pol, model, metrics)
        await trio.sleep(31.0)
        assert not lc.is_ready()
        assert "not passed within overall_timeout_s = 30" in lc.warmers[0].last_problem
        nursery.cancel_scope.cancel()


async def test_probe_timeout_counts_as_a_failed_probe(autojump_clock, metrics):
    model = FakeModel(cold_latencies=(), warm_latency=20.0)
    pol = policy([Probe(body="{}", count=2)], success="count", probe_timeout_ms=1_000, retry_interval_s=1000.0)
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, pol, model, metrics)
        await trio.sleep(5.0)
        assert "last: timeout" in lc.warmers[0].last_problem
        nursery.cancel_scope.cancel()
    assert sample(metrics, "warmup_probes_total", upstream="0", outcome="timeout") == 2


async def test_unreadable_body_file_fails_with_a_reason(autojump_clock, metrics, tmp_path):
    pol = policy([Probe(body_file=str(tmp_path / "missing.json"), count=3)], retry_interval_s=1000.0)
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, pol, FakeModel(), metrics)
        # The file is read in a worker thread, which the autojump clock does not wait for: poll.
        await poll_until(lambda: lc.warmers[0].last_problem, 1.0)
        assert "cannot read probe body" in lc.warmers[0].last_problem and not lc.is_ready()
        nursery.cancel_scope.cancel()


async def test_hold_until_ready(autojump_clock, metrics):
    model = FakeModel(up=False)
    hold = msgspec.structs.replace(policy(), readiness=Readiness(before_warm="hold", max_hold_ms=60_000))
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, hold, model, metrics)
        # Deadline passes first: not ready, and the caller answers 503 not_ready.
        assert await lc.hold_until_ready(trio.current_time() + 2.0) is False
        assert trio.current_time() == pytest.approx(2.0)
        model.up = True
        assert await lc.hold_until_ready(trio.current_time() + 100.0) is True
        assert lc.is_ready()
        nursery.cancel_scope.cancel()


async def test_reject_mode_never_waits(autojump_clock, metrics):
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(), FakeModel(up=False), metrics)
        t0 = trio.current_time()
        assert await lc.hold_until_ready(t0 + 100.0) is False
        assert trio.current_time() == t0
        nursery.cancel_scope.cancel()


async def test_ready_waiters_all_wake_and_statistics(autojump_clock, metrics):
    model = FakeModel(up=False)
    woke: list[float] = []
    async with trio.open_nursery() as nursery:
        lc = await start(nursery, policy(), model, metrics)

        async def waiter():
            await lc.wait_ready()
            woke.append(trio.current_time())

        for _ in range(3):
            nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        model.up = True
        await wait_state(lc, State.RAMPING)
        await trio.testing.wait_all_tasks_blocked()
        assert len(woke) == 3 and len(set(woke)) == 1
        stats = lc.statistics()
        assert stats.ready and stats.upstreams[0].lifecycle.state is State.RAMPING
        assert stats.upstreams[0].probes[0].succeeded == 6
        assert "ramping" in repr(lc)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("body", "identity"),
    [
        (b'{"instance_id": "abc", "started_at": 12.5, "status": "ok"}', ("instance_id=abc", "started_at=12.5")),
        (b'{"started_at": 7}', ("started_at=7",)),
        (b'{"status": "ok"}', None),  # vLLM-like: healthy, no identity
        (b"", None),
        (b"OK", None),
        (b"[1, 2]", None),
        (b'{"instance_id": ', None),  # truncated JSON
        (b'{"instance_id": "' + b"x" * 70_000 + b'"}', None),  # too big to bother
    ],
)
def test_identity_of_health_answers(body, identity):
    assert identity_of(body, ["instance_id", "started_at"]) == identity
