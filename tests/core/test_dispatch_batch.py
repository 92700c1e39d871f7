"""limits.dispatch_batch: queued tickets leave in groups, so a batcher that cuts batches by arrival
time (MLServer's adaptive batching) gets whole batches; a split group heals at the next round, and
the queue never waits while an upstream sits idle (hand-advanced clock; Hypothesis for liveness)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.decisions import Admit, Enqueue, Outcome
from proxy.errors import PolicyError
from proxy.policy.load import parse_policy
from proxy.policy.schema import Policy
from tests.core.test_admission import admitted_ids, controller, make_policy, ticket


def grouped(limit: int, batch: int, upstreams: int = 1) -> Policy:
    return make_policy(limit, dispatch_batch=batch, upstreams=upstreams)


def fill(ctl, n: int, now: float = 0.0) -> list:
    return [ctl.arrive(ticket(), now) for _ in range(n)]


def test_freed_slots_wait_for_a_whole_group_then_all_go_in_one_round():
    ctl = controller(grouped(8, 4))
    first = fill(ctl, 8)
    assert all(isinstance(d, Admit) for d in first)
    assert all(isinstance(d, Enqueue) for d in fill(ctl, 6))
    woken = [ctl.release(d.lease, 1.0, Outcome.SUCCESS, 10.0) for d in first[:3]]
    assert woken == [[], [], []]  # 3 free of a group of 4: held
    last = ctl.release(first[3].lease, 1.0, Outcome.SUCCESS, 10.0)
    assert len(admitted_ids(last)) == 4 and ctl.depth("interactive") == 2
    stats = ctl.statistics(1.0)
    # rounds that found less than a group free: 5 arrivals behind the first queued one, 3 releases
    assert stats["dispatch_batch"] == 4 and stats["counts"]["held_for_group"] == 8


def test_a_split_group_heals_one_round_later():
    """Answers of a batch cut in two (3 + 1) come back apart; the next group still goes whole."""
    ctl = controller(grouped(4, 4))
    leases = [d.lease for d in fill(ctl, 4)]
    fill(ctl, 8)
    for lease in leases[:3]:
        assert ctl.release(lease, 1.0, Outcome.SUCCESS, 10.0) == []
    again = ctl.release(leases[3], 1.2, Outcome.SUCCESS, 10.0)
    assert len(admitted_ids(again)) == 4


@pytest.mark.parametrize(
    ("limit", "batch", "queued"),
    [
        (8, 4, 2),  # fewer waiting than a group: they go once that many are free
        (2, 16, 5),  # a group larger than the limit: it waits for the whole limit, not for ever
    ],
)
def test_a_smaller_group_goes_once_two_slots_are_free(limit, batch, queued):
    ctl = controller(grouped(limit, batch))
    first = fill(ctl, limit)
    fill(ctl, queued)
    assert ctl.release(first[0].lease, 1.0, Outcome.SUCCESS, 10.0) == []
    assert len(admitted_ids(ctl.release(first[1].lease, 1.0, Outcome.SUCCESS, 10.0))) == 2


def test_nobody_waiting_means_no_holding():
    """An arrival to an empty queue goes at once whatever the group size (low load pays nothing)."""
    ctl = controller(grouped(8, 4))
    first = fill(ctl, 7)
    ctl.release(first[0].lease, 1.0, Outcome.SUCCESS, 10.0)
    assert isinstance(ctl.arrive(ticket(), 1.0), Admit)


def test_one_is_the_default_and_gives_each_slot_as_it_frees():
    ctl = controller(make_policy(4))
    first = fill(ctl, 4)
    fill(ctl, 4)
    assert len(admitted_ids(ctl.release(first[0].lease, 1.0, Outcome.SUCCESS, 10.0))) == 1


def test_the_policy_rejects_a_group_counted_in_tokens():
    with pytest.raises(PolicyError) as caught:
        parse_policy('[limits]\nunit = "tokens"\ndispatch_batch = 4\n')
    assert "limits.dispatch_batch" in str(caught.value) and "unit = requests" in str(caught.value)
    assert parse_policy("[limits]\ndispatch_batch = 16\n").limits.dispatch_batch == 16


events = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(0, 3)),
        st.tuples(st.just("release"), st.integers(0, 50)),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(limit=st.integers(1, 10), batch=st.integers(1, 12), upstreams=st.integers(1, 2), script=events)
def test_the_queue_never_waits_while_an_upstream_is_idle_and_rounds_admit_whole_groups(limit, batch, upstreams, script):
    ctl = controller(grouped(limit, batch, upstreams))
    live, now = [], 0.0
    for kind, n in script:
        now += 0.01
        if kind == "arrive":
            for d in fill(ctl, n + 1, now):
                if isinstance(d, Admit):
                    live.append(d.lease)
            continue
        if not live:
            continue
        lease = live.pop(n % len(live))
        waiting = ctl.depth("interactive")
        woken = [d.lease for d in ctl.release(lease, now, Outcome.SUCCESS, 10.0) if isinstance(d, Admit)]
        live += woken
        if woken:  # a round admits a whole group, or all that waited, or up to a whole limit
            assert len(woken) >= min(batch, waiting, limit) or len(woken) == waiting
        cap = ctl.capacity
        if ctl.depth("interactive"):  # waiting: some upstream is busy, none idle
            assert all(cap.used[i] > 0 for i in range(upstreams)), (cap.used, ctl.depth("interactive"))
