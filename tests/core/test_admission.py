"""The admission controller, pure: a hand-advanced clock, exact orders, Hypothesis invariants."""

from __future__ import annotations

import itertools
import math
import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.admission import AdmissionController
from proxy.core.cost import Cost
from proxy.core.decisions import (
    Admit,
    Enqueue,
    Expired,
    LeaseError,
    Observed,
    Outcome,
    Reject,
    Ticket,
)
from proxy.core.wire import Reason
from proxy.policy.admission import ClassPolicy, Limits, Scheduling, default_classes
from proxy.policy.schema import Policy, Upstream

_ids = itertools.count(1_000_000)


def patient_classes() -> dict:
    """The default classes with no practical max_queue_wait_ms, so order tests see pure SJF/class order."""
    return {n: msgspec.structs.replace(c, max_queue_wait_ms=86_400_000) for n, c in default_classes().items()}


def make_policy(
    limit: int = 2,
    *,
    unit: str = "requests",
    kind: str = "fixed",
    order: str = "sjf",
    class_mode: str = "strict",
    reserved: dict | None = None,
    classes: dict | None = None,
    aging_ms_per_s: float = 1000.0,
    upstreams: int = 1,
    fcfs_wait_multiple: float = 0.0,
    stops_on_cancel=True,
    **limits,
) -> Policy:
    """A policy for pure order and lease tests: like patient_classes(), the FCFS-relative
    starvation bound is off unless asked for, and upstreams stop on cancel (no phantom leases)
    unless `stops_on_cancel` (one value, or one per upstream) says otherwise, so what is checked
    is the order and the lease accounting themselves."""
    habits = stops_on_cancel if isinstance(stops_on_cancel, tuple) else (stops_on_cancel,) * upstreams
    return Policy(
        upstreams=[Upstream(url=f"http://127.0.0.1:{8000 + i}", stops_on_cancel=habits[i]) for i in range(upstreams)],
        scheduling=Scheduling(
            order=order,
            class_mode=class_mode,
            reserved_slots=reserved or {},
            aging_ms_per_s=aging_ms_per_s,
            fcfs_wait_multiple=fcfs_wait_multiple,
        ),
        classes=classes or patient_classes(),
        limits=Limits(
            kind=kind,
            unit=unit,
            initial_limit=limit,
            min_limit=1,
            max_limit=max(limit, 1000),
            **limits,
        ),
    )


def controller(policy: Policy | None = None, seed: int = 0) -> AdmissionController:
    return AdmissionController(policy or make_policy(), rng=random.Random(seed))


def ticket(
    klass: str = "interactive",
    expected_ms: float = 100.0,
    units: int = 1,
    deadline: float = math.inf,
) -> Ticket:
    return Ticket(next(_ids), klass, Cost(units, 0, units, route="/"), expected_ms, deadline)


def admitted_ids(decisions) -> list[int]:
    return [d.ticket.id for d in decisions if isinstance(d, Admit)]


def run_one_at_a_time(ctl: AdmissionController, first: Admit, now: float, step: float = 1.0) -> list[int]:
    """Release the running lease repeatedly; the order in which waiters get in."""
    order, lease = [], first.lease
    while lease is not None:
        now += step
        woken = ctl.release(lease, now, Outcome.SUCCESS, 10.0)
        order += admitted_ids(woken)
        lease = woken[0].lease if woken else None
    return order


# --- arrival, queueing, release ---------------------------------------------


def test_admit_then_queue_then_wake_in_order():
    ctl = controller(make_policy(2))
    a, b, c = ticket(), ticket(), ticket()
    da, db, dc = (ctl.arrive(t, 0.0) for t in (a, b, c))
    assert isinstance(da, Admit) and isinstance(db, Admit) and isinstance(dc, Enqueue)
    assert dc.depth == 1 and dc.expected_wait_ms > 0 and dc.expires_at is None
    woken = ctl.release(da.lease, 1.0, Outcome.SUCCESS, 900.0)
    assert admitted_ids(woken) == [c.id] and woken[0].lease.queue_ms == 1000.0
    assert ctl.statistics(1.0)["inflight_requests"] == 2


def test_a_lease_is_released_exactly_once():
    ctl = controller()
    d = ctl.arrive(ticket(), 0.0)
    ctl.release(d.lease, 1.0, Outcome.ERROR)
    with pytest.raises(LeaseError):
        ctl.release(d.lease, 2.0, Outcome.SUCCESS, 5.0)
    assert ctl.capacity.used == [0]


