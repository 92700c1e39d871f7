"""Warm-up probe plan and success criterion on synthetic latencies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.warmup import (
    FixedCount,
    ProbePlan,
    ProbeResult,
    StableLatency,
    criterion_met,
    spread_pct,
)


def ok(latency, shape=0):
    return ProbeResult(shape, True, latency, "200")


def bad(shape=0, detail="503"):
    return ProbeResult(shape, False, 0.01, detail)


STABLE = StableLatency(last_n=3, within_pct=25.0)


def test_spread():
    assert spread_pct([1.0, 1.1, 1.2]) == pytest.approx(20.0)
    assert spread_pct([2.0]) == 0.0
    assert spread_pct([0.0, 0.0]) == 0.0 and spread_pct([0.0, 1.0]) == float("inf")


def test_stable_needs_latency_to_stop_falling():
    compiling = [ok(5.0), ok(2.0), ok(1.3)]
    assert not criterion_met(STABLE, compiling)  # 2.0, 1.3 beat 5.0 by far
    assert not criterion_met(STABLE, compiling + [ok(1.0)])  # 1.3, 1.0 beat 2.0 by 50 %
    assert criterion_met(STABLE, compiling + [ok(1.0), ok(1.0)])  # 1.0, 1.0 beat 1.3 by 23 %: within 25 %
    assert not criterion_met(StableLatency(3, 10.0), compiling + [ok(1.0), ok(1.0)])  # ... but not within 10 %
    assert criterion_met(StableLatency(3, 10.0), compiling + [ok(1.0), ok(1.0), ok(1.05)])


def test_stable_boundary_is_inclusive():
    assert criterion_met(STABLE, [ok(1.0), ok(0.75), ok(0.8)])  # 25 % faster than the best before: still noise
    assert not criterion_met(STABLE, [ok(1.0), ok(0.7499), ok(0.8)])


def test_stable_tolerates_jitter_the_old_spread_rule_did_not():
    # A CPU server's latencies jitter +-30 % around 1 s from the first probe: warm at once.
    jitter = [ok(1.0), ok(1.3), ok(0.8)]
    assert spread_pct([r.latency_s for r in jitter]) > 25.0  # the old rule: never stable
    assert criterion_met(STABLE, jitter)


def test_stable_is_false_while_every_probe_beats_the_last():
    decaying = [ok(20.0 - 1.9 * k) for k in range(10)]  # the sim pod's cold penalty: linear decay
    assert not any(criterion_met(StableLatency(3, 10.0), decaying[:k]) for k in range(1, 11))


@given(st.lists(st.floats(0.01, 10.0), min_size=3, max_size=12), st.floats(0.0, 100.0))
def test_stable_holds_whenever_the_last_n_agree(latencies, pct):
    results = [ok(x) for x in latencies]
    tail = latencies[-3:]
    if spread_pct(tail) <= pct:
        assert criterion_met(StableLatency(3, pct), results)


def test_stable_rejects_a_failure_among_the_last_n_and_too_few_results():
    assert not criterion_met(STABLE, [ok(1.0), bad(), ok(1.0)])
    assert criterion_met(STABLE, [bad(), ok(1.0), ok(1.0), ok(1.0)])
    assert not criterion_met(STABLE, [ok(1.0), ok(1.0)])


def test_fixed_count_counts_successes_anywhere():
    assert criterion_met(FixedCount(2), [bad(), ok(9.0), bad(), ok(0.1)])
    assert not criterion_met(FixedCount(2), [bad(), ok(9.0), bad()])


def test_plan_round_robins_shapes_and_passes_when_all_are_warm():
    plan = ProbePlan([4, 4], FixedCount(2))
    issued = [plan.next_probe() for _ in range(4)]
    assert issued == [0, 1, 0, 1]
    for shape in issued:
        plan.record(ok(0.1, shape))
    v = plan.verdict()
    assert v.done and v.passed and plan.next_probe() is None


def test_a_met_shape_gets_no_more_probes():
    plan = ProbePlan([5, 5], FixedCount(1))
    assert plan.next_probe() == 0
    plan.record(ok(0.1, 0))
    assert [plan.next_probe(), plan.next_probe(), plan.next_probe()] == [1, 1, 1]
    assert not plan.verdict().done


def test_plan_fails_once_a_shape_used_all_its_probes():
    plan = ProbePlan([3, 8], STABLE)
    latencies = {0: [3.0, 2.0, 1.0], 1: [1.0] * 8}
    while (shape := plan.next_probe()) is not None:
        plan.record(ok(latencies[shape].pop(0), shape))
        if plan.verdict().done:
            break
    v = plan.verdict()
    assert v.done and not v.passed
    assert v.reason.startswith("shape 0: criterion not met in 3 probes") and "1000 ms" in v.reason


def test_failure_reason_names_the_last_error():
    plan = ProbePlan([2], FixedCount(1))
    for _ in range(2):
        plan.next_probe()
    plan.record(bad(detail="timeout"))
    plan.record(bad(detail="ConnectError"))
    assert "2 failed, last: ConnectError" in plan.verdict().reason


def test_no_shapes_passes_at_once():
    plan = ProbePlan([], STABLE)
    assert plan.verdict().passed and plan.next_probe() is None


def test_result_for_a_probe_never_issued_is_a_bug():
    plan = ProbePlan([2], STABLE)
    with pytest.raises(ValueError):
        plan.record(ok(1.0))


def test_statistics_and_repr():
    plan = ProbePlan([2, 2], FixedCount(1))
    plan.next_probe()
    plan.record(ok(0.2, 0))
    s = plan.statistics()
    assert (s[0].issued, s[0].completed, s[0].succeeded, s[0].met, s[0].last_latency_s) == (1, 1, 1, True, 0.2)
    assert (s[1].issued, s[1].met) == (0, False)
    assert "1/2 shapes met" in repr(plan)


@settings(deadline=None)
@given(
    counts=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    outcomes=st.lists(st.tuples(st.booleans(), st.floats(0.001, 10.0)), min_size=60, max_size=60),
    stable=st.booleans(),
)
def test_plan_invariants_over_any_outcomes(counts, outcomes, stable):
    criterion = StableLatency(2, 50.0) if stable else FixedCount(1)
    plan = ProbePlan(counts, criterion)
    results: dict[int, list[ProbeResult]] = {i: [] for i in range(len(counts))}
    for success, latency in outcomes:
        shape = plan.next_probe()
        if shape is None:
            break
        r = ProbeResult(shape, success, latency)
        plan.record(r)
        results[shape].append(r)
    v = plan.verdict()
    assert v.done  # sequential probes always reach a verdict within the counts
    assert all(len(results[i]) <= c for i, c in enumerate(counts))
    met = [any(criterion_met(criterion, rs[:k]) for k in range(1, len(rs) + 1)) for rs in results.values()]
    assert v.passed == all(met)
