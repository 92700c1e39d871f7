"""Shedding in the backend's own time scale (issue 12 item 1): CoDel retuned to the observed
service time, and never shedding what the queue would drain within its deadline. Pure core,
hand-advanced clock, Hypothesis."""

from __future__ import annotations

import heapq
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core import deadline as dl
from proxy.core.admission import AdmissionController
from proxy.core.arrival import ArrivalGate
from proxy.core.codel import CoDel, Mode
from proxy.core.decisions import Admit, Enqueue, Outcome
from proxy.core.shedding import LoadSnapshot, arrival_verdict
from proxy.core.wire import Reason
from proxy.policy import shedding as shedding_policy
from proxy.policy.admission import ClassPolicy, Limits, Route, Scheduling
from proxy.policy.schema import Policy, Upstream
from proxy.policy.shedding import Shedding
from tests.core.test_shedding import make


def test_retune_moves_the_target_at_once_and_regrids_the_interval_from_the_running_one():
    codel = CoDel(50.0, 100.0)
    codel.observe(80.0, 0.00)
    codel.observe(80.0, 0.05)
    assert codel.retune(100.0, 1000.0, 0.05)  # the running interval [0, 0.1) now ends at 1.0
    codel.observe(80.0, 0.5)
    assert codel.mode is Mode.NORMAL and codel.statistics().intervals_above == 0
    codel.observe(150.0, 1.0)  # [0, 1.0) closes: min 80 <= 100
    assert codel.mode is Mode.NORMAL and codel.statistics().intervals_below == 1
    assert not codel.retune(105.0, 1050.0, 1.0)  # under 10%: ignored, no re-grid
    codel.observe(150.0, 1.5)
    codel.observe(150.0, 2.0)  # [1.0, 2.0) closes: min 150 > 100
    assert codel.dropping


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 5000),
            st.floats(0, 0.7),
            st.one_of(st.none(), st.tuples(st.floats(0, 500), st.floats(1, 3000))),
        ),
        max_size=60,
    )
)
def test_retuning_at_any_time_keeps_the_books(events):
    codel, now, judged = CoDel(50.0, 100.0), 0.0, 0
    for wait, dt, tune in events:
        now += dt
        if tune is not None:
            codel.retune(tune[0], max(tune[1], tune[0]), now)
        codel.observe(wait, now)
        s = codel.statistics()
        assert s.intervals_above + s.intervals_below >= judged  # nothing un-judged
        judged = s.intervals_above + s.intervals_below
        assert codel._next_end > now  # the running interval holds `now`
        assert codel.dropping == (s.mode is Mode.DROPPING)


def test_target_and_interval_follow_the_service_time_with_the_policy_values_as_floors():
    shedder = make(
        codel_target_ms=5.0, codel_interval_ms=100.0, codel_target_p50_ratio=0.5, codel_interval_p99_ratio=1.0
    )
    assert shedder.codel_scale(0.0, 0.0) == (5.0, 100.0)  # nothing observed yet: the floors
    assert shedder.codel_scale(2000.0, 9000.0) == (1000.0, 9000.0)  # a serial LLM: seconds
    assert shedder.codel_scale(4.0, 30.0) == (5.0, 100.0)  # a fast backend: the floors hold
    shedder.check(LoadSnapshot((0, 0, 0), service_p50_ms=2000.0, service_p99_ms=9000.0), 0, 0.0)
    stats = shedder.statistics()
    assert (stats.codel_target_ms, stats.codel_interval_ms) == (1000.0, 9000.0)


