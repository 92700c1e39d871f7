"""CoDel: enters and leaves the dropping state exactly as documented in proxy/core/codel.py."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.codel import CoDel, Event, Mode, transition

TARGET_MS, INTERVAL_MS = 50.0, 100.0


def test_starts_normal_and_drops_nothing():
    codel = CoDel(TARGET_MS, INTERVAL_MS)
    assert (codel.mode, codel.dropping, codel.take_drop(0.0)) == (Mode.NORMAL, False, False)


def test_one_interval_whose_minimum_stays_above_target_starts_dropping():
    codel = CoDel(TARGET_MS, INTERVAL_MS)
    codel.observe(80.0, now=0.00)  # interval [0, 0.1)
    codel.observe(60.0, now=0.05)
    assert codel.mode is Mode.NORMAL  # not judged before the interval ends
    codel.observe(70.0, now=0.10)  # closes [0, 0.1): min 60 > 50
    assert codel.dropping


def test_one_sample_at_or_below_target_in_the_interval_keeps_it_normal():
    codel = CoDel(TARGET_MS, INTERVAL_MS)
    for t, wait in [(0.00, 500.0), (0.03, 50.0), (0.06, 900.0)]:  # min == target is not above
        codel.observe(wait, t)
    codel.observe(900.0, now=0.10)
    assert codel.mode is Mode.NORMAL


def test_bad_intervals_keep_it_dropping_and_one_good_interval_ends_it():
    codel = CoDel(TARGET_MS, INTERVAL_MS)
    codel.observe(80.0, 0.0)
    for k in range(1, 6):  # intervals ending at 0.1, 0.2, ... all with min 80
        codel.observe(80.0, k * 0.1 + 1e-9)
        assert codel.dropping
    codel.observe(0.0, 0.55)  # the queue emptied during [0.5, 0.6)
    codel.observe(80.0, 0.6 + 1e-9)
    assert codel.mode is Mode.NORMAL
    assert (codel.statistics().intervals_above, codel.statistics().intervals_below) == (5, 1)


def test_empty_intervals_are_judged_by_back_projecting_the_next_sample():
    codel = CoDel(TARGET_MS, INTERVAL_MS)
    codel.observe(0.0, 0.0)  # [0, 0.1): min 0 -> below
    # Nothing for a while, then at 0.65 s an arrival finds the head has waited 450 ms: the
    # queue was never empty since 0.2 s. Intervals [0.1,0.2) .. [0.5,0.6) had heads aged
    # max(0, 450 - (0.65 - start) * 1000) = 0, 0, 100, 200, 300 ms at their starts.
    codel.observe(450.0, 0.65)
    stats = codel.statistics()
    assert (stats.intervals_below, stats.intervals_above) == (3, 3)  # [0,0.1) and two empty ones below
    assert codel.dropping


def test_a_long_idle_gap_with_an_empty_queue_resets_in_one_step():
    codel = CoDel(TARGET_MS, INTERVAL_MS)
    codel.observe(200.0, 0.0)
    codel.observe(200.0, 0.1)
    assert codel.dropping and codel.take_drop(0.1)
    codel.observe(0.0, 3600.0)  # an hour later, queue empty: ~36,000 intervals judged at once
    stats = codel.statistics()
    assert (codel.mode, stats.drops, stats.intervals_above) == (Mode.NORMAL, 0, 2)
    assert stats.intervals_below > 35_000


def test_a_queue_stuck_for_an_hour_is_dropping():
    codel = CoDel(TARGET_MS, INTERVAL_MS)
    codel.observe(0.0, 0.0)
    codel.observe(3_600_000.0, 3600.0)  # the head has waited the whole hour
    assert codel.dropping


def test_take_drop_follows_the_control_law_and_resets_when_the_queue_clears():
    codel = CoDel(TARGET_MS, INTERVAL_MS)
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


def test_the_transition_table_raises_on_an_unknown_event():
    assert transition(Mode.NORMAL, Event.ABOVE) is Mode.DROPPING
    with pytest.raises(RuntimeError, match="no transition"):
        transition(Mode.NORMAL, "bogus")  # type: ignore[arg-type]


def test_repr_and_validation():
    assert "mode=normal" in repr(CoDel(TARGET_MS, INTERVAL_MS))
    with pytest.raises(ValueError):
        CoDel(TARGET_MS, 0)


class Reference:
    """The documented rules, one interval at a time (no shortcut over empty intervals)."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self.min: float | None = None
        self.events: list[bool] = []  # True = ABOVE

    def observe(self, wait: float, now: float) -> None:
        if self.t0 is None:
            self.t0 = now
        interval = INTERVAL_MS / 1000
        while now >= self.t0 + (len(self.events) + 1) * interval:
            start = self.t0 + len(self.events) * interval if self.events else self.t0
            m = self.min if self.min is not None else max(0.0, wait - (now - start) * 1000)
            self.events.append(m > TARGET_MS)
            self.min = None
        self.min = wait if self.min is None else min(self.min, wait)


# Waits end in .5 and times are whole milliseconds, so no projection lands exactly on the target.
steps = st.lists(st.tuples(st.integers(0, 1_000).map(lambda w: w + 0.5), st.integers(0, 700)), max_size=60)


@given(steps)
def test_matches_a_reference_that_judges_every_interval_in_turn(seq):
    codel, ref = CoDel(TARGET_MS, INTERVAL_MS), Reference()
    now_ms = 0
    for wait, dt_ms in seq:
        now_ms += dt_ms
        codel.observe(wait, now_ms / 1000)
        ref.observe(wait, now_ms / 1000)
        stats = codel.statistics()
        assert (stats.intervals_above, stats.intervals_below) == (sum(ref.events), ref.events.count(False))
        assert codel.dropping == (bool(ref.events) and ref.events[-1])


@given(st.lists(st.floats(min_value=0, max_value=1_000), min_size=1, max_size=30))
def test_dropping_iff_the_last_closed_interval_stood(waits):
    """One sample every 37 ms (never on an interval edge)."""
    codel = CoDel(TARGET_MS, INTERVAL_MS)
    at = [i * 0.037 for i in range(len(waits))]
    for t, wait in zip(at, waits, strict=True):
        codel.observe(wait, t)
    closed = int(at[-1] // 0.1)
    minima = [min(w for t, w in zip(at, waits, strict=True) if k * 0.1 <= t < (k + 1) * 0.1) for k in range(closed)]
    assert codel.dropping == (bool(minima) and minima[-1] > TARGET_MS)
    assert not math.isnan(codel.statistics().intervals_above)
