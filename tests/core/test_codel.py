"""CoDel: enters and leaves the dropping state exactly as documented in proxy/core/codel.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.codel import CoDel, Event, Mode, transition

TARGET_MS, INTERVAL_MS = 50.0, 100.0


def shed_ranks(codel: CoDel) -> list[int]:
    return [r for r in range(codel.n_classes) if codel.sheds(r)]


def test_starts_normal_and_sheds_nothing():
    codel = CoDel(TARGET_MS, INTERVAL_MS, n_classes=3)
    assert (codel.mode, codel.level, shed_ranks(codel)) == (Mode.NORMAL, 0, [])


def test_one_interval_whose_minimum_stays_above_target_sheds_the_lowest_class():
    codel = CoDel(TARGET_MS, INTERVAL_MS, n_classes=3)
    codel.observe(80.0, now=0.00)  # interval [0, 0.1)
    codel.observe(60.0, now=0.05)
    assert codel.mode is Mode.NORMAL  # not judged before the interval ends
    codel.observe(70.0, now=0.10)  # closes [0, 0.1): min 60 > 50
    assert (codel.mode, codel.level, shed_ranks(codel)) == (Mode.DROPPING, 1, [2])


def test_one_sample_at_or_below_target_in_the_interval_keeps_it_normal():
    codel = CoDel(TARGET_MS, INTERVAL_MS, n_classes=3)
    for t, wait in [(0.00, 500.0), (0.03, 50.0), (0.06, 900.0)]:  # min == target is not above
        codel.observe(wait, t)
    codel.observe(900.0, now=0.10)
    assert (codel.mode, codel.level) == (Mode.NORMAL, 0)


def test_each_further_bad_interval_sheds_one_more_class_then_one_good_interval_ends_it():
    codel = CoDel(TARGET_MS, INTERVAL_MS, n_classes=3)
    codel.observe(80.0, 0.0)
    seen = []
    for k in range(1, 6):  # intervals ending at 0.1, 0.2, ... all with min 80
        codel.observe(80.0, k * 0.1 + 1e-9)
        seen.append(shed_ranks(codel))
    assert seen == [[2], [1, 2], [0, 1, 2], [0, 1, 2], [0, 1, 2]]
    codel.observe(0.0, 0.55)  # the queue emptied during [0.5, 0.6)
    codel.observe(80.0, 0.6 + 1e-9)
    assert (codel.mode, codel.level, shed_ranks(codel)) == (Mode.NORMAL, 0, [])


def test_empty_intervals_are_judged_by_back_projecting_the_next_sample():
    codel = CoDel(TARGET_MS, INTERVAL_MS, n_classes=4)
    codel.observe(0.0, 0.0)  # [0, 0.1): min 0 -> below
    # Nothing for a while, then at 0.65 s an arrival finds the head has waited 450 ms: the
    # queue was never empty since 0.2 s. Intervals [0.1,0.2) .. [0.5,0.6) had heads aged
    # max(0, 450 - (0.65 - start) * 1000) = 0, 0, 100, 200, 300 ms at their starts.
    codel.observe(450.0, 0.65)
    stats = codel.statistics()
    assert (stats.intervals_below, stats.intervals_above) == (3, 3)  # [0,0.1) and two empty ones below
    assert (codel.mode, codel.level) == (Mode.DROPPING, 3)


def test_a_long_idle_gap_with_an_empty_queue_resets():
    codel = CoDel(TARGET_MS, INTERVAL_MS, n_classes=2)
    codel.observe(200.0, 0.0)
    codel.observe(200.0, 0.1)
    assert codel.mode is Mode.DROPPING
    codel.observe(0.0, 3600.0)  # an hour later, queue empty: replays only a few intervals
    assert (codel.mode, codel.level) == (Mode.NORMAL, 0)
    assert codel.statistics().intervals_below <= codel.max_level + 1


def test_a_long_stuck_queue_saturates_the_level():
    codel = CoDel(TARGET_MS, INTERVAL_MS, n_classes=2)
    codel.observe(0.0, 0.0)
    codel.observe(3_600_000.0, 3600.0)  # the head has waited the whole hour
    assert (codel.mode, codel.level, shed_ranks(codel)) == (Mode.DROPPING, 2, [0, 1])


def test_the_transition_table_raises_on_an_unknown_event():
    assert transition(Mode.NORMAL, Event.ABOVE) is Mode.DROPPING
    with pytest.raises(RuntimeError, match="no transition"):
        transition(Mode.NORMAL, "bogus")  # type: ignore[arg-type]


def test_repr_and_validation():
    assert "mode=normal" in repr(CoDel(TARGET_MS, INTERVAL_MS, 3))
    with pytest.raises(ValueError):
        CoDel(TARGET_MS, 0, 3)


samples = st.lists(
    st.tuples(st.floats(min_value=0, max_value=1_000), st.floats(min_value=0, max_value=0.35)), max_size=60
)


@given(samples, st.integers(min_value=1, max_value=5))
def test_invariants_under_any_sample_sequence(steps, n_classes):
    codel = CoDel(TARGET_MS, INTERVAL_MS, n_classes)
    now = 0.0
    for wait, dt in steps:
        now += dt
        codel.observe(wait, now)
        assert 0 <= codel.level <= codel.max_level
        assert (codel.mode is Mode.DROPPING) == (codel.level > 0)
        shed = shed_ranks(codel)
        assert shed == list(range(n_classes - codel.level, n_classes))  # a suffix: lowest classes first


@given(st.lists(st.floats(min_value=0, max_value=1_000), min_size=1, max_size=30))
def test_matches_a_reference_of_per_interval_minima(waits):
    """One sample every 37 ms (never on an interval edge): level == run of trailing bad intervals."""
    codel = CoDel(TARGET_MS, INTERVAL_MS, n_classes=3)
    at = [i * 0.037 for i in range(len(waits))]
    for t, wait in zip(at, waits):
        codel.observe(wait, t)
    closed = int(at[-1] // 0.1)
    minima = [min(w for t, w in zip(at, waits) if k * 0.1 <= t < (k + 1) * 0.1) for k in range(closed)]
    run = 0
    for m in minima:
        run = run + 1 if m > TARGET_MS else 0
    assert codel.level == min(run, 3)


def test_take_drop_follows_the_control_law_and_resets_when_the_queue_clears():
    codel = CoDel(TARGET_MS, INTERVAL_MS, n_classes=1)
    assert not codel.take_drop(0.0)  # NORMAL: nothing to drop
    codel.observe(80.0, 0.00)
    codel.observe(80.0, 0.10)  # [0, 0.1) stood: DROPPING
    taken = [t for t in (0.10, 0.15, 0.199, 0.20, 0.25, 0.2708, 0.28, 0.3286) if codel.take_drop(t)]
    # At once, then interval/sqrt(1) = 100 ms, then 100/sqrt(2) = 70.7 ms, then 100/sqrt(3) = 57.7 ms.
    assert taken == [0.10, 0.20, 0.2708, 0.3286]
    codel.observe(0.0, 0.35)
    codel.observe(0.0, 0.41)  # the interval holding an empty queue ends: NORMAL, the count starts over
    assert codel.mode is Mode.NORMAL and not codel.take_drop(0.41)
    codel.observe(80.0, 0.52)  # back-projected: [0.4, 0.5) had a 0 sample; [0.5, 0.6) runs
    codel.observe(80.0, 0.61)  # [0.5, 0.6) stood again
    assert codel.take_drop(0.61) and not codel.take_drop(0.70)  # first drop at once, next 100 ms later
