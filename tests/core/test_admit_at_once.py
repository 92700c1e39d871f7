"""AdmissionController.admit_at_once decides as arrive does: twin controllers, one asked through
`arrive` alone, the other through `admit_at_once` first (then `arrive` where it declines), under the
same Hypothesis-chosen events, give equal decisions and end in equal states."""

from __future__ import annotations

import math
import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.admission import AdmissionController
from proxy.core.arrival import ArrivalGate
from proxy.core.cost import Cost
from proxy.core.decisions import Admit, Enqueue, Lease, Outcome, Reject, Ticket
from proxy.policy import shedding as shedding_policy
from proxy.policy.schema import Policy
from tests.core.test_admission import make_policy

ROUTES = ("/v1/chat/completions", "/")  # a route with a model (unjudged until it answers) and the catch-all

arrivals = st.tuples(
    st.just("arrive"),
    st.sampled_from(["realtime", "interactive", "batch"]),
    st.floats(1.0, 2000.0),  # expected ms
    st.integers(1, 40),  # units
    st.one_of(st.none(), st.floats(0.001, 5.0)),  # deadline, seconds from now (None: no deadline)
    st.sampled_from(ROUTES),
)
releases = st.tuples(
    st.just("release"),
    st.integers(0, 10),  # which live lease
    st.sampled_from([Outcome.SUCCESS, Outcome.ERROR, Outcome.CANCELLED, Outcome.DROPPED]),
    st.floats(1.0, 3000.0),  # ms upstream
)
others = st.one_of(
    st.tuples(st.just("tick"), st.floats(0.0, 2.0)),
    st.tuples(st.just("gpu"), st.floats(0.0, 1.0)),
    st.tuples(st.just("factor"), st.sampled_from([0.0, 0.5, 1.0])),
)
events = st.lists(st.one_of(arrivals, arrivals, arrivals, releases, others), min_size=1, max_size=60)


def build(policy: Policy, seed: int, gated: bool) -> AdmissionController:
    gate = None
    if gated:
        shedder = shedding_policy.shedder(policy.shedding, len(policy.classes), random.Random(seed))
        gate = ArrivalGate(policy, shedder, shedding_policy.tenant_quota(policy.tenants))
    service = shedding_policy.latency_family(policy.latency)
    return AdmissionController(policy, rng=random.Random(seed), gate=gate, service=service)


def decided(d: Admit | Enqueue | Reject | Lease) -> tuple:
    """A decision as comparable fields (the ticket by id)."""
    if isinstance(d, Admit):
        d = d.lease
    if isinstance(d, Lease):
        return ("admit", d.id, d.ticket.id, d.upstream, d.units, d.admitted_at, d.queue_ms, d.service_ms)
    if isinstance(d, Enqueue):
        return ("enqueue", d.ticket.id, d.depth, d.expected_wait_ms, d.expires_at)
    return ("reject", d.reason, d.retry_after_ms, d.message)


def run(ctl: AdmissionController, script: list, fast: bool) -> tuple[list, dict]:
    now, ids, seen, live = 10.0, iter(range(1, 10_000)), [], []
    for event in script:
        kind = event[0]
        if kind == "arrive":
            _, klass, expected, units, budget, route = event
            deadline = math.inf if budget is None else now + budget
            t = Ticket(next(ids), klass, Cost(units, units, units, route=route), expected, deadline)
            lease = ctl.admit_at_once(t, now) if fast else None
            d = lease if lease is not None else ctl.arrive(t, now)
            seen.append(decided(d))
            if isinstance(d, Admit | Lease):
                live.append(d.lease if isinstance(d, Admit) else d)
        elif kind == "release" and live:
            _, which, outcome, ms = event
            lease = live.pop(which % len(live))
            rtt = None if outcome is Outcome.ERROR else ms
            for w in ctl.release(lease, now, outcome, rtt):
                seen.append(("woken", *decided(w)) if isinstance(w, Admit) else ("expired", w.ticket.id))
                if isinstance(w, Admit):
                    live.append(w.lease)
        elif kind == "tick":
            now += event[1]
            ctl.service.record(("/", 0), event[1] * 100.0, now)  # observed service times move the p99 read
            seen += [("expired", e.ticket.id) for e in ctl.expire(now)]
        elif kind == "gpu" and ctl.gate is not None:
            ctl.gate.gpu_memory_fraction = event[1]
        elif kind == "factor":
            for w in ctl.set_capacity_factor(0, event[1], now):
                seen.append(("woken", *decided(w)) if isinstance(w, Admit) else ("expired", w.ticket.id))
                if isinstance(w, Admit):
                    live.append(w.lease)
    stats = ctl.statistics(now)
    stats.pop("balancer")  # holds times only; compared through the decisions
    return seen, stats


@settings(max_examples=500, deadline=None)
@given(
    script=events,
    limit=st.integers(1, 4),
    unit=st.sampled_from(["requests", "requests", "tokens"]),  # admit_at_once declines tokens: mostly requests
    upstreams=st.sampled_from([1, 1, 2]),  # and two upstreams
    reserve=st.booleans(),
    gated=st.booleans(),
    try_batch=st.booleans(),
    seed=st.integers(0, 9),
)
def test_admit_at_once_decides_as_arrive(script, limit, unit, upstreams, reserve, gated, try_batch, seed):
    policy = make_policy(
        limit,
        unit=unit,
        upstreams=upstreams,
        reserved={"realtime": 1} if reserve and limit > 1 else None,
        stops_on_cancel=False,  # phantom leases: admit_at_once must leave those to arrive
    )
    if try_batch:  # an on_unmeetable = "try" class: an unmeetable deadline is not a rejection
        classes = dict(policy.classes)
        classes["batch"] = msgspec.structs.replace(classes["batch"], on_unmeetable="try")
        policy = msgspec.structs.replace(policy, classes=classes)
    general = run(build(policy, seed, gated), script, fast=False)
    fast = run(build(policy, seed, gated), script, fast=True)
    assert fast == general


def test_admit_at_once_takes_the_usual_arrival_and_declines_the_rest():
    ctl = build(make_policy(1), 0, gated=True)
    t = Ticket(1, "interactive", Cost(1, 1, 1, route="/"), 50.0, 20.0)
    lease = ctl.admit_at_once(t, 10.0)
    assert lease is not None and (lease.upstream, lease.units, lease.queue_ms) == (0, 1, 0.0)
    second = Ticket(2, "interactive", Cost(1, 1, 1, route="/"), 50.0, 20.0)
    assert ctl.admit_at_once(second, 10.0) is None  # the limit is full: arrive queues it
    assert isinstance(ctl.arrive(second, 10.0), Enqueue)


def test_an_unjudged_route_over_its_cap_is_left_to_arrive():
    """scheduling.unjudged_in_flight (1): the second request of a route with only priors waits for the first."""
    ctl = build(make_policy(3), 0, gated=True)
    chat = Cost(1, 1, 1, route="/v1/chat/completions")
    assert ctl.admit_at_once(Ticket(1, "interactive", chat, 50.0, 20.0), 10.0) is not None
    held = Ticket(2, "interactive", chat, 50.0, 20.0)
    assert ctl.admit_at_once(held, 10.0) is None
    assert isinstance(ctl.arrive(held, 10.0), Enqueue)
