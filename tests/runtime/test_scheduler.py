"""The trio scheduler under autojump_clock: limits held, cancellation, expiry, reload, metrics."""

from __future__ import annotations

import random

import httpx
import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from proxy.core.cost import Cost
from proxy.core.decisions import Admit, LeaseError, Observed, Outcome
from proxy.core.wire import Reason
from proxy.metrics import Metrics
from proxy.policy.admission import ClassPolicy
from proxy.runtime.readiness import UpstreamLifecycles
from proxy.runtime.scheduler import Scheduler
from tests.core.test_admission import make_policy, patient_classes, ticket
from tests.runtime.test_warmup_driver import FakeModel
from tests.runtime.test_warmup_driver import policy as warm_policy

COST = Cost(10, 10, 20, route="/v1/completions")


def scheduler(policy=None, metrics=None) -> Scheduler:
    return Scheduler(policy or make_policy(1), rng=random.Random(0), metrics=metrics)


def sample(metrics: Metrics, name: str, **labels) -> float:
    value = metrics.registry.get_sample_value("rampmeter_" + name, labels)
    return 0.0 if value is None else value


async def hold(
    s: Scheduler,
    release: trio.Event,
    t=None,
    seen: list | None = None,
    *,
    task_status=trio.TASK_STATUS_IGNORED,
):
    async with s.admit(t or ticket()) as slot:
        task_status.started(slot)
        if seen is not None:
            seen.append(slot)
        await release.wait()
        slot.done(Outcome.SUCCESS, 100.0)


async def test_concurrency_is_held_at_the_limit(autojump_clock):
    s = scheduler(make_policy(3), Metrics(CollectorRegistry()))
    running = peak = 0

    async def job():
        nonlocal running, peak
        async with s.admit(s.ticket(s.resolve_class(None), COST)) as slot:
            running += 1
            peak = max(peak, running)
            await trio.sleep(1)
            running -= 1
            slot.done(Outcome.SUCCESS, 1000.0, Observed(10, 10))

    start = trio.current_time()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(job)
    assert peak == 3
    assert trio.current_time() - start == 4.0  # 10 jobs, 3 at a time, 1 s each
    stats = s.statistics()
    assert stats["counts"]["admitted"] == 10 and stats["inflight_units"] == 0 and stats["waiters"] == 0


async def test_cancelled_while_queued_leaves_the_queue_and_is_never_admitted(autojump_clock):
    metrics = Metrics(CollectorRegistry())
    s = scheduler(make_policy(1), metrics)
    release, entered = trio.Event(), []
    async with trio.open_nursery() as nursery:
        await nursery.start(hold, s, release)
        scope = trio.CancelScope()

        async def waiter():
            with scope:
                async with s.admit(ticket()) as slot:
                    entered.append(slot)

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert (
            s.controller.depth("interactive") == 1 and sample(metrics, "queue_depth", **{"class": "interactive"}) == 1
        )
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert s.controller.depth("interactive") == 0  # gone at once, before any slot frees
        assert sample(metrics, "queue_abandoned_total", **{"class": "interactive"}) == 1
        release.set()
    assert entered == [] and s.controller.capacity.used == [0]


async def test_cancelled_as_it_is_woken_gives_the_slot_to_the_next(autojump_clock):
    s = scheduler(make_policy(1))
    entered = []
    first = await s.admit(ticket()).__aenter__()
    scope = trio.CancelScope()

    async def waiter(name, cancel_scope=None):
        with cancel_scope or trio.CancelScope():
            async with s.admit(ticket()) as slot:
                entered.append(name)
                slot.done(Outcome.SUCCESS, 1.0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, "doomed", scope)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter, "next")
        await trio.testing.wait_all_tasks_blocked()
        first.done(Outcome.SUCCESS, 1.0)  # wakes "doomed" with an Admit ...
        scope.cancel()  # ... whose client goes away before it runs
    assert entered == ["next"]  # the doomed request was never forwarded
    assert s.controller.capacity.used == [0] and s.statistics()["counts"]["released"] == 3