@given(st.lists(st.floats(1.0, 1e5), min_size=2, max_size=30))
def test_fcfs_mode_is_fcfs(expected):
    ctl = controller(make_policy(1, order="fcfs"))
    first = ctl.arrive(ticket(expected_ms=5.0), 0.0)
    queued = [ticket(expected_ms=e) for e in expected]
    for k, t in enumerate(queued):
        assert isinstance(ctl.arrive(t, k * 0.001), Enqueue)
    assert run_one_at_a_time(ctl, first, 1.0) == [t.id for t in queued]


@given(
    st.lists(st.tuples(st.integers(1, 10_000), st.integers(0, 20)), min_size=2, max_size=25),
    st.integers(0, 2000),
)
def test_sjf_admission_order_matches_the_aging_formula(items, aging):
    """All queued before the first release at t=100 s: each admission takes the smallest
    expected_ms - aging * waited at that instant (ties: arrival order)."""
    ctl = controller(make_policy(1, aging_ms_per_s=float(aging)))
    items = sorted(items, key=lambda it: it[1])
    first = ctl.arrive(ticket(), 0.0)
    queued = []
    for expected, at in items:
        t = ticket(expected_ms=float(expected))
        ctl.arrive(t, float(at))
        queued.append((t, float(at)))
    now = 100.0

    # expected_ms - aging_ms_per_s * waited_s, in integers (exact), ties by arrival
    def key(q):
        return (int(q[0].expected_ms) - aging * int(now - q[1]), q[1])

    expected_order = [t.id for t, _ in sorted(queued, key=key)]
    assert run_one_at_a_time(ctl, first, now - 1.0, step=0.0) == expected_order


def test_shortest_job_first_without_aging():
    ctl = controller(make_policy(1, aging_ms_per_s=0.0))
    first = ctl.arrive(ticket(), 0.0)
    long, short, mid = ticket(expected_ms=3000), ticket(expected_ms=50), ticket(expected_ms=400)
    for t in (long, short, mid):
        ctl.arrive(t, 0.0)
    assert run_one_at_a_time(ctl, first, 0.0) == [short.id, mid.id, long.id]


def test_strict_class_order():
    ctl = controller(make_policy(1))
    first = ctl.arrive(ticket("batch"), 0.0)
    b, i, r = ticket("batch", 1.0), ticket("interactive", 500.0), ticket("realtime", 9000.0)
    for t in (b, i, r):
        ctl.arrive(t, 0.0)
    assert run_one_at_a_time(ctl, first, 0.0, step=0.001) == [r.id, i.id, b.id]


def test_weighted_classes_share_by_weight():
    classes = {
        "gold": ClassPolicy(priority=0, weight=3, max_queue_length=10_000, max_queue_wait_ms=86_400_000),
        "bronze": ClassPolicy(priority=1, weight=1, max_queue_length=10_000, max_queue_wait_ms=86_400_000),
    }
    pol = make_policy(1, class_mode="weighted", classes=classes)
    pol = msgspec.structs.replace(pol, scheduling=msgspec.structs.replace(pol.scheduling, default_class="gold"))
    ctl = controller(pol)
    first = ctl.arrive(ticket("gold"), 0.0)
    klass = {}
    for _ in range(2000):
        for name in ("gold", "bronze"):
            t = ticket(name)
            klass[t.id] = name
            ctl.arrive(t, 0.0)
    order = run_one_at_a_time(ctl, first, 0.0, step=0.0)[:2000]  # both classes stay backlogged
    gold = sum(klass[i] == "gold" for i in order)
    assert gold == 1500  # exactly 3:1 (smooth weighted round robin, exact integers)


def test_reserved_slots_let_realtime_skip_the_wait_and_only_realtime():
    ctl = controller(make_policy(3, reserved={"realtime": 1}))
    assert all(isinstance(ctl.arrive(ticket("batch"), 0.0), Admit) for _ in range(2))
    assert isinstance(ctl.arrive(ticket("batch"), 0.0), Enqueue)  # the third unit is reserved
    assert isinstance(ctl.arrive(ticket("interactive"), 0.0), Enqueue)
    assert isinstance(ctl.arrive(ticket("realtime"), 0.0), Admit)  # skips both waiting
    assert isinstance(ctl.arrive(ticket("realtime"), 0.0), Enqueue)  # reserve used up, pool held


