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
