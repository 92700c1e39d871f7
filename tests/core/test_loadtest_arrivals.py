"""Arrival schedules and traces: rate and inter-arrival distribution under a fixed seed, determinism."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from proxy.loadtest import arrivals
from proxy.loadtest.shapes import Mix
from proxy.loadtest.trace import CLOSED_CYCLE, Plan, Step, build_trace, parse_loads


def gaps(offsets) -> list[float]:
    return [b - a for a, b in itertools.pairwise(offsets)]


def test_constant_arrivals_are_evenly_spaced_and_counted_exactly():
    offs = arrivals.constant_offsets(250.0, 2.0)
    assert len(offs) == 500
    assert offs[0] == 0.0 and offs[-1] < 2.0
    assert all(g == pytest.approx(0.004) for g in gaps(offs))


def test_poisson_rate_and_exponential_gaps_with_a_fixed_seed():
    rate, duration = 1000.0, 20.0
    offs = arrivals.poisson_offsets(rate, duration, random.Random(7))
    n = len(offs)
    # Count: Poisson(20000), sd 141; this seed lands well within 3 sd.
    assert abs(n - rate * duration) < 3 * math.sqrt(rate * duration)
    assert list(offs) == sorted(offs) and offs[0] >= 0 and offs[-1] < duration
    g = sorted(gaps(offs))
    mean = sum(g) / len(g)
    sd = math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1))
    assert mean == pytest.approx(1 / rate, rel=0.03)
    assert sd / mean == pytest.approx(1.0, rel=0.03)  # exponential: coefficient of variation 1
    # Kolmogorov-Smirnov against Exp(rate): D below the 1% critical value 1.63/sqrt(n).
    d = max(
        max(abs((i + 1) / len(g) - (1 - math.exp(-rate * x))), abs(i / len(g) - (1 - math.exp(-rate * x))))
        for i, x in enumerate(g)
    )
    assert d < 1.63 / math.sqrt(len(g))
    # Memorylessness, roughly: the share of gaps above the mean is e^-1.
    assert sum(x > 1 / rate for x in g) / len(g) == pytest.approx(math.exp(-1), abs=0.01)


def test_poisson_schedule_is_reproducible_per_seed():
    a = arrivals.poisson_offsets(50, 10, random.Random(1))
    b = arrivals.poisson_offsets(50, 10, random.Random(1))
    c = arrivals.poisson_offsets(50, 10, random.Random(2))
    assert a == b and a != c


@pytest.mark.parametrize("bad", [(0, 1), (-1, 1), (10, 0), (math.inf, 1)])
def test_bad_rates_and_durations_are_refused(bad):
    with pytest.raises(ValueError):
        arrivals.constant_offsets(*bad)


def test_think_gaps():
    rng = random.Random(3)
    assert arrivals.think_gap("constant", 0.2, rng) == 0.2
    assert arrivals.think_gap("exponential", 0.0, rng) == 0.0
    draws = [arrivals.think_gap("exponential", 0.2, rng) for _ in range(20000)]
    assert sum(draws) / len(draws) == pytest.approx(0.2, rel=0.03)
    with pytest.raises(ValueError, match="think-time"):
        arrivals.think_gap("uniform", 0.2, rng)


def test_parse_loads():
    assert parse_loads("100,200, 400") == [100, 200, 400]
    assert parse_loads("50:200:50") == [50, 100, 150, 200]
    assert parse_loads("1:2:0.5") == [1, 1.5, 2]
    for bad in ("", "a,b", "10:5:1", "1:5:0", "0,10"):
        with pytest.raises(ValueError, match="load list"):
            parse_loads(bad)


def test_trace_is_a_value_of_its_seed_and_subsets_match_the_whole():
    mix = Mix.parse("short_chat=3,long_chat=1")
    plan = Plan.sweep([100, 200, 300], step_s=5, warmup_s=1)
    t1, t2 = build_trace(plan, mix, 11), build_trace(plan, mix, 11)
    for a, b in zip(t1.steps, t2.steps, strict=False):
        assert a.offsets == b.offsets and a.choices == b.choices
    one = t1.subset([1]).steps
    assert len(one) == 1 and one[0].offsets == t1.steps[1].offsets and one[0].choices == t1.steps[1].choices
    other = build_trace(plan, mix, 12)
    assert other.steps[0].offsets != t1.steps[0].offsets


def test_shape_draws_follow_the_mix_weights():
    mix = Mix.parse("short_chat=3,long_chat=1")
    trace = build_trace(Plan.sweep([2000], step_s=10), mix, 5)
    counts = Counter(trace.steps[0].choices)
    assert counts[0] / sum(counts.values()) == pytest.approx(0.75, abs=0.01)


def test_unique_keys_and_duplicates_repeat_key_and_shape():
    mix = Mix.parse("short_chat,long_chat,embed_short")
    plan = Plan.sweep([500], step_s=4)
    unique = build_trace(plan, mix, 1, idempotency="unique").steps[0]
    assert len(set(unique.keys)) == len(unique)
    dup = build_trace(plan, mix, 1, idempotency="unique", dup_fraction=0.2).steps[0]
    first_choice: dict[int, int] = {}
    for key, choice in zip(dup.keys, dup.choices, strict=False):
        assert first_choice.setdefault(key, choice) == choice  # a repeated key always carries the same request
    repeated = len(dup) - len(set(dup.keys))
    assert repeated / len(dup) == pytest.approx(0.2, abs=0.03)
    assert build_trace(plan, mix, 1).key(-1) is None
    with pytest.raises(ValueError, match="dup_fraction"):
        build_trace(plan, mix, 1, dup_fraction=0.1)


def test_closed_loop_trace_cycles_choices_with_fresh_keys():
    plan = Plan(steps=(Step(4, 5.0),), mode="closed")
    st = build_trace(plan, Mix.parse("short_chat,long_chat"), 2, idempotency="unique").steps[0]
    assert len(st) == 0 and len(st.choices) == CLOSED_CYCLE
    a, b = st.closed_request(3), st.closed_request(3 + CLOSED_CYCLE)
    assert a[0] == b[0] and a[1] != b[1]
    with pytest.raises(ValueError, match="whole numbers"):
        Plan(steps=(Step(2.5, 5.0),), mode="closed")


def test_steps_and_plans_are_validated():
    with pytest.raises(ValueError, match="warm-up"):
        Step(10, 5, warmup_s=5)
    with pytest.raises(ValueError, match="mode"):
        Plan(steps=(Step(1, 1),), mode="half-open")
    with pytest.raises(ValueError, match="arrival"):
        Plan(steps=(Step(1, 1),), arrival="bursty")
