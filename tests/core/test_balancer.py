"""Balancer: least outstanding among eligible upstreams, seeded ties, cooldowns."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.balancer import Balancer


def test_fewest_outstanding_wins():
    b = Balancer(3, 5.0, rng=random.Random(0))
    assert b.choose(0.0, outstanding=[4, 1, 2]) == 1
    assert b.choose(0.0, eligible=[0, 2], outstanding=[4, 1, 2]) == 2


def test_ties_are_broken_by_the_injected_rng_reproducibly():
    picks = [Balancer(3, rng=random.Random(7)).choose(0.0, outstanding=[1, 1, 1]) for _ in range(3)]
    assert len(set(picks)) == 1  # same seed, same pick
    b = Balancer(3, rng=random.Random(7))
    seen = Counter(b.choose(0.0, outstanding=[0, 0, 5]) for _ in range(300))
    assert set(seen) == {0, 1}  # both tied upstreams get work, never the busier one
    assert min(seen.values()) > 100


def test_refused_upstream_is_set_aside_for_its_cooldown():
    b = Balancer(2, [5.0, 1.0], rng=random.Random(0))
    b.mark_refused(0, now=10.0)
    assert b.cooling(0, 14.999) and not b.cooling(0, 15.0)
    assert all(b.choose(12.0, outstanding=[0, 9]) == 1 for _ in range(20))
    assert b.choose(15.0, outstanding=[0, 9]) == 0


def test_a_cooling_upstream_is_not_used_while_a_healthy_one_exists():
    b = Balancer(2, 5.0, rng=random.Random(0))
    b.mark_refused(0, now=0.0)
    # Only the cooling one has room: wait for the healthy one rather than a quick 502.
    assert b.choose(1.0, eligible=[0]) is None


def test_all_cooling_uses_the_one_whose_cooldown_ends_first():
    b = Balancer(3, [5.0, 2.0, 9.0], rng=random.Random(0))
    for i in range(3):
        b.mark_refused(i, now=0.0)
    assert b.choose(1.0, outstanding=[0, 9, 0]) == 1
    assert b.choose(1.0, eligible=[0, 2]) == 0
    assert b.choose(1.0, eligible=[]) is None


def test_cooldowns_must_match_the_upstreams():
    with pytest.raises(ValueError):
        Balancer(2, [1.0], rng=random.Random(0))
    with pytest.raises(ValueError):
        Balancer(0, rng=random.Random(0))


def test_statistics_and_repr():
    b = Balancer(2, 5.0, rng=random.Random(0))
    b.mark_refused(1, now=3.0)
    stats = b.statistics(4.0)
    assert stats["cooling"] == [False, True] and stats["refusals"] == [0, 1]
    assert stats["cooldown_until"] == [None, 8.0]
    assert "refusals=[0, 1]" in repr(b)


@given(
    outstanding=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    refused=st.lists(st.booleans(), min_size=6, max_size=6),
    seed=st.integers(0, 1000),
)
def test_choice_is_always_a_least_loaded_healthy_candidate(outstanding, refused, seed):
    n = len(outstanding)
    b = Balancer(n, 10.0, rng=random.Random(seed))
    for i in range(n):
        if refused[i]:
            b.mark_refused(i, 0.0)
    pick = b.choose(1.0, outstanding=outstanding)
    healthy = [i for i in range(n) if not refused[i]] or list(range(n))
    assert pick in healthy
    assert outstanding[pick] == min(outstanding[i] for i in healthy)
