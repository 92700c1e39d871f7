"""Zombie-aware leases (issue 12 item 3): a request cut upstream on a server that keeps computing
holds its slot for its expected remaining time. Pure core, hand-advanced clock, Hypothesis."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.admission import AdmissionController
from proxy.core.decisions import Admit, Enqueue, Outcome
from proxy.core.phantoms import KEEPS, STOPS, CancelHabit, Phantoms
from tests.core.test_admission import make_policy, ticket


def ctl_for(stops_on_cancel, limit: int = 1) -> AdmissionController:
    return AdmissionController(make_policy(limit, stops_on_cancel=stops_on_cancel), rng=random.Random(0))


def test_a_cut_request_keeps_its_slot_until_its_expected_end_when_the_server_keeps_computing():
    ctl = ctl_for(False)
    first = ctl.arrive(ticket(expected_ms=1000.0), 0.0)
    waiting = ctl.arrive(ticket(expected_ms=10.0), 0.0)
    assert isinstance(first, Admit) and isinstance(waiting, Enqueue)
    assert ctl.release(first.lease, 0.4, Outcome.CANCELLED, 400.0) == []  # cut after 400 ms: no room
    assert ctl.capacity.used == [1] and len(ctl.phantoms) == 1
    end = ctl.next_phantom_end()
    assert end is not None and end >= 0.4 + 0.6 - 1e-9  # at least the 600 ms it was expected to need
    assert ctl.expire(end - 0.001) == [] and ctl.take_woken() == []
    ctl.expire(end)
    assert [d.ticket.id for d in ctl.take_woken()] == [waiting.ticket.id]
    assert ctl.statistics(end)["phantoms"]["ended"] == 1


def test_an_upstream_that_stops_on_cancel_frees_the_slot_at_once():
    ctl = ctl_for(True)
    first = ctl.arrive(ticket(expected_ms=1000.0), 0.0)
    waiting = ctl.arrive(ticket(expected_ms=10.0), 0.0)
    woken = ctl.release(first.lease, 0.4, Outcome.CANCELLED, 400.0)
    assert [d.ticket.id for d in woken] == [waiting.ticket.id] and len(ctl.phantoms) == 0


def test_a_request_that_never_went_upstream_leaves_no_phantom():
    ctl = ctl_for(False)
    first = ctl.arrive(ticket(expected_ms=1000.0), 0.0)
    ctl.release(first.lease, 0.0, Outcome.CANCELLED)  # no time upstream: cancelled before forwarding
    assert len(ctl.phantoms) == 0 and ctl.capacity.used == [0]


def test_auto_learns_from_the_engine_gauges_that_cut_requests_are_gone():
    ctl = ctl_for("auto", limit=2)
    a, b = ctl.arrive(ticket(expected_ms=1000.0), 0.0), ctl.arrive(ticket(expected_ms=1000.0), 0.0)
    queued = ctl.arrive(ticket(expected_ms=10.0), 0.0)
    ctl.release(a.lease, 0.2, Outcome.CANCELLED, 200.0)
    assert len(ctl.phantoms) == 1  # auto assumes the worst until the engine says otherwise
    assert ctl.note_engine(0, running=1.0, waiting=0.0, now=0.25) == []  # one reading: not yet
    woken = ctl.note_engine(0, running=1.0, waiting=0.0, now=0.3)  # only b runs: the cut one is gone
    assert [d.ticket.id for d in woken] == [queued.ticket.id]
    assert ctl.habits[0].state == STOPS and len(ctl.phantoms) == 0
    ctl.release(b.lease, 0.5, Outcome.CANCELLED, 500.0)
    assert len(ctl.phantoms) == 0  # learned: no more phantoms


def test_auto_confirms_a_server_that_keeps_computing():
    habit = CancelHabit("auto")
    phantoms = Phantoms()

    class L:
        id, upstream = 1, 0

    phantoms.add(L(), 1, 0.0, 1000.0)
    for now in (0.1, 0.2):
        habit.observe_engine(2.0, 1, phantoms.on(0), now)  # the engine runs our live one and the cut one
    assert habit.state == KEEPS and habit.keeps_computing
    assert CancelHabit(True).state == STOPS and not CancelHabit(True).keeps_computing


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 3),
    st.lists(
        st.tuples(
            st.sampled_from(["arrive", "finish", "cut", "tick", "engine"]),
            st.integers(1, 3000),
            st.integers(0, 3),
        ),
        max_size=50,
    ),
)
def test_phantoms_end_exactly_once_and_in_flight_with_phantoms_stays_within_the_limit(limit, ops):
    ctl = ctl_for("auto", limit)
    leases, now = [], 0.0
    for op, n, k in ops:
        if op == "arrive":
            d = ctl.arrive(ticket(expected_ms=float(n)), now)
            woken = ([d] if isinstance(d, Admit) else []) + ctl.take_woken()
        elif op in ("finish", "cut") and leases:
            lease = leases.pop(k % len(leases))
            outcome, rtt = (Outcome.SUCCESS, float(n)) if op == "finish" else (Outcome.CANCELLED, float(n) / 3)
            woken = ctl.release(lease, now, outcome, rtt)
        elif op == "engine":
            woken = ctl.note_engine(0, float(k), 0.0, now)
        else:
            now += n / 1000.0
            woken = ctl.expire(now) + ctl.take_woken()
        leases += [w.lease for w in woken if isinstance(w, Admit)]
        cap = ctl.capacity
        assert cap.used[0] == len(leases) + len(ctl.phantoms) <= max(cap.limit(0), len(leases) + len(ctl.phantoms))
        assert cap.used[0] <= cap.limit(0)
        assert ctl.counts["phantoms"] == len(ctl.phantoms) + ctl.phantoms.ended
    while leases or ctl.next_phantom_end() is not None:  # every lease ends, then time runs out every phantom
        while leases:
            leases += [d.lease for d in ctl.release(leases.pop(), now, Outcome.SUCCESS, 1.0) if isinstance(d, Admit)]
        end = ctl.next_phantom_end()
        if end is not None:
            now = max(now, end)
            leases += [d.lease for d in ctl.expire(now) + ctl.take_woken() if isinstance(d, Admit)]
    assert len(ctl.waitline) == 0
    assert ctl.capacity.used == [0] and ctl.phantoms.ended == ctl.counts["phantoms"]
