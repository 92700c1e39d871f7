"""Limit algorithms: fixed, and the gradient (Gradient2-style) limit driven by hand-fed samples."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.limits import FixedLimit, GradientLimit, make_limit
from proxy.policy.admission import Limits


def feed(limit, rtt_ms: float, n: int, busy: bool = True, start: float = 0.0) -> int:
    for k in range(n):
        limit.on_sample(start + k, rtt_ms, inflight=limit.value if busy else 0, dropped=False)
    return limit.value


def test_fixed_limit_never_moves():
    lim = FixedLimit(8)
    assert lim.on_sample(0.0, 1e6, 8, True) == 8 and lim.last_reason == "initial"
    assert "FixedLimit 8" in repr(lim) and lim.statistics()["limit"] == 8


def test_steady_latency_grows_the_limit_to_its_maximum():
    lim = GradientLimit(10, 2, 50)
    assert feed(lim, 100.0, 200) == 50
    assert lim.last_reason in ("probe", "max_limit")


def test_latency_above_the_long_term_average_pulls_the_limit_down():
    lim = GradientLimit(40, 2, 50, long_window_samples=1000)
    feed(lim, 100.0, 300)
    high = lim.value
    low = feed(lim, 400.0, 30, start=300)  # recent latency 4x the long-term mean
    assert low < high / 2 and lim.last_reason in ("latency", "min_limit")


def test_target_latency_is_held():
    lim = GradientLimit(20, 1, 200, target_latency_ms=100.0)
    # Far above target: halved each time, down to where the one-unit allowance balances it.
    assert feed(lim, 250.0, 100) <= 2
    assert feed(lim, 50.0, 200, start=100) == 200  # below target: up to the maximum


def test_an_idle_upstream_does_not_raise_the_limit():
    lim = GradientLimit(10, 2, 50)
    assert feed(lim, 100.0, 100, busy=False) == 10


def test_drops_back_off_multiplicatively_and_record_the_reason():
    lim = GradientLimit(40, 2, 50, backoff_ratio=0.5)
    assert lim.on_sample(1.0, 100.0, 40, dropped=True) == 20
    assert lim.last_reason == "drop" and lim.changed_at == 1.0
    for k in range(10):
        lim.on_sample(2.0 + k, 100.0, 40, dropped=True)
    assert lim.value == 2 and lim.last_reason in ("drop", "min_limit")
    assert lim.statistics()["samples"] == 11 and "GradientLimit 2" in repr(lim)


@given(
    st.lists(st.tuples(st.floats(0.0, 1e6), st.integers(0, 500), st.booleans()), max_size=200),
    st.integers(1, 20),
    st.integers(20, 300),
)
def test_the_limit_always_stays_within_bounds(samples, lo, hi):
    lim = GradientLimit(lo, lo, hi)
    for k, (rtt, inflight, dropped) in enumerate(samples):
        value = lim.on_sample(float(k), rtt, inflight, dropped)
        assert lo <= value <= hi and value == lim.value


def test_make_limit_reads_the_policy_section():
    assert isinstance(make_limit(Limits(kind="fixed", initial_limit=7)), FixedLimit)
    g = make_limit(Limits(kind="gradient", initial_limit=7, min_limit=3, max_limit=9))
    assert isinstance(g, GradientLimit) and g.value == 7
