"""Backoff arithmetic: exact with a stubbed or seeded RNG, never statistical."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_sdk.backoff import Backoff
from tests.client_sdk.fakes import FixedRandom


def test_ceilings_grow_by_the_multiplier_up_to_the_cap() -> None:
    backoff = Backoff(base_s=0.1, cap_s=1.0, multiplier=2.0)
    assert [backoff.ceiling(n) for n in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_defaults_are_base_100ms_cap_5s_multiplier_2() -> None:
    backoff = Backoff()
    assert (backoff.base_s, backoff.cap_s, backoff.multiplier) == (0.1, 5.0, 2.0)
    assert backoff.ceiling(7) == 5.0  # 0.1 * 2**6 = 6.4 -> capped


def test_full_jitter_scales_the_ceiling_by_the_random_draw() -> None:
    backoff = Backoff(base_s=0.5, cap_s=8.0, multiplier=2.0)
    assert backoff.delay(1, FixedRandom(0.5)) == 0.25
    assert backoff.delay(3, FixedRandom(0.25)) == 0.5
    assert backoff.delay(3, FixedRandom(0.0)) == 0.0


def test_floor_is_added_below_the_jitter() -> None:
    backoff = Backoff(base_s=0.5, cap_s=8.0, multiplier=2.0)
    assert backoff.delay(2, FixedRandom(0.5), floor_s=1.25) == 1.75
    assert backoff.delay(2, FixedRandom(0.0), floor_s=1.25) == 1.25
    assert backoff.delay(2, FixedRandom(0.5), floor_s=-3.0) == 0.5  # a negative floor is no floor


def test_seeded_rng_gives_the_same_schedule_as_the_formula() -> None:
    backoff = Backoff()
    got = [backoff.delay(n, random.Random(42 + n)) for n in range(1, 6)]
    want = [random.Random(42 + n).random() * min(5.0, 0.1 * 2 ** (n - 1)) for n in range(1, 6)]
    assert got == want


def test_huge_retry_numbers_do_not_overflow() -> None:
    assert Backoff(multiplier=10.0).ceiling(100_000) == 5.0


@pytest.mark.parametrize("kwargs", [{"base_s": -1}, {"cap_s": -1}, {"multiplier": 0.5}])
def test_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)


def test_retry_numbers_are_one_based() -> None:
    with pytest.raises(ValueError):
        Backoff().ceiling(0)


@settings(deadline=None)  # shared, noisy machines: no timing in unit tests
@given(
    n=st.integers(1, 60),
    draw=st.floats(0, 1, exclude_max=True),
    floor=st.floats(0, 100),
    base=st.floats(0, 10),
    cap=st.floats(0, 60),
)
def test_delay_stays_within_floor_and_floor_plus_ceiling(
    n: int, draw: float, floor: float, base: float, cap: float
) -> None:
    backoff = Backoff(base_s=base, cap_s=cap, multiplier=2.0)
    delay = backoff.delay(n, FixedRandom(draw), floor_s=floor)
    assert floor <= delay <= floor + min(cap, backoff.ceiling(n))
