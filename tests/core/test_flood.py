"""The h2 flood budgets: well-behaved clients never trip them, floods trip them within the burst."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.flood import Allowance, FloodBudget, FloodLimits

LIMITS = FloodLimits(
    control_burst=50, control_per_s=10, per_stream=5, per_data_frame=2, resets_burst=20, resets_per_s=4
)

# One client step: time passes, then it opens streams, we send DATA frames, it sends control frames.
steps = st.lists(
    st.tuples(
        st.fractions(min_value=0, max_value=5, max_denominator=100),  # seconds since the last step
        st.integers(0, 3),  # streams opened
        st.integers(0, 20),  # DATA frames we sent
        st.integers(0, 60),  # control frames it sent
    ),
    max_size=30,
)


def test_allowance_is_exact_and_capped():
    a = Allowance(3, Fraction(10), Fraction(0))
    assert [a.spend(Fraction(0)) for _ in range(4)] == [True, True, True, False]
    assert a.tokens(Fraction(1, 20)) == Fraction(1, 2)
    assert not a.spend(Fraction(1, 20))  # half a token is not a token
    assert a.spend(Fraction(1, 10))
    a.earn(100)
    assert a.tokens(Fraction(1, 10)) == 3  # earned credit is capped at the burst too
    assert a.tokens(Fraction(1000)) == 3


@pytest.mark.parametrize(("burst", "per_s"), [(0, 1), (1, -1), (1, float("nan"))])
def test_allowance_rejects_nonsense(burst, per_s):
    with pytest.raises(ValueError):
        Allowance(burst, per_s, 0)


@given(steps)
def test_tokens_stay_within_zero_and_burst(history):
    budget, now = FloodBudget(LIMITS, Fraction(0)), Fraction(0)
    for dt, streams, data, control in history:
        now += dt
        for _ in range(streams):
            budget.stream_opened()
        budget.data_sent(data)
        for _ in range(control):
            budget.control(now)
        assert 0 <= budget.control_tokens(now) <= LIMITS.control_burst


@given(steps)
def test_control_frames_in_proportion_to_work_never_trip(history):
    """Up to per_stream frames per stream opened and per_data_frame per DATA frame sent, at any speed."""
    budget, now = FloodBudget(LIMITS, Fraction(0)), Fraction(0)
    for dt, streams, data, _ in history:
        now += dt
        for _ in range(streams):
            budget.stream_opened()
            assert all(budget.control(now) for _ in range(LIMITS.per_stream))
        budget.data_sent(data)
        assert all(budget.control(now) for _ in range(LIMITS.per_data_frame * data))


@given(st.lists(st.fractions(min_value=Fraction(1, 10), max_value=10, max_denominator=100), max_size=100))
def test_control_frames_no_faster_than_the_rate_never_trip(gaps):
    """A keep-alive PING every 1/per_s seconds or slower, forever, with no work at all."""
    budget, now = FloodBudget(LIMITS, Fraction(0)), Fraction(0)
    for gap in gaps:
        now += gap
        assert budget.control(now)


@given(steps, st.fractions(min_value=0, max_value=1000, max_denominator=10))
def test_a_flood_trips_within_the_burst_whatever_came_before(history, pause):
    """However well it behaved (or how long it waited), at most `burst` frames pass at one instant."""
    budget, now = FloodBudget(LIMITS, Fraction(0)), Fraction(0)
    for dt, streams, data, control in history:
        now += dt
        for _ in range(streams):
            budget.stream_opened()
        budget.data_sent(data)
        for _ in range(control):
            budget.control(now)
    now += pause
    passed = 0
    while budget.control(now):
        passed += 1
        assert passed <= LIMITS.control_burst
    assert not budget.control(now)  # and it stays tripped at that instant


@given(st.lists(st.fractions(min_value=0, max_value=2, max_denominator=100), max_size=200))
def test_resets_are_limited_by_their_own_bucket_only(gaps):
    """Work earns no resets: past the burst, resets pass at no more than resets_per_s."""
    budget, now, passed = FloodBudget(LIMITS, Fraction(0)), Fraction(0), 0
    for gap in gaps:
        now += gap
        budget.stream_opened()
        budget.data_sent(100)
        passed += budget.client_reset(now)
    assert passed <= LIMITS.resets_burst + LIMITS.resets_per_s * now