def test_a_full_class_queue_is_a_class_queue_full_reject_with_retry_after():
    classes = {**default_classes(), "interactive": ClassPolicy(max_queue_length=2)}
    ctl = controller(make_policy(1, classes=classes))
    ctl.arrive(ticket(), 0.0)
    assert isinstance(ctl.arrive(ticket(), 0.0), Enqueue) and isinstance(ctl.arrive(ticket(), 0.0), Enqueue)
    verdict = ctl.arrive(ticket(), 0.0)
    # The class's own max_queue_length: its own reason, not the shedding rules' queue_full.
    assert isinstance(verdict, Reject) and verdict.reason is Reason.CLASS_QUEUE_FULL
    assert 500 <= verdict.retry_after_ms <= 60_000
    status, headers, _ = verdict.response()
    assert status == 503 and (b"x-rampmeter-reason", b"class_queue_full") in headers
    assert ctl.statistics()["counts"]["rejected"] == {"class_queue_full": 1} and ctl.depth("interactive") == 2


def test_zero_queue_length_means_admit_now_or_reject():
    classes = {**default_classes(), "interactive": ClassPolicy(max_queue_length=0)}
    ctl = controller(make_policy(1, classes=classes))
    assert isinstance(ctl.arrive(ticket(), 0.0), Admit)
    assert ctl.arrive(ticket(), 0.0).reason is Reason.CLASS_QUEUE_FULL


def test_an_overdue_request_goes_before_every_class():
    classes = {**patient_classes(), "batch": ClassPolicy(priority=2, max_queue_wait_ms=500)}
    ctl = controller(make_policy(1, classes=classes))
    first = ctl.arrive(ticket("realtime"), 0.0)
    old = ticket("batch", 50_000.0)
    ctl.arrive(old, 0.0)
    fresh = [ticket("realtime", 1.0) for _ in range(5)]
    for t in fresh:
        ctl.arrive(t, 0.4)
    woken = ctl.release(first.lease, 0.6, Outcome.SUCCESS, 600.0)
    assert admitted_ids(woken) == [old.id]


def test_cancel_leaves_the_queue_and_is_never_admitted():
    ctl = controller(make_policy(1))
    first = ctl.arrive(ticket(), 0.0)
    gone, stays = ticket(), ticket()
    ctl.arrive(gone, 0.0)
    ctl.arrive(stays, 0.0)
    assert ctl.cancel(gone.id, 0.5) and not ctl.cancel(gone.id, 0.5)
    assert ctl.depth("interactive") == 1
    assert admitted_ids(ctl.release(first.lease, 1.0, Outcome.SUCCESS, 5.0)) == [stays.id]
    assert not ctl.cancel(stays.id, 1.0)  # admitted: not queued any more
    assert ctl.statistics()["counts"]["abandoned"] == 1


def test_deadlines_expire_queued_tickets_and_are_never_admitted_late():
    ctl = controller(make_policy(1))
    first = ctl.arrive(ticket(), 0.0)
    soon = ticket(expected_ms=500.0, deadline=2.0)  # must start by 1.5
    later = ticket(expected_ms=500.0, deadline=10.0)
    assert ctl.arrive(soon, 0.0).expires_at == 1.5
    ctl.arrive(later, 0.0)
    assert ctl.next_expiry() == 1.5
    assert ctl.expire(1.4) == []
    expired = ctl.expire(1.5)
    assert [e.ticket.id for e in expired] == [soon.id] and expired[0].reason is Reason.DEADLINE_EXPIRED
    assert admitted_ids(ctl.release(first.lease, 3.0, Outcome.SUCCESS, 5.0)) == [later.id]


def test_dispatch_expires_instead_of_admitting_a_ticket_that_cannot_finish():
    ctl = controller(make_policy(1))
    first = ctl.arrive(ticket(), 0.0)
    doomed, ok = ticket(expected_ms=1000.0, deadline=1.5), ticket(expected_ms=2000.0)
    ctl.arrive(doomed, 0.0)
    ctl.arrive(ok, 0.0)
    woken = ctl.release(first.lease, 1.0, Outcome.SUCCESS, 5.0)  # 1.0 > 1.5 - 1.0
    assert [type(d) for d in woken] == [Expired, Admit] and woken[1].ticket.id == ok.id


def test_try_classes_wait_until_the_deadline_itself():
    classes = {**default_classes(), "batch": ClassPolicy(priority=2, on_unmeetable="try")}
    ctl = controller(make_policy(1, classes=classes))
    ctl.arrive(ticket(), 0.0)
    assert ctl.arrive(ticket("batch", 5000.0, deadline=3.0), 0.0).expires_at == 3.0


