"""Retry-After: grows with the backlog, stays within bounds, spreads clients out."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.retry_after import RetryAfter, drain_ms
from proxy.core.wire import RETRY_AFTER, RETRY_AFTER_MS, Reason, rejection


class FixedRandom:
    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


backlogs = st.integers(min_value=0, max_value=1_000_000)
rates = st.floats(min_value=0, max_value=10_000)
unit = st.floats(min_value=0, max_value=1, exclude_max=True)


def test_drain_time():
    assert drain_ms(0, 0) == 0.0
    assert drain_ms(50, 100) == 500.0
    assert drain_ms(1, 0) == math.inf


@given(backlogs, backlogs, rates)
def test_base_grows_with_backlog(a, b, rate):
    retry = RetryAfter(100, 30_000, 0.2, FixedRandom(0.5))
    small, large = sorted((a, b))
    assert retry.base_ms(drain_ms(small, rate)) <= retry.base_ms(drain_ms(large, rate))


@given(
    st.floats(min_value=0, allow_infinity=True), unit, st.integers(0, 5_000), st.integers(1, 60_000), st.floats(0, 1)
)
def test_always_within_bounds(drain, u, min_ms, max_ms, jitter):
    min_ms = min(min_ms, max_ms)
    value = RetryAfter(min_ms, max_ms, jitter, FixedRandom(u))(drain)
    assert min_ms <= value <= max_ms
    assert isinstance(value, int)


@given(st.floats(min_value=0, max_value=20_000), unit)
def test_never_earlier_than_the_drain_time_below_the_jitter_band(drain, u):
    retry = RetryAfter(100, 30_000, 0.2, FixedRandom(u))
    assert retry(drain) >= retry.base_ms(drain) >= drain


def test_jitter_spreads_clients_even_at_the_cap():
    rng = random.Random(7)
    retry = RetryAfter(100, 10_000, 0.2, rng)
    at_cap = {retry(math.inf) for _ in range(200)}
    assert len(at_cap) > 100
    assert min(at_cap) >= math.ceil(10_000 / 1.2) and max(at_cap) <= 10_000
    mid = [retry(2_000.0) for _ in range(200)]
    assert min(mid) >= 2_000 and max(mid) <= 2_400 and len(set(mid)) > 100


def test_no_jitter_is_the_clamped_drain_time():
    retry = RetryAfter(100, 30_000, 0.0, FixedRandom(0.9))
    assert [retry(x) for x in (0.0, 99.2, 1234.5, 1e9)] == [100, 100, 1235, 30_000]


def test_validation_and_repr():
    with pytest.raises(ValueError):
        RetryAfter(10, 5, 0.1, FixedRandom(0))
    assert "max_ms=5" in repr(RetryAfter(1, 5, 0.1, FixedRandom(0)))


def test_the_wire_writes_whole_seconds_rounded_up_and_the_exact_ms():
    _, headers, _ = rejection(Reason.OVERLOADED, "busy", 1_234)
    values = dict(headers)
    assert values[RETRY_AFTER.encode()] == b"2"
    assert values[RETRY_AFTER_MS.encode()] == b"1234"


# --- scheduled pushback: a virtual queue of promised retries (hand clock) ---


def test_promised_retries_are_spread_one_slot_apart_behind_the_queue():
    ra = RetryAfter(0, 30_000, 0.2, FixedRandom(0.0))
    now = 100.0
    # the queue drains in 200 ms; a slot frees every 12.5 ms: promises at 200, 212.5, 225, ...
    got = [ra.schedule(200.0, now, 12.5) for _ in range(4)]
    assert all(abs(g - want) <= 1 for g, want in zip(got, [200, 212.5, 225, 237.5], strict=True))
    # later, the line has moved on with the clock: 250 ms after, the tail (250 ms) is behind us
    assert ra.schedule(200.0, now + 0.25, 12.5) == 200


def test_a_promise_past_the_deadline_is_not_made():
    ra = RetryAfter(0, 30_000, 0.2, FixedRandom(0.5))
    assert ra.schedule(300.0, 0.0, 10.0, remaining_ms=300.0) is None  # would start at the deadline
    assert ra.schedule(300.0, 0.0, 10.0, remaining_ms=306.0) == 305  # the refused one took no slot


@given(
    st.lists(
        st.tuples(
            st.floats(0, 5_000), st.floats(0, 2.0), st.floats(0, 100), st.floats(0, 10_000), st.floats(0, 1 - 1e-9)
        ),
        min_size=1,
        max_size=40,
    )
)
def test_schedule_is_bounded_never_before_the_drain_and_inside_the_deadline(calls):
    rng = FixedRandom(0.0)
    ra = RetryAfter(100, 8_000, 0.2, rng)
    now = 0.0
    for drain, step_s, slot_ms, remaining_ms, u in calls:
        now += step_s
        rng.u = u
        got = ra.schedule(drain, now, slot_ms, remaining_ms)
        if got is None:  # refused: only a deadline does that, and even the queue's drain reaches it or the line does
            assert remaining_ms <= 8_000 + slot_ms + 1 or drain >= remaining_ms
            continue
        assert 100 <= got <= 8_000
        assert got >= min(math.floor(drain), 8_000)  # not before the queue ahead drains
        assert got < remaining_ms  # the retry starts before the caller's deadline