def test_a_dropping_codel_spares_an_arrival_whose_deadline_the_queue_drains_within():
    shedder = make(codel_target_ms=50.0, codel_interval_ms=100.0, max_queued=None, gpu_memory_high_water=None)
    standing = LoadSnapshot((0, 5, 0), head_wait_by_class=(0.0, 900.0, 0.0), drain_rate_per_s=10.0)
    for i in range(20):
        shedder.check(standing, 1, i * 0.01)
    assert shedder.codels[1].dropping
    meetable = dl.Meetable(completion=5.0, slack_ms=100.0)
    assert arrival_verdict(shedder, standing, 1, 0.2, meetable) is None
    assert shedder.statistics().codel_spared == 1
    missed = dl.Unmeetable(completion=5.0, miss_ms=10.0, retry_after_ms=50.0)
    shed = arrival_verdict(shedder, standing, 1, 0.2, missed)
    assert shed is not None and shed.reason is Reason.OVERLOADED  # CoDel first: it stands
    no_deadline = dl.Meetable(float("inf"), float("inf"))  # nothing to drain within: judged as before
    assert arrival_verdict(shedder, standing, 2, 0.2, no_deadline) is not None


def closed_loop_policy(limit: int, service_ms: float) -> Policy:
    return Policy(
        upstreams=[Upstream(url="http://127.0.0.1:8000")],
        routes=[Route(path_prefix="/", kind="fixed", base_ms=service_ms, ms_per_prompt_token=0.0)],
        classes={"chat": ClassPolicy(max_queue_length=1000, max_queue_wait_ms=86_400_000)},
        scheduling=Scheduling(default_class="chat"),
        limits=Limits(kind="fixed", initial_limit=limit, min_limit=1),
        shedding=Shedding(),  # the defaults: queue_length, gpu_memory, codel, in the service time's scale
    )


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 8),
    st.integers(1, 3),
    st.floats(5.0, 5000.0),
    st.floats(1.0, 3.0),
    st.integers(0, 10_000),
)
def test_a_closed_loop_the_queue_holds_within_its_deadlines_is_never_shed(n, limit, s_max, spread, seed):
    """N clients, each sending again the moment it is answered, service times in [s_max/spread, s_max],
    budgets (m x N / limit + 2) x s_max: whatever the scale (5 ms .. 5 s) nothing is rejected.

    m is the starvation bound (scheduling.fcfs_wait_multiple): SJF may let a request wait up to m
    times its FCFS wait, and does here, since identical requests that arrive once the model has
    learned they are shorter than its prior rank ahead of those that arrived before (seed 26, n 8)."""
    rng = random.Random(seed)
    policy = closed_loop_policy(limit, s_max)
    service = shedding_policy.latency_family(policy.latency)
    shedder = shedding_policy.shedder(policy.shedding, 1, random.Random(seed))
    gate = ArrivalGate(policy, shedder, None)
    ctl = AdmissionController(policy, rng=random.Random(seed), gate=gate, service=service)
    budget_ms = (policy.scheduling.fcfs_wait_multiple * n / limit + 2) * s_max
    cost = ctl.estimate("/", b"")
    running: list = []  # (finish time, seq, lease, service ms)
    seq, now, served = 0, 0.0, 0

    def start(decision) -> None:
        nonlocal seq
        ms = rng.uniform(s_max / spread, s_max)
        seq += 1
        heapq.heappush(running, (now + ms / 1000.0, seq, decision.lease, ms))  # CoDel saw the wait: the gate

    def send() -> None:
        t = ctl.ticket("chat", cost, now + budget_ms / 1000.0, int(budget_ms), now=now)
        d = ctl.arrive(t, now)
        assert isinstance(d, Admit | Enqueue), (d, n, limit, s_max)
        if isinstance(d, Admit):
            start(d)
        for w in ctl.take_woken():
            assert isinstance(w, Admit), w
            start(w)

    for _ in range(n):
        send()
    while served < 30 * n:
        now, _, lease, ms = heapq.heappop(running)
        service.record(("/", 0), ms, now)
        for w in ctl.release(lease, now, Outcome.SUCCESS, ms) + ctl.expire(now):
            assert isinstance(w, Admit), w
            start(w)
        served += 1
        send()
    assert sum(ctl.rejected.values()) == 0 and ctl.counts["expired"] == 0