def test_a_past_deadline_is_rejected_at_arrival():
    verdict = controller().arrive(ticket(deadline=1.0), 1.0)
    assert verdict.reason is Reason.DEADLINE_EXPIRED


class _Gate:
    """A stand-in arrival gate that records what the controller hands it."""

    def __init__(self) -> None:
        self.seen: list = []
        self.dequeued_waits: list = []

    def __call__(self, t, now, load, service_ms):
        self.seen.append((t.klass, now, load, service_ms))
        return Reject(Reason.GPU_PRESSURE, 1000, "hot") if t.klass == "batch" else None

    def retry_after(self, wait_ms: float) -> int:
        return 4242

    def pushback(self, wait_ms: float, now: float, slot_ms: float, remaining_ms: float) -> int | None:
        return 4242

    def dequeued(self, klass: str, wait_ms: float, now: float) -> None:
        self.dequeued_waits.append((klass, wait_ms, now))


def test_the_gate_judges_arrivals_from_the_load_estimator_and_hears_of_every_dequeue():
    gate = _Gate()
    ctl = AdmissionController(make_policy(1), rng=random.Random(0), gate=gate)
    assert ctl.arrive(ticket("batch"), 3.0) == Reject(Reason.GPU_PRESSURE, 1000, "hot")
    assert [(k, now, load) for k, now, load, _ in gate.seen] == [("batch", 3.0, ctl.load)]
    assert gate.seen[0][3] == 100.0  # the ticket's expected time: no observed p99, no floor
    first = ctl.arrive(ticket("interactive"), 3.0)
    assert isinstance(first, Admit) and first.lease.service_ms == 100.0  # handed on in the lease
    queued = ctl.arrive(ticket("interactive"), 3.0)
    assert isinstance(queued, Enqueue) and gate.dequeued_waits == [("interactive", 0.0, 3.0)]
    woken = ctl.release(first.lease, 3.5, Outcome.SUCCESS, 500.0)
    assert [type(d) for d in woken] == [Admit] and gate.dequeued_waits[-1] == ("interactive", 500.0, 3.5)


def test_token_limits_and_oversized_requests():
    ctl = controller(make_policy(1000, unit="tokens"))
    a = ctl.arrive(ticket(units=600), 0.0)
    assert isinstance(a, Admit) and a.lease.units == 600
    assert isinstance(ctl.arrive(ticket(units=500), 0.0), Enqueue)
    huge = ticket(units=50_000)  # more than the whole limit: runs alone, charged the limit
    ctl.arrive(huge, 0.0)
    woken = ctl.release(a.lease, 1.0, Outcome.SUCCESS, 5.0)
    assert [d.lease.units for d in woken] == [500]  # SJF by expected time, all 100 ms: arrival order
    woken = ctl.release(woken[0].lease, 2.0, Outcome.SUCCESS, 5.0)
    assert [(d.ticket.id, d.lease.units) for d in woken] == [(huge.id, 1000)]


def test_refused_upstreams_cool_down_and_least_outstanding_wins():
    ctl = controller(make_policy(4, upstreams=2))
    first = ctl.arrive(ticket(), 0.0)
    second = ctl.arrive(ticket(), 0.0)
    assert {first.lease.upstream, second.lease.upstream} == {0, 1}
    ctl.release(first.lease, 1.0, Outcome.REFUSED)
    bad = first.lease.upstream
    for _ in range(3):
        assert ctl.arrive(ticket(), 1.5).lease.upstream != bad


def test_capacity_factor_closes_and_reopens_an_upstream():
    ctl = controller(make_policy(2))
    ctl.set_capacity_factor(0, 0.0, 0.0)
    t = ticket()
    assert isinstance(ctl.arrive(t, 0.0), Enqueue)
    assert admitted_ids(ctl.set_capacity_factor(0, 0.5, 1.0)) == [t.id]


def test_success_feeds_the_limit_and_the_service_model():
    ctl = controller(make_policy(10, kind="gradient"))
    cost = ctl.estimate("/v1/chat/completions", b'{"messages":[{"role":"user","content":"hello"}],"max_tokens":100}')
    t = ctl.ticket("interactive", cost)
    d = ctl.arrive(t, 0.0)
    ctl.release(d.lease, 1.0, Outcome.SUCCESS, 400.0, Observed(prompt_tokens=2, output_tokens=20))
    stats = ctl.statistics(1.0)
    model = stats["models"]["/v1/chat/completions"]
    assert model["samples"] == 1 and model["output_fill_ratio"] < 0.5
    assert stats["upstreams"][0]["limit_samples"] == 1


