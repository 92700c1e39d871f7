"""Adaptive throttle: the SRE formula over a sliding window, on a hand-advanced clock.

With Envoy admission_control's guards (a minimum request count, a ceiling on p) and
refusals never counted as requests: what kept one refused call from locking a client
out for the whole window (issue 14).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_sdk.throttle import AdaptiveThrottle
from tests.client_sdk.fakes import FixedRandom


def record(throttle: AdaptiveThrottle, now: float, requests: int, accepts: int) -> None:
    for i in range(requests):
        throttle.record(now, accepted=i < accepts)


def test_probability_is_the_sre_formula() -> None:
    throttle = AdaptiveThrottle(k=2.0, window_s=60.0, min_requests=0, max_probability=1.0)
    record(throttle, 0.0, requests=9, accepts=3)
    assert throttle.probability(0.5) == (9 - 2 * 3) / (9 + 1)


def test_nothing_is_refused_below_the_minimum_request_count() -> None:
    throttle = AdaptiveThrottle(k=2.0, min_requests=20)
    record(throttle, 0.0, requests=19, accepts=0)  # 19 failures: not yet a trend
    assert throttle.probability(0.0) == 0.0
    assert throttle.admit(0.0, FixedRandom(0.0)).admitted
    record(throttle, 0.0, requests=1, accepts=0)
    assert throttle.probability(0.0) == 0.9  # 20/21 by the formula, at the 0.9 ceiling


def test_the_probability_never_exceeds_its_ceiling() -> None:
    throttle = AdaptiveThrottle(k=2.0, min_requests=0, max_probability=0.9)
    record(throttle, 0.0, requests=1000, accepts=0)
    assert throttle.probability(0.0) == 0.9  # the formula says 1000/1001
    assert throttle.admit(0.0, FixedRandom(0.95)).admitted  # one call in ten still goes out


def test_no_refusal_while_at_least_half_are_accepted_with_k_2() -> None:
    throttle = AdaptiveThrottle()
    record(throttle, 0.0, requests=10, accepts=5)
    assert throttle.probability(0.0) == 0.0
    # p == 0 draws no randomness: a stub that would refuse everything is never asked.
    assert throttle.admit(0.0, FixedRandom(0.0)).admitted


def test_refuses_when_the_coin_lands_below_p_and_never_counts_the_refusal_as_a_request() -> None:
    throttle = AdaptiveThrottle(k=2.0, min_requests=0, max_probability=1.0)
    record(throttle, 0.0, requests=9, accepts=0)
    assert throttle.probability(0.0) == 0.9
    for _ in range(100):
        refused = throttle.admit(0.0, FixedRandom(0.5))
        assert (refused.admitted, refused.probability) == (False, 0.9)
    # The book counts refusals as requests, so p only rose with each one: a lockout.
    assert throttle.statistics(0.0).requests == 9
    assert throttle.probability(0.0) == 0.9
    assert throttle.statistics(0.0).refused == 100
    admitted = throttle.admit(0.0, FixedRandom(0.95))
    assert admitted.admitted and admitted.probability == 0.9


def test_window_slides_old_buckets_out() -> None:
    throttle = AdaptiveThrottle(k=2.0, window_s=60.0, buckets=60)
    record(throttle, 0.0, requests=9, accepts=0)
    record(throttle, 30.0, requests=1, accepts=1)
    assert throttle.statistics(59.9).requests == 10
    stats = throttle.statistics(60.0)  # bucket [0, 1) left the window
    assert (stats.requests, stats.accepts, stats.probability) == (1, 1, 0.0)
    assert throttle.statistics(200.0).requests == 0


def test_a_reused_slot_is_reset_before_counting() -> None:
    throttle = AdaptiveThrottle(k=2.0, window_s=4.0, buckets=4)
    record(throttle, 1.0, requests=5, accepts=0)
    record(throttle, 5.0, requests=1, accepts=0)  # same slot (index 5 % 4 == 1), new bucket
    assert throttle.statistics(5.0).requests == 1


@pytest.mark.parametrize(
    "kwargs",
    [{"k": 0.5}, {"window_s": 0}, {"buckets": 0}, {"min_requests": -1}, {"max_probability": 1.5}],
)
def test_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AdaptiveThrottle(**kwargs)


@settings(deadline=None)  # shared, noisy machines: no timing in unit tests
@given(
    events=st.lists(st.tuples(st.floats(0, 3), st.booleans()), max_size=300),
    buckets=st.integers(1, 12),
)
def test_running_totals_equal_a_recount_of_the_window(events: list[tuple[float, bool]], buckets: int) -> None:
    """Invariant: the O(1) totals match counting every event still in the window."""
    throttle = AdaptiveThrottle(k=2.0, window_s=float(buckets), buckets=buckets)  # 1 s buckets
    now, seen = 0.0, []
    for step, accepted in events:
        now += step
        throttle.record(now, accepted)
        seen.append((math.floor(now), accepted))
        in_window = [a for index, a in seen if index > math.floor(now) - buckets]
        stats = throttle.statistics(now)
        assert (stats.requests, stats.accepts) == (len(in_window), sum(in_window))


@settings(deadline=None)
@given(
    events=st.lists(st.tuples(st.floats(0, 5), st.booleans(), st.booleans()), max_size=300),
    min_requests=st.integers(0, 40),
)
def test_never_refuses_below_the_minimum_and_refusals_never_move_the_window(
    events: list[tuple[float, bool, bool]], min_requests: int
) -> None:
    throttle = AdaptiveThrottle(k=2.0, window_s=10.0, buckets=10, min_requests=min_requests, max_probability=1.0)
    now = 0.0
    for step, ask, accepted in events:
        now += step
        before = throttle.statistics(now)
        if ask:  # a new call: the coin always lands on "refuse" if p > 0
            admission = throttle.admit(now, FixedRandom(0.0))
            if before.requests < min_requests:
                assert admission.admitted
            after = throttle.statistics(now)
            assert (after.requests, after.accepts) == (before.requests, before.accepts)
        else:
            throttle.record(now, accepted)
