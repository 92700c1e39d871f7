"""Deadlines: parsing and capping, the admission estimate, retry timing, in-queue expiry, timeout hint.

Times are `fractions.Fraction` where a property must hold exactly: the deadline module
only adds, subtracts, multiplies and divides, so exact inputs give exact decisions.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import deadline as dl
from proxy.core.wire import GRPC_TIMEOUT, REQUEST_TIMEOUT_MS, HeaderError

ms = st.fractions(min_value=0, max_value=100_000, max_denominator=1000)
times = st.fractions(min_value=0, max_value=10_000, max_denominator=1000)


@pytest.mark.parametrize(
    ("header", "grpc", "expected"),
    [
        (None, None, 5_000),  # class default
        (b"250", None, 250),
        (None, b"2S", 2_000),
        (None, b"1500m", 1_500),
        (None, b"1500u", 2),  # rounded up to whole ms
        (b"800", b"1S", 800),  # both sent: the tighter one
        (b"3000", b"1S", 1_000),
        (b"999999", None, 60_000),  # capped at the class maximum
        (None, b"1H", 60_000),
        (b"0", None, 0),  # already out of time: becomes an expired deadline, not an error
    ],
)
def test_budget_from_headers_default_and_cap(header, grpc, expected):
    assert dl.budget_ms(header, grpc, default_ms=5_000, max_ms=60_000) == expected


def test_default_is_capped_too():
    assert dl.budget_ms(None, None, default_ms=90_000, max_ms=60_000) == 60_000


@pytest.mark.parametrize(
    ("header", "grpc", "name"),
    [
        (b"-5", None, REQUEST_TIMEOUT_MS),
        (b"1.5", None, REQUEST_TIMEOUT_MS),
        (None, b"5x", GRPC_TIMEOUT),
        (None, b"S", GRPC_TIMEOUT),
    ],
)
def test_malformed_timeout_headers_name_the_header(header, grpc, name):
    with pytest.raises(HeaderError) as info:
        dl.budget_ms(header, grpc, default_ms=1, max_ms=2)
    assert info.value.header == name


def test_deadline_is_absolute():
    assert dl.deadline_at(100.0, 250) == pytest.approx(100.25)
    assert dl.deadline_at(Fraction(7), 1500) == Fraction(17, 2)


def test_service_estimate_falls_back_to_the_model_without_samples():
    assert dl.service_estimate_ms(None, 120.0) == 120.0
    assert dl.service_estimate_ms(80.0, 120.0) == 80.0


@given(times, ms, ms, ms)
def test_admission_rejects_exactly_when_the_estimate_misses_the_deadline(now, budget, queue_wait, service):
    deadline = dl.deadline_at(now, budget)
    verdict = dl.check(now, deadline, queue_wait, service)
    misses = now + (queue_wait + service) / 1000 > deadline
    assert isinstance(verdict, dl.Unmeetable) == misses
    if misses:
        assert verdict.miss_ms == queue_wait + service - budget > 0
    else:
        assert verdict.slack_ms == budget - queue_wait - service >= 0


@given(times, ms, ms, ms)
def test_retry_after_is_the_earliest_time_the_same_budget_could_be_met(now, budget, queue_wait, service):
    verdict = dl.check(now, dl.deadline_at(now, budget), queue_wait, service, budget=budget)
    if not isinstance(verdict, dl.Unmeetable):
        return
    if service > budget:
        assert verdict.retry_after_ms is None  # no amount of waiting helps; a larger budget would
        return
    r = verdict.retry_after_ms
    later = now + r / 1000
    again = dl.check(later, dl.deadline_at(later, budget), max(0, queue_wait - r), service)
    assert isinstance(again, dl.Meetable)
    if r > 0:  # and not a moment earlier
        sooner = r - Fraction(1, 1000)
        earlier = now + sooner / 1000
        early = dl.check(earlier, dl.deadline_at(earlier, budget), max(0, queue_wait - sooner), service)
        assert isinstance(early, dl.Unmeetable)


def test_unmeetable_example():
    verdict = dl.check(10.0, 10.5, queue_wait=400.0, service=300.0)
    assert isinstance(verdict, dl.Unmeetable)
    assert verdict.miss_ms == pytest.approx(200.0)
    assert verdict.retry_after_ms == pytest.approx(200.0)
    assert verdict.completion == pytest.approx(10.7)


def test_unknown_drain_is_unmeetable_with_an_infinite_retry():
    verdict = dl.check(0.0, 1.0, queue_wait=float("inf"), service=10.0)
    assert isinstance(verdict, dl.Unmeetable)
    assert verdict.retry_after_ms == float("inf")


@given(times, times, ms)
def test_a_passed_deadline_always_expires(now, deadline, service):
    if deadline <= now:
        assert dl.should_expire(now, deadline, service)
    elif (deadline - now) * 1000 >= service:
        assert not dl.should_expire(now, deadline, service)
    else:
        assert dl.should_expire(now, deadline, service)


@given(st.lists(st.tuples(times, ms), min_size=1, max_size=40), ms, st.lists(times, min_size=1, max_size=40))
def test_nothing_expired_is_forwarded(queued, service, forward_times):
    """A dispatcher that checks should_expire before forwarding only forwards work that can finish in time."""
    queue = [(dl.deadline_at(arrival, budget), budget) for arrival, budget in queued]
    for now in sorted(forward_times):
        if not queue:
            break
        deadline, _ = queue.pop(0)
        if dl.should_expire(now, deadline, service):
            continue  # answered 504 deadline_expired, never forwarded
        assert now < deadline
        assert now + service / 1000 <= deadline


@pytest.mark.parametrize(
    ("p99", "expected"),
    [(200.0, 500), (10.0, 100), (1_000_000.0, 600_000), (100.2, 251)],
)
def test_timeout_hint(p99, expected):
    assert dl.timeout_hint_ms(p99, 2.5, min_ms=100, max_ms=600_000) == expected