def test_expected_wait_grows_with_the_work_ahead():
    ctl = controller(make_policy(1, order="fcfs"))
    assert ctl.load.expected_wait_ms("interactive", 100.0, 0.0) == 0.0
    ctl.arrive(ticket(expected_ms=100.0), 0.0)
    waits = []
    for _ in range(4):
        waits.append(ctl.load.expected_wait_ms("interactive", 100.0, 0.0))
        ctl.arrive(ticket(expected_ms=100.0), 0.0)
    assert waits == [50.0, 150.0, 250.0, 350.0]  # residual half of the running one, then 100 each
    assert ctl.load.expected_wait_ms("realtime", 100.0, 0.0) == 50.0  # strict: nothing ahead of realtime


def test_a_long_request_expects_the_short_ones_that_will_arrive_ahead_of_it():
    """SJF: shorter work arriving while a request waits is served first. A stream of short requests
    using half the parallelism doubles a long request's expected wait (1 / (1 - 0.5)); a short one
    is not stretched by the long ones, nor the whole queue's wait (expected inf: Retry-After's)."""
    ctl = controller(make_policy(2))
    ctl.arrive(ticket(expected_ms=1000.0), 0.0)
    ctl.arrive(ticket(expected_ms=1000.0), 0.0)  # both slots taken: 1,000 ms of work in flight each
    for i in range(400):  # 100 ms of short work every 0.1 s: 1,000 ms/s, half of 2 slots
        ctl.load.accepted(ticket(expected_ms=100.0), i / 10.0)
    now = 40.0
    base = (1000.0 + 2000.0 / 2) / 2  # a queued long's worth ahead, plus half the work in flight, over 2
    ctl.arrive(ticket(expected_ms=1000.0), now)
    assert ctl.load.sjf_stretch("interactive", now, 1000.0) == pytest.approx(2.0, rel=0.05)
    assert ctl.load.expected_wait_ms("interactive", 1000.0, now) == pytest.approx(2 * base, rel=0.05)
    assert ctl.load.sjf_stretch("interactive", now, 100.0) == 1.0
    assert ctl.load.sjf_stretch("interactive", now, float("inf")) == 1.0
    fcfs = controller(make_policy(2, order="fcfs"))
    for i in range(400):
        fcfs.load.accepted(ticket(expected_ms=100.0), i / 10.0)
    assert fcfs.load.sjf_stretch("interactive", now, 1000.0) == 1.0  # FCFS: nobody overtakes


def test_the_sjf_stretch_stops_at_the_starvation_bounds_promise():
    """A request overtaken for fcfs_wait_multiple x its FCFS wait goes to the front (proxy/core/sjf.py): the
    estimate never exceeds that (a closed loop at capacity reads rho ~ 1 for a larger bucket), nor falls
    below the unstretched one."""
    ctl = controller(make_policy(1, fcfs_wait_multiple=2.0))
    ctl.arrive(ticket(expected_ms=1000.0), 0.0)  # in flight
    for i in range(400):  # 100 ms of short work every 0.1 s: all of the one slot (rho capped at 0.95)
        ctl.load.accepted(ticket(expected_ms=100.0), i / 10.0)
    now = 40.0
    ctl.arrive(ticket(expected_ms=1000.0), now)
    assert ctl.load.sjf_stretch("interactive", now, 1000.0) == pytest.approx(20.0, rel=0.05)
    fcfs_wait = ctl.load.fcfs_wait_ms(now)  # 1,000 queued + 500 residual
    assert ctl.load.expected_wait_ms("interactive", 1000.0, now) == pytest.approx(2 * fcfs_wait)


