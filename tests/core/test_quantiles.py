"""Windowed quantiles: accuracy vs exact quantiles, window expiry on a hand clock, bounded families."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.quantiles import LatencyFamily, LogBuckets, WindowedQuantiles, cost_bucket

BUCKETS = LogBuckets(min_ms=0.1, max_ms=600_000.0, relative_error=0.02)
in_range = st.floats(min_value=0.1, max_value=600_000.0, allow_nan=False)
TOL = 1e-9  # float rounding in log() at bucket edges


def rel_err(estimate: float, exact: float) -> float:
    return abs(estimate - exact) / exact


@given(in_range)
def test_every_value_maps_to_a_bucket_within_the_relative_error(value):
    assert rel_err(BUCKETS.value(BUCKETS.index(value)), value) <= 0.02 + TOL


def test_bucket_geometry_is_small():
    assert 300 < BUCKETS.size < 450
    assert BUCKETS.index(0.0) == BUCKETS.index(-5.0) == BUCKETS.index(0.1) == 0
    assert BUCKETS.index(1e9) == BUCKETS.size - 1
    with pytest.raises(ValueError):
        LogBuckets(min_ms=1, max_ms=1)


def exact_quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@settings(max_examples=200)
@given(st.lists(in_range, min_size=1, max_size=300), st.floats(min_value=0.001, max_value=1.0))
def test_quantile_is_within_relative_error_of_the_exact_one(values, q):
    tracker = WindowedQuantiles(window_s=60, sub_windows=6, buckets=BUCKETS)
    step = 50.0 / len(values)  # spread over five sub-windows, all still live at the end
    for i, v in enumerate(values):
        tracker.record(v, now=i * step)
    assert tracker.count(50.0) == len(values)
    assert rel_err(tracker.quantile(q, 50.0), exact_quantile(values, q)) <= 0.02 + TOL


def test_empty_tracker_has_no_quantile():
    tracker = WindowedQuantiles()
    assert tracker.quantile(0.99, 0.0) is None
    assert tracker.count(0.0) == 0


def test_samples_leave_the_window_a_sub_window_at_a_time():
    tracker = WindowedQuantiles(window_s=60, sub_windows=6)  # 10 s sub-windows
    tracker.record(1000.0, now=5.0)  # sub-window [0, 10)
    tracker.record(10.0, now=15.0)  # sub-window [10, 20)
    assert tracker.count(59.999) == 2
    assert tracker.quantile(1.0, 59.999) == pytest.approx(1000.0, rel=0.02)
    # At 60 s the window is [10, 70): the 1000 ms sample has gone, the 10 ms one stays.
    assert tracker.count(60.0) == 1
    assert tracker.quantile(1.0, 60.0) == pytest.approx(10.0, rel=0.02)
    assert tracker.count(70.0) == 0
    assert tracker.quantile(0.5, 70.0) is None


def test_a_long_idle_gap_expires_everything_at_once():
    tracker = WindowedQuantiles(window_s=60, sub_windows=6)
    for t in range(0, 60, 3):
        tracker.record(50.0, now=float(t))
    tracker.record(7.0, now=10_000.0)
    assert tracker.count(10_000.0) == 1
    assert tracker.quantile(0.99, 10_000.0) == pytest.approx(7.0, rel=0.02)


def test_a_late_sample_counts_in_the_current_sub_window():
    tracker = WindowedQuantiles(window_s=60, sub_windows=6)
    tracker.record(1.0, now=100.0)
    tracker.record(2.0, now=95.0)  # clocks do not run backwards; a late caller must not corrupt state
    assert tracker.count(100.0) == 2
    assert tracker.count(160.0) == 0


@settings(max_examples=100)
@given(st.lists(st.tuples(in_range, st.floats(min_value=0, max_value=25)), min_size=1, max_size=100))
def test_count_matches_a_model_of_live_sub_windows(steps):
    """Invariant: count == samples whose sub-window is one of the last n at `now`."""
    tracker = WindowedQuantiles(window_s=30, sub_windows=3)  # 10 s sub-windows
    now, recorded = 0.0, []
    for value, dt in steps:
        now += dt
        tracker.record(value, now)
        recorded.append((math.floor(now / 10), value))
        epoch = math.floor(now / 10)
        live = [v for e, v in recorded if e > epoch - 3]
        assert tracker.count(now) == len(live)
        assert rel_err(tracker.quantile(0.9, now), exact_quantile(live, 0.9)) <= 0.02 + TOL


def test_refresh_caches_answers_until_it_passes_or_the_window_moves():
    tracker = WindowedQuantiles(window_s=60, sub_windows=6, refresh_s=1.0)
    tracker.record(10.0, now=0.0)
    assert tracker.quantile(0.99, 0.0) == pytest.approx(10.0, rel=0.02)
    tracker.record(500.0, now=0.5)
    tracker.record(500.0, now=0.5)
    assert tracker.quantile(0.99, 0.5) == pytest.approx(10.0, rel=0.02)  # cached
    assert tracker.quantile(0.99, 1.0) == pytest.approx(500.0, rel=0.02)  # refreshed
    tracker.record(900.0, now=10.0)  # a new sub-window drops the cache at once
    assert tracker.quantile(1.0, 10.0) == pytest.approx(900.0, rel=0.02)


def test_statistics_and_repr():
    tracker = WindowedQuantiles()
    for v in (1.0, 2.0, 3.0, 100.0):
        tracker.record(v, now=1.0)
    stats = tracker.statistics(now=1.0)
    assert stats.count == 4
    assert stats.p50_ms == pytest.approx(2.0, rel=0.02)
    assert stats.p99_ms == pytest.approx(100.0, rel=0.02)
    assert "count=4" in repr(tracker)


@pytest.mark.parametrize(
    ("cost", "bucket"), [(0, 0), (1, 1), (2, 2), (3, 2), (4, 3), (1023, 10), (1024, 11), (-5, 0), (1 << 60, 40)]
)
def test_cost_buckets_are_powers_of_two(cost, bucket):
    assert cost_bucket(cost) == bucket


def test_family_is_bounded_and_evicts_the_least_recently_recorded():
    family = LatencyFamily(max_keys=2, min_samples=1)
    family.record(("a", 1), 10.0, now=0.0)
    family.record(("b", 1), 20.0, now=0.0)
    family.record(("a", 1), 10.0, now=0.0)  # a is now the most recent
    family.record(("c", 1), 30.0, now=0.0)  # evicts b
    assert family.tracker(("b", 1)) is None
    assert family.quantile(("a", 1), 0.5, now=0.0) == pytest.approx(10.0, rel=0.02)
    assert family.quantile(("c", 1), 0.5, now=0.0) == pytest.approx(30.0, rel=0.02)
    stats = family.statistics()
    assert (stats.keys, stats.max_keys, stats.evictions) == (2, 2, 1)


def test_family_answers_none_until_min_samples():
    family = LatencyFamily(min_samples=3)
    assert family.quantile("route", 0.99, now=0.0) is None
    family.record("route", 40.0, now=0.0)
    family.record("route", 40.0, now=0.0)
    assert family.quantile("route", 0.99, now=0.0) is None
    family.record("route", 40.0, now=0.0)
    assert family.quantile("route", 0.99, now=0.0) == pytest.approx(40.0, rel=0.02)
    assert family.quantile("route", 0.99, now=120.0) is None  # samples aged out


def test_recording_the_newest_key_again_keeps_the_recency_order_and_eviction():
    """LatencyFamily.record skips the pop and re-insert for the key recorded last (the usual
    case: one route); the order keys() reports and the key evicted are as before."""
    from proxy.core.quantiles import LatencyFamily

    fam = LatencyFamily(max_keys=2)
    for key in ["a", "b", "b", "a", "a"]:
        fam.record(key, 1.0, 0.0)
    assert fam.keys() == ["b", "a"]
    fam.record("c", 1.0, 0.0)  # evicts the least recent: b
    assert fam.keys() == ["a", "c"] and fam.statistics().evictions == 1
    fam.record("c", 2.0, 0.0)
    fam.record("b", 1.0, 0.0)  # evicts a
    assert fam.keys() == ["c", "b"]
    assert fam.tracker("c").count(0.0) == 2 and fam.tracker("b").count(0.0) == 1


@given(st.lists(st.tuples(st.floats(0, 30), st.floats(0.05, 1000), st.booleans()), max_size=80))
def test_the_sub_window_fast_path_answers_as_the_exact_epoch_test(events):
    """_advance skips the division while `now` is surely inside the newest sub-window; a tracker
    that always divides (the fast path disabled) gives the same counts and quantiles."""
    fast, exact = WindowedQuantiles(window_s=6.0, sub_windows=6), WindowedQuantiles(window_s=6.0, sub_windows=6)
    now = 0.0
    for dt, value, back in events:
        now = max(0.0, now - dt / 10) if back else now + dt / 10  # late samples too
        exact._head_until = -math.inf
        fast.record(value, now)
        exact.record(value, now)
        exact._head_until = -math.inf
        assert fast.count(now) == exact.count(now)
        exact._head_until = -math.inf
        assert fast.quantile(0.99, now) == exact.quantile(0.99, now)
