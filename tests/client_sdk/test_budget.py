"""Retry budget arithmetic on a hand-advanced clock (binary-exact numbers only)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_sdk.budget import RetryBudget


def test_starts_full_and_spends_one_token_per_retry() -> None:
    budget = RetryBudget(ratio=0.25, floor_per_s=0.0, max_tokens=2.0)
    assert budget.try_withdraw(0.0) is True
    assert budget.try_withdraw(0.0) is True
    assert budget.try_withdraw(0.0) is False
    assert budget.statistics(0.0).refusals == 1
    assert budget.tokens(0.0) == 0.0


def test_calls_deposit_the_ratio() -> None:
    budget = RetryBudget(ratio=0.25, floor_per_s=0.0, max_tokens=1.0)
    assert budget.try_withdraw(0.0)
    for _ in range(3):
        budget.deposit(0.0)
    assert budget.tokens(0.0) == 0.75
    assert budget.try_withdraw(0.0) is False  # nothing spent on a refusal
    budget.deposit(0.0)
    assert budget.try_withdraw(0.0) is True  # four calls earned one retry


def test_time_refills_at_the_floor_rate_up_to_the_cap() -> None:
    budget = RetryBudget(ratio=0.0, floor_per_s=4.0, max_tokens=2.0)
    assert budget.try_withdraw(10.0) and budget.try_withdraw(10.0)
    assert budget.tokens(10.125) == 0.5
    assert budget.tokens(10.25) == 1.0
    assert budget.tokens(99.0) == 2.0  # capped


def test_clock_stepping_back_refills_nothing() -> None:
    budget = RetryBudget(ratio=0.0, floor_per_s=4.0, max_tokens=2.0)
    budget.try_withdraw(10.0)
    assert budget.tokens(5.0) == 1.0
    assert budget.tokens(10.25) == 2.0


def test_deposits_never_exceed_the_cap() -> None:
    budget = RetryBudget(ratio=0.5, floor_per_s=0.0, max_tokens=1.0)
    budget.deposit(0.0)
    assert budget.tokens(0.0) == 1.0


def test_defaults_match_the_docs() -> None:
    budget = RetryBudget()
    assert (budget.ratio, budget.floor_per_s, budget.max_tokens) == (0.1, 10.0, 10.0)
    assert "tokens=10.00/10" in repr(budget)


@pytest.mark.parametrize("kwargs", [{"ratio": -0.1}, {"floor_per_s": -1}, {"max_tokens": 0.5}])
def test_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryBudget(**kwargs)


@settings(deadline=None)  # shared, noisy machines: no timing in unit tests
@given(
    events=st.lists(st.tuples(st.floats(0, 2), st.booleans()), max_size=200),
    ratio=st.floats(0, 1),
    floor=st.floats(0, 20),
    cap=st.floats(1, 20),
)
def test_retries_never_exceed_cap_plus_ratio_of_calls_plus_floor_over_time(
    events: list[tuple[float, bool]], ratio: float, floor: float, cap: float
) -> None:
    """The invariant that stops a storm: granted <= max_tokens + ratio*calls + floor*elapsed."""
    budget = RetryBudget(ratio=ratio, floor_per_s=floor, max_tokens=cap)
    now, calls, granted = 0.0, 0, 0
    for step, is_call in events:
        now += step
        if is_call:
            budget.deposit(now)
            calls += 1
        elif budget.try_withdraw(now):
            granted += 1
    assert granted <= cap + ratio * calls + floor * now + 1e-9
