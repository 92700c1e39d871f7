"""The upstream lifecycle table and its bookkeeping, with Hypothesis over event orders."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.lifecycle import (
    READY_STATES,
    TRANSITIONS,
    Event,
    State,
    UnknownTransition,
    UpstreamLifecycle,
    next_state,
)


def make(**kw) -> UpstreamLifecycle:
    args = {"now": 0.0, "unhealthy_after": 3, "failure_streak": 5, "ramp_window_s": 10.0} | kw
    return UpstreamLifecycle(**args)


# --- the table -------------------------------------------------------------------------------


def test_every_pair_is_either_in_the_table_or_raises():
    for state, event in itertools.product(State, Event):
        if (state, event) in TRANSITIONS:
            assert next_state(state, event) is TRANSITIONS[(state, event)]
        else:
            with pytest.raises(UnknownTransition, match=f"{state.value}.*{event.value}"):
                next_state(state, event)


def test_restart_returns_every_state_to_cold():
    assert all(next_state(s, Event.RESTARTED) is State.COLD for s in State)


def test_ready_states_are_entered_only_through_passed_probes():
    into_ready = {(s, e) for (s, e), after in TRANSITIONS.items() if after in READY_STATES and s not in READY_STATES}
    assert into_ready == {(State.PROBING, Event.PROBES_PASSED)}


def test_unhealthy_is_left_only_for_cold():
    assert {after for (s, _), after in TRANSITIONS.items() if s is State.UNHEALTHY} == {State.UNHEALTHY, State.COLD}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list(Event)), max_size=60))
def test_never_ready_without_passing_probes_over_any_event_order(events):
    state, passed_since_cold = State.COLD, False
    for event in events:
        if (state, event) not in TRANSITIONS:
            with pytest.raises(UnknownTransition):
                next_state(state, event)
            continue
        after = next_state(state, event)
        if event is Event.RESTARTED:
            assert after is State.COLD
        if after in (State.COLD, State.UNHEALTHY, State.PROBING) and after is not state:
            passed_since_cold = False
        if event is Event.PROBES_PASSED:
            passed_since_cold = True
        state = after
        assert state not in READY_STATES or passed_since_cold


# --- the bookkeeping object --------------------------------------------------------------------


def test_cold_then_healthy_then_probes_then_ramp_then_warm():
    lc = make()
    assert [t.after for t in lc.health(1.0, True)] == [State.PROBING]
    assert not lc.ready
    (t,) = lc.probes_finished(5.0, passed=True)
    assert (t.before, t.after, lc.ready, lc.since) == (State.PROBING, State.RAMPING, True, 5.0)
    assert lc.ramp_ends_at() == 15.0
    assert lc.tick(14.9) == ()
    assert [t.after for t in lc.tick(15.0)] == [State.WARM]
    assert lc.ready and lc.statistics().warmups == 1


def test_failed_probes_go_back_to_cold():
    lc = make()
    lc.health(1.0, True)
    (t,) = lc.probes_finished(2.0, passed=False)
    assert (t.after, lc.ready) == (State.COLD, False)


def test_health_failures_count_in_a_row_before_unhealthy():
    lc = warm(make())
    assert lc.health(20.0, False) == [] and lc.health(21.0, False) == []
    lc.health(22.0, True)  # a success breaks the streak
    assert lc.health(23.0, False) == [] and lc.health(24.0, False) == []
    (t,) = lc.health(25.0, False)
    assert (t.event, t.after, lc.ready) == (Event.HEALTH_LOST, State.UNHEALTHY, False)
    assert lc.statistics().losses == 1


def test_recovery_from_unhealthy_starts_a_new_warm_up_at_once():
    lc = warm(make())
    for i in range(3):
        lc.health(20.0 + i, False)
    assert lc.state is State.UNHEALTHY
    assert [t.after for t in lc.health(30.0, True)] == [State.COLD, State.PROBING]
    assert not lc.ready


def test_passive_failure_streak_turns_a_warm_upstream_unhealthy():
    lc = warm(make(failure_streak=3))
    assert lc.request_result(20.0, False) == ()
    assert lc.request_result(20.1, True) == ()  # streak broken
    lc.request_result(20.2, False)
    lc.request_result(20.3, False)
    (t,) = lc.request_result(20.4, False)
    assert (t.event, t.after) == (Event.FAILURE_STREAK, State.UNHEALTHY)


def test_failures_while_cold_keep_it_cold():
    lc = make(unhealthy_after=1, failure_streak=1)
    assert lc.health(1.0, False) == [] and lc.request_result(1.0, False) == ()
    assert lc.state is State.COLD


def test_changed_identity_is_a_restart_then_a_new_warm_up():
    lc = warm(make(), identity=("instance_id=a",))
    events = [(t.event, t.after) for t in lc.health(20.0, True, ("instance_id=b",))]
    assert events == [(Event.RESTARTED, State.COLD), (Event.HEALTH_OK, State.PROBING)]
    assert not lc.ready and lc.statistics().identity == ("instance_id=b",)


def test_a_restart_seen_in_a_failing_health_answer_stops_traffic_at_once():
    """A restarted server says 503 while it loads: that alone must take it out of rotation."""
    lc = warm(make(), identity=("instance_id=a",))
    events = [(t.event, t.after) for t in lc.health(20.0, False, ("instance_id=b",))]
    assert events == [(Event.RESTARTED, State.COLD)]
    assert not lc.ready


def test_same_or_absent_identity_is_not_a_restart():
    lc = warm(make(), identity=("instance_id=a",))
    assert [t.event for t in lc.health(20.0, True, ("instance_id=a",))] == [Event.HEALTH_OK]
    assert [t.event for t in lc.health(21.0, True, None)] == [Event.HEALTH_OK]
    assert lc.state is State.WARM


def test_probes_reported_outside_probing_is_a_bug():
    lc = warm(make())
    with pytest.raises(UnknownTransition):
        lc.probes_finished(20.0, passed=True)


def test_zero_window_ramps_at_once():
    lc = make(ramp_window_s=0.0)
    lc.health(1.0, True)
    lc.probes_finished(2.0, True)
    assert [t.after for t in lc.tick(2.0)] == [State.WARM]


def warm(lc: UpstreamLifecycle, identity=None) -> UpstreamLifecycle:
    lc.health(1.0, True, identity)
    lc.probes_finished(2.0, True)
    lc.tick(2.0 + lc.ramp_window_s)
    assert lc.state is State.WARM
    return lc


# An observation: (kind, argument). Probe verdicts are only reported while probing, as the driver does.
observations = st.lists(
    st.one_of(
        st.tuples(st.just("health"), st.tuples(st.booleans(), st.sampled_from([None, ("id=a",), ("id=b",)]))),
        st.tuples(st.just("request"), st.booleans()),
        st.tuples(st.just("probes"), st.booleans()),
        st.tuples(st.just("tick"), st.floats(0, 20)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(observations)
def test_lifecycle_invariants_over_any_observation_order(obs):
    lc = make(unhealthy_after=2, failure_streak=2, ramp_window_s=5.0)
    now, passed_since_cold, identity = 0.0, False, None
    for kind, arg in obs:
        now += 1.0
        if kind == "health":
            ok, ident = arg
            out = lc.health(now, ok, ident)
            if ident is not None and identity is not None and ident != identity:
                # A new identity is a restart, in a failing answer too.
                assert out[0].event is Event.RESTARTED and out[0].after is State.COLD
                if ok:
                    assert lc.state is State.PROBING  # and the same check starts a new warm-up
            if ident is not None:
                identity = ident
        elif kind == "request":
            out = lc.request_result(now, arg)
        elif kind == "probes":
            if lc.state is not State.PROBING:
                with pytest.raises(UnknownTransition):
                    lc.probes_finished(now, arg)
                continue
            out = lc.probes_finished(now, arg)
        else:
            now += arg
            out = lc.tick(now)
        for t in out:
            assert TRANSITIONS[(t.before, t.event)] is t.after
            if t.after in (State.COLD, State.UNHEALTHY, State.PROBING) and t.after is not t.before:
                passed_since_cold = False
            if t.event is Event.PROBES_PASSED:
                passed_since_cold = True
        assert lc.ready == (lc.state in READY_STATES)
        assert not lc.ready or passed_since_cold
        if lc.state is State.WARM:
            assert now >= lc.since  # warm only once the ramp has run


@given(st.lists(st.booleans(), max_size=12), st.floats(0.0, 100.0))
def test_a_success_with_no_failure_streak_changes_nothing(outcomes, now):
    """What readiness's per-request shortcut relies on (proxy/runtime/readiness.py): once the streak is
    0, a success fires nothing and leaves the lifecycle as it was."""
    lc = warm(make(failure_streak=100))
    for i, ok in enumerate(outcomes):
        lc.request_result(20.0 + i, ok)
    lc.request_result(40.0, True)  # the streak is 0 from here
    before = lc.statistics()
    assert lc.request_result(40.0 + now, True) == ()
    assert lc.statistics() == before and lc.request_failures == 0