async def test_leases_are_released_on_exceptions_and_cancellation(autojump_clock):
    s = scheduler(make_policy(1))
    with pytest.raises(ZeroDivisionError):
        async with s.admit(ticket()):
            1 / 0  # noqa: B018
    with trio.move_on_after(1):
        async with s.admit(ticket()):
            await trio.sleep(10)
    async with s.admit(ticket()):
        pass  # a plain exit without done() counts as an error, and still releases
    assert s.controller.capacity.used == [0] and s.statistics()["counts"]["released"] == 3


async def test_done_is_once_only_and_rejections_are_values(autojump_clock):
    classes = {**patient_classes(), "interactive": ClassPolicy(max_queue_length=0)}
    s = scheduler(make_policy(1, classes=classes), Metrics(CollectorRegistry()))
    async with s.admit(ticket()) as slot:
        async with s.admit(ticket()) as rejected:
            assert rejected.lease is None and rejected.rejection.reason is Reason.CLASS_QUEUE_FULL
            assert rejected.rejection.response()[0] == 503
            with pytest.raises(LeaseError):
                rejected.done(Outcome.SUCCESS)
        slot.done(Outcome.SUCCESS, 5.0)
        with pytest.raises(LeaseError):
            slot.done(Outcome.SUCCESS, 5.0)
    assert "Slot" in repr(slot) and "Scheduler" in repr(s)


async def test_a_queued_request_expires_when_its_deadline_can_no_longer_be_met(autojump_clock):
    s = scheduler(make_policy(1))
    release = trio.Event()
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        await nursery.start(hold, s, release)
        async with s.admit(ticket(expected_ms=500.0, deadline=start + 2.0)) as slot:
            assert slot.rejection.reason is Reason.DEADLINE_EXPIRED
            assert trio.current_time() - start == 1.5  # deadline minus expected service time
        release.set()
    assert s.controller.statistics()["counts"]["expired"] == 1


async def test_reload_keeps_queued_requests_and_rearms_expiry(autojump_clock):
    strict = {**patient_classes(), "batch": ClassPolicy(priority=2, on_unmeetable="reject")}
    s = scheduler(make_policy(1, classes=strict))
    release, seen = trio.Event(), []
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        await nursery.start(hold, s, release)
        for _ in range(3):
            nursery.start_soon(hold, s, release, ticket("interactive"), seen)
        late = ticket("batch", 500.0, deadline=start + 10.0)
        nursery.start_soon(hold, s, release, late, seen)
        await trio.testing.wait_all_tasks_blocked()
        assert s.controller.depth("interactive") == 3 and s.controller.expiry_of(late.id) == start + 9.5
        # A bigger limit, FCFS, and batch now tries until the deadline itself.
        trying = {**patient_classes(), "batch": ClassPolicy(priority=2, on_unmeetable="try")}
        s.apply_policy(make_policy(3, order="fcfs", classes=trying))
        await trio.testing.wait_all_tasks_blocked()
        assert len(seen) == 2 and s.controller.expiry_of(late.id) == start + 10.0
        await trio.sleep(9.7)  # past the old expiry: still queued
        assert s.controller.depth("batch") == 1 and s.controller.depth("interactive") == 1
        release.set()
    assert len(seen) == 4 and all(slot.rejection is None for slot in seen)


async def test_metrics_follow_admission(autojump_clock):
    metrics = Metrics(CollectorRegistry())
    s = scheduler(make_policy(2, kind="gradient"), metrics)
    t = s.ticket(s.resolve_class(b"no-such-class"), COST)
    assert t.klass == "interactive" and sample(metrics, "unknown_priority_total") == 1
    async with s.admit(t) as slot:
        assert sample(metrics, "admission_inflight", upstream="0") == 1
        slot.done(Outcome.SUCCESS, 900.0, Observed(10, 5))
    assert sample(metrics, "admitted_total", **{"class": "interactive"}) == 1
    assert sample(metrics, "admission_inflight", upstream="0") == 0
    assert sample(metrics, "admission_limit", upstream="0") == 2
    assert sample(metrics, "queue_wait_seconds_count", **{"class": "interactive"}) == 1
    assert sample(metrics, "cost_estimate_error_ratio_count", kind="service_time") == 1
    assert sample(metrics, "cost_estimate_error_ratio_count", kind="output_tokens") == 1


