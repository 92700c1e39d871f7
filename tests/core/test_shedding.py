"""Shedding rules: each rule and its reason, class order, Retry-After, the composed arrival gate."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import deadline as dl
from proxy.core.retry_after import RetryAfter
from proxy.core.shedding import (
    LoadSnapshot,
    Reject,
    ShedConfig,
    Shedder,
    arrival_verdict,
    class_weights,
)
from proxy.core.token_bucket import TenantQuota
from proxy.core.wire import REASON, Reason

REALTIME, INTERACTIVE, BATCH = 0, 1, 2


class FixedRandom:
    def random(self) -> float:
        return 0.0


def make(n_classes: int = 3, step: float = 0.25, **overrides) -> Shedder:
    config = ShedConfig(weights=class_weights(n_classes, step), **overrides)
    return Shedder(config, RetryAfter(100, 30_000, 0.0, FixedRandom()))


ONLY_QUEUE = {"gpu_memory_high_water": None, "saturation_growth_ratio": None, "codel_target_ms": None}


def snap(queued=(0, 0, 0), **kw) -> LoadSnapshot:
    return LoadSnapshot(queued_by_class=tuple(queued), **kw)


def test_class_weights():
    assert class_weights(3, 0.25) == (1.0, 0.75, 0.5625)
    assert class_weights(1, 0.9) == (1.0,)
    with pytest.raises(ValueError):
        class_weights(0, 0.1)
    with pytest.raises(ValueError):
        Shedder(ShedConfig(weights=(1.0, 1.5)), RetryAfter(1, 2, 0, FixedRandom()))


def test_quiet_load_sheds_nothing():
    shedder = make()
    for rank in range(3):
        assert shedder.check(snap(limit=10, inflight=2, drain_rate_per_s=50.0), rank, now=0.0) is None


def test_queue_length_counts_what_a_class_waits_behind():
    shedder = make(max_queued=100, **ONLY_QUEUE)  # caps: 100, 75, 56
    load = snap((10, 0, 60), drain_rate_per_s=10.0)
    assert shedder.check(load, REALTIME, 0.0) is None  # waits behind 10
    assert shedder.check(load, INTERACTIVE, 0.0) is None  # behind 10
    verdict = shedder.check(load, BATCH, 0.0)  # behind 70 >= 56
    assert verdict.reason is Reason.QUEUE_FULL
    assert verdict.retry_after_ms == 7_100  # 70 requests ahead and itself, at 10/s


def test_batch_is_shed_before_interactive_under_the_same_pressure():
    shedder = make(max_queued=100, **ONLY_QUEUE)
    load = snap((0, 60, 0))
    assert shedder.check(load, INTERACTIVE, 0.0) is None
    assert shedder.check(load, BATCH, 0.0).reason is Reason.QUEUE_FULL


def test_gpu_memory_pressure_sheds_lower_classes_first():
    shedder = make(gpu_memory_high_water=0.9, max_queued=None, saturation_growth_ratio=None, codel_target_ms=None)
    # free memory needed: 10% top, 13.3% interactive, 17.8% batch; 15% is free
    verdicts = [shedder.check(snap(gpu_memory_fraction=0.85), r, 0.0) for r in range(3)]
    assert verdicts[0] is None and verdicts[1] is None
    assert verdicts[2].reason is Reason.GPU_PRESSURE
    assert shedder.check(snap(gpu_memory_fraction=0.9), REALTIME, 0.0).reason is Reason.GPU_PRESSURE


def test_saturation_needs_the_limit_reached_and_the_queue_growing():
    shedder = make(saturation_growth_ratio=0.5, max_queued=None, gpu_memory_high_water=None, codel_target_ms=None)
    base = {"inflight": 8, "limit": 8, "drain_rate_per_s": 100.0}
    assert shedder.check(snap(**base, queue_growth_per_s=0.0), BATCH, 0.0) is None  # not growing
    assert shedder.check(snap(**{**base, "inflight": 7}, queue_growth_per_s=90.0), BATCH, 0.0) is None
    growing = snap(**base, queue_growth_per_s=40.0)  # 40% of drain: batch (28%) and interactive (37.5%)
    assert [shedder.check(growing, r, 0.0) is None for r in range(3)] == [True, False, False]
    assert shedder.check(growing, BATCH, 0.0).reason is Reason.OVERLOADED
    stuck = snap(inflight=8, limit=8, drain_rate_per_s=0.0, queue_growth_per_s=1.0)
    assert shedder.check(stuck, REALTIME, 0.0).retry_after_ms == 30_000  # nothing drains: the max
    assert shedder.check(snap(inflight=8, limit=0, queue_growth_per_s=5.0), BATCH, 0.0) is None  # limit unknown


def test_codel_sheds_on_a_standing_queue_and_stops_when_it_drains():
    shedder = make(
        codel_target_ms=50.0,
        codel_interval_ms=100.0,
        max_queued=None,
        gpu_memory_high_water=None,
        saturation_growth_ratio=None,
    )
    shedder.on_dequeue(80.0, BATCH, 0.00)
    shedder.on_dequeue(70.0, BATCH, 0.05)
    standing = snap((0, 3, 5), head_wait_ms=90.0, drain_rate_per_s=10.0, head_wait_by_class=(0.0, 0.0, 90.0))
    assert shedder.check(standing, BATCH, 0.10).reason is Reason.OVERLOADED  # the first drop: at once
    assert shedder.check(standing, INTERACTIVE, 0.10) is None
    assert shedder.check(standing, BATCH, 0.15) is None  # control law: the next one interval/sqrt(1) later
    assert shedder.check(standing, BATCH, 0.19) is None  # the interval [0.1, 0.2) is still running
    assert shedder.check(snap(head_wait_ms=0.0), BATCH, 0.20) is not None  # [0.1, 0.2) stood: still dropping
    assert shedder.check(standing, BATCH, 0.25) is None  # next drop at 0.20 + 0.1/sqrt(2)
    assert shedder.check(standing, BATCH, 0.275) is not None
    assert shedder.check(snap(head_wait_ms=0.0), BATCH, 0.31) is None  # [0.2, 0.3) held an empty queue
    assert [c.mode.value for c in shedder.statistics().codel] == ["normal"] * 3


def test_codel_sees_a_standing_low_class_queue_behind_short_high_class_waits():
    """Strict priority at 2x: interactive is served at once, batch waits out its deadline.
    One CoDel over every class saw the interactive dequeues' short waits and never fired."""
    shedder = make(
        codel_target_ms=50.0,
        codel_interval_ms=100.0,
        max_queued=None,
        gpu_memory_high_water=None,
        saturation_growth_ratio=None,
    )
    for i in range(30):  # 0 .. 0.29 s: interactive leaves after 5 ms; batch's oldest keeps ageing
        now = i * 0.01
        shedder.on_dequeue(5.0, INTERACTIVE, now)
        assert (
            shedder.check(snap((0, 1, 4), head_wait_by_class=(0.0, 5.0, 500.0 + now * 1000)), INTERACTIVE, now) is None
        )
    batch = shedder.check(snap((0, 1, 4), head_wait_by_class=(0.0, 5.0, 800.0)), BATCH, 0.30)
    assert batch is not None and batch.reason is Reason.OVERLOADED and batch.retry_after_ms is not None
    assert [c.mode.value for c in shedder.statistics().codel] == ["normal", "normal", "dropping"]