def test_the_deadline_rule_keeps_a_request_fcfs_would_finish_in_time():
    """The SJF stretch may say no where the starvation bound's promise says yes: a request FCFS would
    finish within its deadline falls due in time to be served in time (ArrivalGate.deadline_verdict)."""
    from proxy.core import deadline as dl
    from proxy.core.arrival import ArrivalGate
    from proxy.policy import shedding as shedding_policy

    policy = make_policy(1, fcfs_wait_multiple=2.0)
    ctl = controller(policy)
    gate = ArrivalGate(policy, shedding_policy.shedder(policy.shedding, 3, random.Random(0)), None)
    ctl.arrive(ticket(expected_ms=1000.0), 0.0)  # in flight
    ctl.arrive(ticket(expected_ms=1000.0), 0.0)  # queued
    for i in range(400):  # short work enough to fill the one slot: the stretch is at its cap
        ctl.load.accepted(ticket(expected_ms=100.0), i / 10.0)
    now = 40.0
    assert ctl.load.expected_wait_ms("interactive", 1000.0, now) == pytest.approx(3000.0)  # 2 x FCFS's 1,500
    assert ctl.load.promised_wait_ms("interactive", now) == pytest.approx(1500.0)
    fits = ticket(expected_ms=1000.0, deadline=now + 3.0)  # FCFS: 1,500 + 1,000 <= 3,000
    assert type(gate.deadline_verdict(fits, now, ctl.load, 1000.0)) is dl.Meetable
    late = ticket(expected_ms=1000.0, deadline=now + 2.4)  # FCFS: 2,500 > 2,400
    assert type(gate.deadline_verdict(late, now, ctl.load, 1000.0)) is dl.Unmeetable
    fcfs = controller(make_policy(1, order="fcfs", fcfs_wait_multiple=2.0))
    assert fcfs.load.promised_wait_ms("interactive", now) is None  # FCFS order: its own estimate is FCFS's


def test_statistics_report_what_shedding_needs():
    ctl = controller(make_policy(1))
    lease = ctl.arrive(ticket(), 0.0).lease
    ctl.arrive(ticket("batch"), 0.0)
    ctl.arrive(ticket("realtime"), 1.0)
    stats = ctl.statistics(2.0)
    assert stats["queued_by_class"] == (1, 0, 1) and stats["head_wait_ms"] == 2000.0
    assert stats["queue_growing"] and stats["queue_growth_per_s"] > 0
    ctl.release(lease, 2.0, Outcome.SUCCESS, 5.0)
    assert ctl.statistics(2.0)["drain_rate_per_s"] > 0
    assert "AdmissionController" in repr(ctl)


def test_resolve_class():
    ctl = controller()
    assert ctl.resolve_class(b"Realtime ") == ("realtime", True)
    assert ctl.resolve_class(None) == ("interactive", True)
    assert ctl.resolve_class("platinum") == ("interactive", False)


# --- reload -----------------------------------------------------------------


def test_reload_keeps_queued_tickets_and_rekeys_them():
    ctl = controller(make_policy(1, aging_ms_per_s=0.0))
    first = ctl.arrive(ticket(), 0.0)
    long, short = ticket(expected_ms=900.0), ticket(expected_ms=10.0)
    ctl.arrive(long, 0.0)
    ctl.arrive(short, 1.0)
    assert ctl.apply_policy(make_policy(1, order="fcfs"), 2.0) == []
    assert run_one_at_a_time(ctl, first, 2.0) == [long.id, short.id]


def test_reload_moves_tickets_of_a_removed_class_to_the_default_and_recounts_leases():
    ctl = controller(make_policy(1))
    lease = ctl.arrive(ticket("batch", units=300), 0.0).lease
    orphan = ticket("batch")
    ctl.arrive(orphan, 0.0)
    classes = {"interactive": ClassPolicy()}
    woken = ctl.apply_policy(make_policy(1000, unit="tokens", classes=classes), 1.0)
    assert admitted_ids(woken) == [orphan.id] and woken[0].ticket.klass == "interactive"
    assert ctl.capacity.used == [301]  # the old lease re-counted in tokens, plus the new one
    ctl.release(lease, 2.0, Outcome.SUCCESS, 5.0)
    assert ctl.capacity.used == [1]


# --- invariants under random operation sequences -----------------------------