async def test_limit_changes_are_counted_by_reason(autojump_clock):
    metrics = Metrics(CollectorRegistry())
    s = scheduler(make_policy(10, kind="gradient", backoff_ratio=0.5), metrics)
    async with s.admit(ticket()) as slot:
        slot.done(Outcome.DROPPED, 100.0)
    assert sample(metrics, "admission_limit", upstream="0") == 5
    assert sample(metrics, "limit_changes_total", upstream="0", reason="drop") == 1


async def test_capacity_factor_and_refusals(autojump_clock):
    s = scheduler(make_policy(2, upstreams=2), Metrics(CollectorRegistry()))
    s.set_capacity_factor(0, 0.0)
    got = []
    async with trio.open_nursery() as nursery:
        release = trio.Event()
        for _ in range(2):
            nursery.start_soon(hold, s, release, ticket(), got)
        await trio.testing.wait_all_tasks_blocked()
        assert [slot.upstream for slot in got] == [1, 1]
        s.set_capacity_factor(0, 1.0)
        s.mark_refused(1)
        release.set()
    assert s.statistics()["balancer"]["refusals"] == [0, 1]


async def test_an_admit_for_a_vanished_waiter_is_released_not_leaked(autojump_clock):
    s = scheduler(make_policy(1))
    ctl = s.controller
    d = ctl.arrive(ticket(), trio.current_time())
    assert isinstance(d, Admit)
    s._deliver([d])  # nobody waits for this ticket
    assert ctl.capacity.used == [0]


async def test_a_request_cut_upstream_teaches_the_model_its_shape_takes_longer(autojump_clock):
    s = scheduler(make_policy(2))
    cost = s.estimate("/v1/completions", b'{"prompt": "hello", "max_tokens": 4}')
    before = s.ticket(s.resolve_class(None), cost).expected_ms
    with trio.move_on_after(5.0):  # the deadline passes while it is upstream
        async with s.admit(s.ticket(s.resolve_class(None), cost, trio.current_time() + 5.0)) as slot:
            assert slot.lease is not None
            await trio.sleep_forever()
    after = s.ticket(s.resolve_class(None), cost)
    assert before < 5000.0 <= after.expected_ms  # at least the 5 s it was given
    assert s.controller.statistics()["models"]["/v1/completions"]["censored"]["informative"] == 1
    assert s.controller.capacity.used == [0]


async def test_warm_up_probes_seed_the_model_through_the_driver_hook(autojump_clock):
    model = FakeModel(cold_latencies=(), warm_latency=0.4)
    pol = warm_policy()
    s = Scheduler(pol, rng=random.Random(0))
    lifecycles = UpstreamLifecycles(pol, transport=httpx.MockTransport(model))
    for w in lifecycles.warmers:
        w.on_sample = s.learn_probe
    async with trio.open_nursery() as nursery:
        await nursery.start(lifecycles.run)
        with trio.fail_after(60):
            while not lifecycles.ready:
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    stats = s.controller.statistics()["models"]["/v1/completions"]
    assert stats["seeded_samples"] >= 3 and stats["judged"]
    assert (
        s.ticket(s.resolve_class(None), s.estimate("/v1/completions", b'{"prompt": "hi"}')).expected_ms > 300
    )  # ~0.4 s, not the prior


async def test_the_scheduler_task_ends_a_phantom_lease_on_time_and_admits_into_its_room(autojump_clock):
    s = scheduler(make_policy(1, stops_on_cancel=False))
    cost = s.estimate("/v1/completions", b'{"prompt": "hello", "max_tokens": 4}')
    admitted_at: list[float] = []

    async def second() -> None:
        async with s.admit(s.ticket(s.resolve_class(None), cost)) as slot:
            admitted_at.append(trio.current_time())
            slot.done(Outcome.SUCCESS, 10.0)

    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        with trio.move_on_after(1.0):  # cut after 1 s upstream, on a server that keeps computing
            async with s.admit(s.ticket(s.resolve_class(None), cost, trio.current_time() + 1.0)) as slot:
                nursery.start_soon(second)
                await trio.sleep_forever()
        cut_at = trio.current_time()
        assert len(s.controller.phantoms) == 1 and s.controller.capacity.used == [1]
        end = s.controller.next_phantom_end()
        await trio.sleep(end - cut_at + 0.001)
        assert admitted_at and admitted_at[0] == pytest.approx(end)  # at the phantom's end, not later
        assert s.controller.capacity.used == [0]
        nursery.cancel_scope.cancel()
    assert slot.lease is not None