def test_codel_sheds_every_class_below_one_with_a_standing_queue():
    shedder = make(
        codel_target_ms=50.0,
        codel_interval_ms=100.0,
        max_queued=None,
        gpu_memory_high_water=None,
        saturation_growth_ratio=None,
    )
    waits = (0.0, 400.0, 0.0)  # interactive stands; batch has nobody queued right now
    for i in range(25):
        shedder.check(snap((0, 5, 0), head_wait_by_class=waits), REALTIME, i * 0.01)
    shed = [
        shedder.check(snap((0, 5, 0), head_wait_by_class=waits), r, 0.25) is not None
        for r in (REALTIME, INTERACTIVE, BATCH)
    ]
    assert shed == [False, True, True]


snapshots = st.builds(
    LoadSnapshot,
    queued_by_class=st.tuples(*[st.integers(0, 300)] * 4),
    head_wait_ms=st.floats(0, 5_000),
    head_wait_by_class=st.one_of(st.just(()), st.tuples(*[st.floats(0, 5_000)] * 4)),
    inflight=st.integers(0, 20),
    limit=st.integers(0, 20),
    queue_growth_per_s=st.floats(-50, 200),
    drain_rate_per_s=st.floats(0, 200),
    gpu_memory_fraction=st.floats(0, 1),
)