ops = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "release", "cancel", "tick", "expire"]),
        st.integers(0, 1000),
        st.sampled_from(["realtime", "interactive", "batch"]),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(
    ops,
    st.integers(1, 6),
    st.sampled_from(["requests", "tokens"]),
    st.booleans(),
    st.integers(1, 3),
)
def test_inflight_never_exceeds_the_limit_and_overdue_entries_go_first(steps, limit, unit, reserve, upstreams):
    scale = 100 if unit == "tokens" else 1
    reserved = {"realtime": scale} if reserve and limit >= 2 else {}
    classes = {n: msgspec.structs.replace(c, max_queue_wait_ms=300) for n, c in default_classes().items()}
    ctl = controller(make_policy(limit * scale, unit=unit, reserved=reserved, classes=classes, upstreams=upstreams))
    now, leases = 0.0, []

    def check(admits):
        for d in admits:
            if isinstance(d, Expired):  # its deadline or wait bound came while it waited: no lease, no room
                assert d.ticket.id not in ctl.waitline.entries
                continue
            i = d.lease.upstream
            assert ctl.capacity.used[i] <= ctl.capacity.limit(i)
            g = ctl.capacity.general[i]
            assert g <= max(0, ctl.capacity.limit(i) - sum(reserved.values()))
            leases.append(d.lease)

    for op, n, klass in steps:
        if op == "arrive":
            # Entries held for their unjudged route's first answer (unjudged_in_flight) may be passed.
            overdue = [
                e for e in ctl.waitline.entries.values() if now >= e.enqueued_at + 0.3 and not ctl._held_entry(e)
            ]
            d = ctl.arrive(
                ticket(
                    klass,
                    float(n + 1),
                    units=n // 10 + 1,
                    deadline=now + n / 100 if n % 3 == 0 else math.inf,
                ),
                now,
            )
            if isinstance(d, Admit):
                assert not overdue or klass in reserved  # nobody overtakes an overdue entry in the pool
                check([d])
            check(ctl.take_woken())
        elif op == "release" and leases:
            lease = leases.pop(n % len(leases))
            woken = ctl.release(lease, now, random.Random(n).choice(list(Outcome)), float(n))
            if not reserved and woken and isinstance(woken[0], Admit):
                oldest_overdue = min(
                    (
                        e.enqueued_at
                        for e in ctl.waitline.entries.values()
                        if now >= e.enqueued_at + 0.3 and not ctl._held_entry(e)
                    ),
                    default=None,
                )
                assert (
                    oldest_overdue is None
                    or woken[0].lease.admitted_at - woken[0].lease.queue_ms / 1000 <= oldest_overdue + 1e-9
                )
            check(woken)
        elif op == "cancel" and ctl.waitline.entries:
            ctl.cancel(sorted(ctl.waitline.entries)[n % len(ctl.waitline.entries)], now)
            check(ctl.take_woken())
        elif op == "tick":
            now += n / 1000.0
        elif op == "expire":
            for e in ctl.expire(now):
                assert e.ticket.deadline != math.inf
            check(ctl.take_woken())
        assert ctl.capacity.used == [
            sum(ctl._charges[lz.id] for lz in leases if lz.upstream == i) for i in range(upstreams)
        ]
        assert sum(ctl.capacity.requests) == len(leases)
    for lease in leases:  # every lease ends exactly once and nothing leaks
        ctl.release(lease, now, Outcome.CANCELLED)
    ctl.take_woken()
    assert sum(ctl.capacity.used) == sum(ctl._charges.values())


def test_a_ticket_that_cannot_afford_to_wait_is_unmeetable():
    ctl = controller(make_policy(1))
    ctl.arrive(ticket(), 0.0)
    alone = ctl.arrive(ticket(expected_ms=1000.0, deadline=0.5), 0.0)  # nobody queued yet
    assert alone.reason is Reason.DEADLINE_UNMEETABLE
    ctl.arrive(ticket(), 0.0)
    behind = ctl.arrive(ticket(expected_ms=1000.0, deadline=0.5), 0.0)  # others queued: via a round
    assert behind.reason is Reason.DEADLINE_UNMEETABLE and ctl.depth("interactive") == 1
    assert isinstance(ctl.arrive(ticket("realtime", 1000.0, deadline=0.5), 0.0), Reject)


def test_a_tight_deadline_still_gets_a_free_reserved_slot():
    ctl = controller(make_policy(2, reserved={"realtime": 1}))
    ctl.arrive(ticket(), 0.0)
    ctl.arrive(ticket(), 0.0)  # waits: the second unit is realtime's
    tight = ctl.arrive(ticket("realtime", 1000.0, deadline=0.5), 0.0)  # cannot wait, need not
    assert isinstance(tight, Admit)


def test_a_drop_backs_the_limit_off_even_without_a_latency():
    ctl = controller(make_policy(10, kind="gradient", backoff_ratio=0.5))
    ctl.release(ctl.arrive(ticket(), 0.0).lease, 1.0, Outcome.DROPPED)
    assert ctl.capacity.limit(0) == 5 and ctl.capacity.limits[0].last_reason == "drop"


def test_randomness_is_injected():
    with pytest.raises(ValueError):
        AdmissionController(make_policy())
    shared = controller().balancer
    assert AdmissionController(make_policy(), balancer=shared).balancer is shared


