"""A censored floor's half-open state: probes (round 1's defect on vLLM, issue 12 item 2).

A backend slower than the deadlines for a while, then fast again: every request is cut, the cuts
raise the shape's floor, and from then on the floor turns the shape away at arrival. Before the
probes nothing was let through that could show the floor stale: it went only as it faded on the
clock (round 1: 48 of 48 long requests rejected on vLLM after it recovered). Pure core, the
controller and its arrival gate driven by a simulated backend on a hand-advanced clock.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.admission import AdmissionController
from proxy.core.arrival import ArrivalGate
from proxy.core.censored import INFLATE, PROBE_MAX_SPACING, CensoredFloors, shape_bucket
from proxy.core.decisions import Admit, Lease, Outcome, Reject
from proxy.core.wire import Reason
from proxy.policy import shedding as shedding_policy
from proxy.policy.admission import Limits, Route, Scheduling
from proxy.policy.schema import Policy, Upstream
from proxy.policy.shedding import Shedding

BUDGET_MS = 300.0
FAST_MS = 100.0  # the backend's service time when healthy: well inside the budget
SLOW_MS = 1000.0  # when slow: every request is cut at its deadline
BODY = b'{"input": "' + b"x" * 800 + b'"}'


def controller() -> AdmissionController:
    policy = Policy(
        upstreams=[Upstream(url="http://127.0.0.1:8000")],
        routes=[Route(path_prefix="/embeddings", kind="embeddings", base_ms=5.0, ms_per_prompt_token=0.02)],
        scheduling=Scheduling(default_class="interactive"),
        limits=Limits(kind="fixed", initial_limit=64, min_limit=1),
        shedding=Shedding(rules=[]),
    )
    service = shedding_policy.latency_family(policy.latency)
    gate = ArrivalGate(policy, shedding_policy.shedder(policy.shedding, 3, random.Random(0)), None)
    ctl = AdmissionController(policy, rng=random.Random(0), gate=gate, service=service)
    ctl.learn_probe("/embeddings", BODY, FAST_MS, 0.0)  # warm-up judged the route: no first-answer hold
    return ctl


class Backend:
    """Requests admitted before `slow_from` or at/after `fast_from` take FAST_MS, the others SLOW_MS;
    one slower than its budget is cut at its deadline (the sidecar's scope), as on a real server."""

    def __init__(self, ctl: AdmissionController, slow_from: float, fast_from: float) -> None:
        self.ctl, self.slow_from, self.fast_from = ctl, slow_from, fast_from
        self.events: list[tuple[float, int, Lease, bool]] = []  # (when, order, lease, completed)
        self.order = itertools.count()
        self.log: list[tuple[float, str]] = []  # (arrival, "admit" | reason)
        self.completed: list[tuple[float, float]] = []  # (admitted at, completed at)
        self.cut: list[float] = []  # cut at

    def service_ms(self, at: float) -> float:
        return SLOW_MS if self.slow_from <= at < self.fast_from else FAST_MS

    def run_until(self, now: float) -> None:
        while self.events and self.events[0][0] <= now:
            when, _, lease, done = heapq.heappop(self.events)
            rtt = (when - lease.admitted_at) * 1000.0
            self.ctl.release(lease, when, Outcome.SUCCESS if done else Outcome.CANCELLED, rtt)
            if done:
                self.completed.append((lease.admitted_at, when))
            else:
                self.cut.append(when)

    def arrive(self, now: float) -> None:
        self.run_until(now)
        ctl = self.ctl
        t = ctl.ticket(
            "interactive", ctl.estimate("/embeddings", BODY), now + BUDGET_MS / 1000, int(BUDGET_MS), now=now
        )
        d = ctl.arrive(t, now)
        assert not isinstance(d, Reject) or d.reason is Reason.DEADLINE_UNMEETABLE, d
        assert isinstance(d, Admit | Reject), d  # a limit of 64: nothing queues here
        if isinstance(d, Reject):
            self.log.append((now, d.reason.value))
            return
        self.log.append((now, "admit"))
        ms = self.service_ms(now)
        done = ms <= BUDGET_MS
        heapq.heappush(self.events, (now + min(ms, BUDGET_MS) / 1000, next(self.order), d.lease, done))


def run(gaps: list[float], slow_from: float, fast_from: float, horizon: float) -> Backend:
    """Arrivals `gaps` apart (cycled) until `horizon`, then every request ends."""
    backend = Backend(controller(), slow_from, fast_from)
    now = 0.0
    for gap in itertools.cycle(gaps):
        if now >= horizon:
            break
        backend.arrive(now)
        now += gap
    backend.run_until(now + 10.0)
    return backend


WARM = 1.5  # fast until then: the model learns FAST_MS from completions
gaps_strategy = st.lists(st.floats(0.01, 0.12), min_size=1, max_size=50)


@settings(max_examples=60, deadline=None)
@given(gaps_strategy, st.floats(0.3, 8.0))
def test_a_backend_that_recovers_is_relearnt_by_one_probe_within_a_bounded_time(gaps, slow_s) -> None:
    recovered = WARM + slow_s
    end = recovered + 5.0
    b = run(gaps, WARM, recovered, end)
    assert b.cut, "the slow spell cut requests"
    budget_s = BUDGET_MS / 1000
    relearnt = min((done for admitted, done in b.completed if admitted >= recovered), default=math.inf)
    # The probe due last before the recovery is cut by then + a budget; the next waits at most
    # PROBE_MAX_SPACING cut times, then an arrival (gaps <= 0.12 s) goes as the probe and completes.
    bound = recovered + budget_s + PROBE_MAX_SPACING * budget_s + 0.12 + FAST_MS / 1000
    if end > bound + 0.5:
        assert relearnt <= bound
    # one probe re-learns it: nothing of the shape is admitted after the recovery before it answers
    admitted_after = [at for at, what in b.log if what == "admit" and recovered <= at < relearnt - FAST_MS / 1000]
    assert len(admitted_after) <= 1, admitted_after
    # and once re-learnt, every request that can meet its deadline is admitted: none is turned away
    assert all(what == "admit" for at, what in b.log if at >= relearnt), [x for x in b.log if x[0] >= relearnt][:5]


@settings(max_examples=60, deadline=None)
@given(gaps_strategy)
def test_a_backend_that_stays_slow_keeps_getting_unmeetable_with_only_the_probe_trickle_forwarded(gaps) -> None:
    end = WARM + 12.0
    b = run(gaps, WARM, math.inf, end)
    first_cut = b.cut[0]
    budget_s = BUDGET_MS / 1000
    after = [at for at, what in b.log if what == "admit" and at > first_cut]
    # issue 12's win stands: the shape turns into deadline_unmeetable at arrival
    rejected = [at for at, what in b.log if what != "admit" and at > first_cut]
    assert all(what in ("admit", "deadline_unmeetable") for _, what in b.log)
    assert len(rejected) >= 0.85 * len([at for at, _ in b.log if at > first_cut])
    # what goes through is the probe trickle: one in flight (each is cut a budget later), the first
    # a budget after the floor rose, each next at least two budgets after the last
    assert all(later - earlier >= 2 * budget_s - 1e-9 for earlier, later in itertools.pairwise(after)), after
    assert not after or after[0] >= first_cut + budget_s - 1e-9
    horizon = end - first_cut
    assert len(after) <= 1 + horizon / (2 * budget_s)
    assert not b.completed or max(done for _, done in b.completed) < first_cut  # no probe ever answered


def first_grant(f: CensoredFloors, key: tuple[int, int], since: float, tid: int) -> float:
    """The first time from `since` (5 ms steps) at which ticket `tid` is granted the shape's probe."""
    for step in range(10_000):
        if f.probe(key, tid, BUDGET_MS, FAST_MS, since + step * 0.005):
            return since + step * 0.005
    raise AssertionError("no probe granted")


def test_the_probes_back_off_to_a_bounded_spacing_and_a_finish_lifts_the_floor() -> None:
    f = CensoredFloors()
    key = shape_bucket(200, 0)
    cut_s = BUDGET_MS / 1000
    assert f.censored(key, BUDGET_MS, FAST_MS, 1.0)  # the floor rises: 375 ms against budgets of 300
    assert f.floor_ms(key, 1.0) == BUDGET_MS * (1 + INFLATE)
    assert not f.probe(key, 2, 1000.0, FAST_MS, 1.0 + cut_s)  # a budget the floor does not condemn
    assert not f.probe(key, 3, BUDGET_MS, 400.0, 1.0 + cut_s)  # one the model alone condemns
    cut_at, spacings = 1.0, []
    for tid in range(10, 16):  # each probe is cut at its deadline; the next waits twice as long, up to 8
        granted = first_grant(f, key, cut_at, tid)
        spacings.append(round((granted - cut_at) / cut_s, 1))
        assert f.floor_ms(key, granted, tid) == 0.0 and f.floor_ms(key, granted) > BUDGET_MS  # lifted for it alone
        assert not f.probe(key, tid + 100, BUDGET_MS, FAST_MS, granted + 0.01)  # one in flight
        cut_at = granted + cut_s
        assert f.censored(key, BUDGET_MS, FAST_MS, cut_at)
    assert spacings == [1.0, 2.0, 4.0, PROBE_MAX_SPACING, PROBE_MAX_SPACING, PROBE_MAX_SPACING]
    assert (f.probes, f.probe_failures) == (6, 6)
    granted = first_grant(f, key, cut_at, 50)
    f.completed(key, FAST_MS, granted + FAST_MS / 1000)  # the backend recovered: the probe finished
    assert f.floor_ms(key, granted + FAST_MS / 1000) == FAST_MS
    assert not f.probe(key, 51, BUDGET_MS, FAST_MS, granted + 10.0)  # a finish judges the shape: no probes


def test_a_granted_probe_that_never_reached_the_backend_lapses() -> None:
    f = CensoredFloors()
    key = shape_bucket(200, 0)
    f.censored(key, BUDGET_MS, FAST_MS, 1.0)
    assert f.probe(key, 7, BUDGET_MS, FAST_MS, 2.0)  # say its client left before it was admitted
    assert not f.probe(key, 8, BUDGET_MS, FAST_MS, 2.5)
    assert f.probe(key, 9, BUDGET_MS, FAST_MS, 2.0 + 2 * BUDGET_MS / 1000)