@given(st.lists(snapshots, min_size=1, max_size=20), st.floats(0, 0.9), st.integers(1, 500))
def test_if_a_class_is_shed_every_lower_class_is_too(loads, step, max_queued):
    shedder = make(4, step, max_queued=max_queued, codel_interval_ms=100.0)
    for i, load in enumerate(loads):
        now = i * 0.07
        shed = [shedder.check(load, r, now) is not None for r in range(4)]
        assert shed == sorted(shed), f"shed={shed} for {load}"


@given(st.integers(0, 5_000), st.integers(0, 5_000), st.floats(0.1, 500))
def test_retry_after_grows_with_the_backlog(a, b, rate):
    shedder = make(1, 0.0, max_queued=1, **ONLY_QUEUE)
    small, large = sorted((a, b))
    r_small = shedder.check(snap((max(1, small),), drain_rate_per_s=rate), 0, 0.0).retry_after_ms
    r_large = shedder.check(snap((max(1, large),), drain_rate_per_s=rate), 0, 0.0).retry_after_ms
    assert r_small <= r_large


def test_reject_response_follows_the_wire_contract():
    status, headers, body = Reject(Reason.QUEUE_FULL, 1500, "full").response()
    assert status == 503
    assert dict(headers)[REASON.encode()] == b"queue_full"
    assert json.loads(body)["error"] == {
        "type": "rampmeter_rejected",
        "code": "queue_full",
        "message": "full",
        "retry_after_ms": 1500,
    }


def test_statistics_count_by_reason_and_repr():
    shedder = make(max_queued=1, **ONLY_QUEUE)
    shedder.check(snap((5, 0, 0)), REALTIME, 0.0)
    assert shedder.statistics().shed["queue_full"] == 1
    assert "queue_full" in repr(shedder)


MEETABLE = dl.Meetable(completion=1.0, slack_ms=10.0)


def test_gate_tenant_quota_first_with_the_exact_refill_time():
    shedder, quota = make(), TenantQuota(rate_per_s=Fraction(2), burst=1, max_tenants=10)
    assert arrival_verdict(shedder, snap(), REALTIME, Fraction(0), MEETABLE, tenants=quota, tenant=b"t") is None
    verdict = arrival_verdict(shedder, snap(), REALTIME, Fraction(0), MEETABLE, tenants=quota, tenant=b"t")
    assert verdict.reason is Reason.TENANT_QUOTA and verdict.retry_after_ms == 500
    assert verdict.response()[0] == 429


def test_gate_refunds_tokens_when_a_later_rule_rejects():
    shedder, quota = make(max_queued=1, **ONLY_QUEUE), TenantQuota(rate_per_s=1, burst=2, max_tenants=10)
    verdict = arrival_verdict(shedder, snap((3, 0, 0)), REALTIME, 0.0, MEETABLE, tenants=quota, tenant=b"t")
    assert verdict.reason is Reason.QUEUE_FULL
    assert quota.tokens(b"t", 0.0) == 2


def test_gate_unmeetable_deadline_rejects_or_tries_per_class_policy():
    shedder = make()
    late = dl.check(0.0, 0.5, queue_wait=400.0, service=300.0)
    verdict = arrival_verdict(shedder, snap(), INTERACTIVE, 0.0, late, on_unmeetable="reject")
    assert verdict.reason is Reason.DEADLINE_UNMEETABLE and verdict.retry_after_ms == 200
    assert arrival_verdict(shedder, snap(), INTERACTIVE, 0.0, late, on_unmeetable="try") is None
    hopeless = dl.check(0.0, 0.1, queue_wait=0.0, service=300.0)
    verdict = arrival_verdict(shedder, snap(), INTERACTIVE, 0.0, hopeless)
    assert verdict.retry_after_ms is None and "raise it" in verdict.message
    assert b"retry-after" not in dict(verdict.response()[1])


def test_gate_load_rules_before_deadline():
    shedder = make(max_queued=1, **ONLY_QUEUE)
    late = dl.check(0.0, 0.5, queue_wait=400.0, service=300.0)
    assert arrival_verdict(shedder, snap((2, 0, 0)), REALTIME, 0.0, late).reason is Reason.QUEUE_FULL