def test_the_load_snapshot_gives_each_class_its_own_oldest_wait_and_every_rule_reads_it():
    from proxy.core.arrival import ranked_classes
    from proxy.core.retry_after import RetryAfter
    from proxy.core.shedding import ShedConfig, Shedder, class_weights

    pol = make_policy(1)
    ctl = controller(pol)
    assert isinstance(ctl.arrive(ticket(), 0.0), Admit)
    ctl.arrive(ticket("batch"), 0.0)
    ctl.arrive(ticket("interactive"), 0.2)
    ranked = ranked_classes(pol)
    snap = ctl.load.snapshot(0.5, ranked, gpu_memory_fraction=0.1)
    assert ranked == ("realtime", "interactive", "batch")
    assert snap.queued_by_class == (0, 1, 1) and snap.gpu_memory_fraction == 0.1
    assert snap.head_wait_by_class == pytest.approx((0.0, 300.0, 500.0)) and snap.head_wait_ms == pytest.approx(500.0)
    assert (snap.inflight, snap.limit) == (1, 1)
    # The default rules (saturation is opt-in; nothing has drained yet, so it would fire).
    every_rule = Shedder(
        ShedConfig(
            weights=class_weights(3, 0.25), saturation_growth_ratio=None, codel_target_ms=100.0, codel_interval_ms=100.0
        ),
        RetryAfter(100, 30_000, 0.0, random.Random(0)),
    )
    assert every_rule.check(snap, 0, 0.5) is None
    later = ctl.load.snapshot(0.7, ranked)  # a full interval above target for batch and interactive
    assert every_rule.check(later, 0, 0.7) is None
    assert every_rule.check(later, 1, 0.7).reason is Reason.OVERLOADED


def test_under_strict_priority_a_lower_class_wait_is_stretched_by_the_work_arriving_above_it():
    pol = make_policy(1, classes={**default_classes(), "interactive": ClassPolicy(priority=1, max_queue_length=10_000)})
    ctl = controller(pol)
    for i in range(250):  # 50 s (5 time constants) of interactive arrivals, 5 a second, 100 ms of work each
        ctl.arrive(ticket("interactive", 100.0), i * 0.2)
    now = 50.0
    assert ctl.load.overtaking_factor("batch", now) == pytest.approx(2.0, rel=0.1)  # half the slot: 1 / (1 - 0.5)
    assert ctl.load.overtaking_factor("interactive", now) == 1.0 and ctl.load.overtaking_factor("realtime", now) == 1.0
    assert ctl.load.expected_wait_ms("batch", 100.0, now) > 1.8 * ctl.load.expected_wait_ms("interactive", 100.0, now)
    for i in range(400):  # then 20 a second: more than the slot can take
        ctl.arrive(ticket("interactive", 100.0), now + i * 0.05)
    assert ctl.load.overtaking_factor("batch", now + 20.0) == pytest.approx(20.0)  # capped at MAX_RHO = 0.95
    weighted = controller(make_policy(1, class_mode="weighted"))
    weighted.arrive(ticket("interactive", 100.0), 0.0)
    weighted.arrive(ticket("interactive", 100.0), 0.0)
    assert weighted.load.overtaking_factor("batch", 0.0) == 1.0  # no strict order: nobody overtakes for sure


def test_the_expiry_heap_stays_bounded_while_the_queue_stays_short():
    """Requests that queue briefly and are admitted long before their expiry used to leave their
    item in the waitline's expiry heap (only pop_due, run when a wait expires, trimmed it): a sidecar
    at its limit with deadlines met kept one item, ticket and cost per queued request for as long as
    it ran (20,001 items after 20,000 requests in the audit's run, ~570 B each). Now compacted out."""
    ctl = controller(make_policy(2))
    for _ in range(40):  # completed samples: the route is judged, so deadline tickets are not held as probes
        ctl.release(ctl.arrive(ticket(), 0.0).lease, 0.01, Outcome.SUCCESS, 10.0)
    ctl.flush()
    running = [ctl.arrive(ticket(deadline=30.0), 0.0).lease, ctl.arrive(ticket(deadline=30.0), 0.0).lease]
    now = 0.0
    for _ in range(5_000):  # always one queued: each arrival waits for the next release
        now += 0.005
        assert isinstance(ctl.arrive(ticket(deadline=now + 30.0), now), Enqueue)
        woken = ctl.release(running.pop(0), now, Outcome.SUCCESS, 10.0)
        running += [d.lease for d in woken if isinstance(d, Admit)]
    assert len(ctl.waitline) == 0
    assert len(ctl.waitline._expiry) <= 2 * len(ctl.waitline) + 64
