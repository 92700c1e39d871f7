"""Slow start arithmetic (Envoy slow_start semantics on a concurrency limit)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.slow_start import slow_start_factor


def f(t, window=10.0, aggression=1.0, min_weight=0.1):
    return slow_start_factor(t, window_s=window, aggression=aggression, min_weight=min_weight)


def test_linear_ramp_with_aggression_one():
    assert f(5.0) == 0.5
    assert f(2.5) == 0.25
    assert f(9.0) == pytest.approx(0.9)


def test_min_weight_floors_the_start():
    assert f(0.0) == 0.1
    assert f(0.5) == 0.1  # 0.05 < min_weight
    assert f(0.0, min_weight=0.3) == 0.3


def test_aggression_shapes_the_curve():
    assert f(2.5, aggression=2.0) == pytest.approx(0.5)  # sqrt(0.25): opens faster early
    assert f(5.0, aggression=0.5) == pytest.approx(0.25)  # 0.5**2: holds back longer


def test_full_limit_at_and_after_the_window_and_with_no_window():
    assert f(10.0) == 1.0 and f(1e6) == 1.0
    assert f(0.0, window=0.0) == 1.0


def test_negative_elapsed_time_is_the_start():
    assert f(-3.0) == 0.1


@pytest.mark.parametrize("kw", [{"aggression": 0.0}, {"min_weight": 0.0}, {"min_weight": 1.5}])
def test_invalid_parameters_raise(kw):
    with pytest.raises(ValueError):
        f(1.0, **kw)


@settings(deadline=None)
@given(
    t1=st.floats(0, 100),
    dt=st.floats(0, 100),
    window=st.floats(0.001, 100),
    aggression=st.floats(0.05, 20),
    min_weight=st.floats(0.001, 1.0),
)
def test_factor_is_bounded_and_never_decreases(t1, dt, window, aggression, min_weight):
    a = slow_start_factor(t1, window_s=window, aggression=aggression, min_weight=min_weight)
    b = slow_start_factor(t1 + dt, window_s=window, aggression=aggression, min_weight=min_weight)
    assert min_weight <= a <= b <= 1.0