@given(
    st.lists(st.tuples(st.floats(0, 2_000), st.floats(0, 0.5)), max_size=40),
    st.integers(0, 2),
    st.floats(0, 1),
    st.sampled_from([(0.0, 0.0), (20.0, 80.0), (400.0, 1500.0)]),
)
def test_the_quiet_fast_path_sheds_only_where_the_full_check_would(waits, rank, gpu, scale):
    """passes_quiet (nothing queued, room under the limit) never lets through what `check` on the
    same empty-queue snapshot would shed, and leaves the CoDels as `check` would."""
    fast, full = make(), make()
    now = 0.0
    for wait_ms, dt in waits:  # the same history of dequeues into both
        now += dt
        fast.on_dequeue(wait_ms, rank, now)
        full.on_dequeue(wait_ms, rank, now)
    snap = LoadSnapshot((0, 0, 0), gpu_memory_fraction=gpu, service_p50_ms=scale[0], service_p99_ms=scale[1])
    passed = fast.passes_quiet(rank, now, gpu, *scale)
    verdict = full.check(snap, rank, now)
    if passed:
        assert verdict is None
        assert [c.statistics() for c in fast.codels] == [c.statistics() for c in full.codels]
    else:  # the caller falls back to check on a full snapshot: the same verdict as full's
        assert fast.check(snap, rank, now) == verdict


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["quiet", "dequeue", "check"]),
            st.floats(0, 400),
            st.floats(0, 1.0),
            st.integers(0, 2),
            st.sampled_from([(0.0, 0.0), (20.0, 80.0), (400.0, 1500.0)]),
        ),
        max_size=60,
    )
)
def test_skipping_zero_observations_leaves_every_codel_as_observing_them_would(events):
    """The quiet path and on_dequeue skip a CoDel sample while every running interval holds a 0
    wait already (Shedder._zeros_until): verdicts and CoDel states match a shedder that never skips."""
    scaled = {"codel_target_p50_ratio": 2.0, "codel_interval_p99_ratio": 2.0}  # retunes move interval ends
    fast, ref = make(**scaled), make(**scaled)
    now = 0.0
    for kind, wait_ms, dt, rank, scale in events:
        now += dt
        ref._zeros_until = -math.inf  # the reference observes every sample
        if kind == "quiet":
            assert fast.passes_quiet(rank, now, 0.0, *scale) == ref.passes_quiet(rank, now, 0.0, *scale)
        elif kind == "dequeue":
            fast.on_dequeue(wait_ms, rank, now)
            ref.on_dequeue(wait_ms, rank, now)
        else:
            s = LoadSnapshot((1, 0, 0), head_wait_ms=wait_ms, service_p50_ms=scale[0], service_p99_ms=scale[1])
            assert fast.check(s, rank, now) == ref.check(s, rank, now)
        assert [c.statistics() for c in fast.codels] == [c.statistics() for c in ref.codels]


def test_the_gate_builds_no_snapshot_while_nothing_queues_and_the_limit_has_room(monkeypatch):
    """issue 16 item 5: an arrival into an idle controller is judged without a LoadSnapshot; once
    a request waits, the snapshot is back (the load rules can shed then)."""
    import random

    from proxy.core.admission import AdmissionController
    from proxy.core.arrival import ArrivalGate
    from proxy.core.decisions import Admit, Enqueue, Outcome
    from proxy.core.load import LoadEstimator
    from proxy.policy import shedding as shedding_policy
    from proxy.policy.admission import Limits
    from proxy.policy.schema import Policy, Upstream

    policy = Policy(upstreams=[Upstream(url="http://u")], limits=Limits(kind="fixed", initial_limit=1, min_limit=1))
    gate = ArrivalGate(policy, shedding_policy.shedder(policy.shedding, 3, random.Random(0)), None)
    ctl = AdmissionController(policy, rng=random.Random(0), gate=gate)
    snapshots = []
    real = LoadEstimator.snapshot
    monkeypatch.setattr(LoadEstimator, "snapshot", lambda *a: snapshots.append(a) or real(*a))

    def arrive(now):
        cost = ctl.estimate("/", b"{}")
        return ctl.arrive(ctl.ticket("interactive", cost, now + 30.0, 30_000, now=now), now)

    first = arrive(0.0)
    assert isinstance(first, Admit) and snapshots == []  # quiet: no snapshot
    assert isinstance(arrive(0.001), Enqueue) and len(snapshots) == 1  # the limit is full: a snapshot
    ctl.release(first.lease, 0.01, Outcome.SUCCESS, 10.0)  # admits the queued one; the queue is empty again
    assert isinstance(arrive(0.02), Enqueue) and len(snapshots) == 2  # no room: judged on a snapshot
