"""Knee detection on synthetic curves, SLA parsing and cost arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.loadtest.stats import Figures, Summary
from proxy.loadtest.verdict import SLA, StepVerdict, cost, find_knee, parse_duration_ms

SLA_500 = SLA.parse("p99=500ms")


def curve(
    p99s: list[float], loads: list[float] | None = None, invalid: frozenset[int] = frozenset(), sla: SLA = SLA_500
) -> list[StepVerdict]:
    loads = loads or [100.0 * (i + 1) for i in range(len(p99s))]
    out = []
    for i, (load, p99) in enumerate(zip(loads, p99s, strict=False)):
        misses = (f"p99 {p99} > 500",) if p99 > 500 else ()
        out.append(StepVerdict(i, load, i not in invalid, not misses, i in invalid, misses, load, load * 0.98, p99))
    return out


def test_knee_is_the_last_step_before_p99_crosses_the_sla():
    knee = find_knee(curve([40, 45, 60, 120, 480, 900, 3000]), "rps", SLA_500)
    assert (knee.step, knee.load, knee.lower_bound) == (4, 500.0, False)
    assert knee.summary.startswith("Rated capacity 500 req/s")
    assert "at 600 req/s it broke" in knee.summary and "Alert at 80%: 400 req/s" in knee.summary


def test_all_steps_within_sla_give_a_lower_bound():
    knee = find_knee(curve([40, 50, 60]), "users", SLA_500)
    assert knee.step == 2 and knee.lower_bound and "at least" in knee.summary and "users" in knee.summary


def test_no_knee_when_the_first_step_already_misses():
    knee = find_knee(curve([700, 900]), "rps", SLA_500)
    assert knee.step is None and knee.load is None and "lowest step (100 req/s) missed" in knee.summary


def test_a_pass_above_a_failure_does_not_count():
    knee = find_knee(curve([40, 600, 300, 900]), "rps", SLA_500)
    assert knee.step == 0 and "passed again; not counted" in knee.summary


def test_an_invalid_step_ends_the_run_and_says_capacity_may_be_higher():
    knee = find_knee(curve([40, 50, 60, 70], invalid=frozenset({2})), "rps", SLA_500)
    assert knee.step == 1 and "invalid" in knee.summary and "may be higher" in knee.summary


def test_steps_are_judged_in_load_order_not_run_order():
    knee = find_knee(curve([900, 40, 60], loads=[300, 100, 200]), "rps", SLA_500)
    assert knee.load == 200


def test_no_sla_no_knee():
    knee = find_knee(curve([40]), "rps", SLA())
    assert knee.step is None and "No SLA" in knee.summary


@given(st.lists(st.floats(min_value=1, max_value=5000, allow_nan=False), min_size=1, max_size=12))
def test_knee_on_monotone_curves_is_the_last_load_within_sla(raw):
    p99s = sorted(raw)
    knee = find_knee(curve(p99s), "rps", SLA_500)
    within = [100.0 * (i + 1) for i, p in enumerate(p99s) if p <= 500]
    assert knee.load == (within[-1] if within else None)


def fig(p50: float, p99: float, requests: int = 100, ok: int = 100) -> Figures:
    lat = Summary(requests, p50, p50, p99, p99, p99, p99)
    return Figures(requests, requests, ok, ok, 10.0, 10.0, 10.0, lat)


def test_sla_parse_and_misses():
    sla = SLA.parse("p99=0.5s, p50=200ms", class_deadlines_ms={"interactive": 300})
    assert sla.targets == ((50.0, 0.2), (99.0, 0.5)) and sla.bound_s == 0.5
    assert sla.describe() == "p50 <= 200 ms, p99 <= 500 ms, interactive p99 <= 300 ms"
    assert sla.misses(fig(100, 400), {"interactive": fig(100, 250)}) == []
    assert sla.misses(fig(250, 400), {}) == ["p50 250 ms > 200 ms"]
    assert sla.misses(fig(100, 400), {"interactive": fig(100, 350)}) == ["interactive p99 350 ms > 300 ms"]
    assert sla.misses(fig(100, 400, ok=90), {}) == ["10.0% failed > 1.0%"]
    for bad in ("p99<500ms", "p90=1s", "p99=fast"):
        with pytest.raises(ValueError):
            SLA.parse(bad)
    assert SLA.parse("pmax=2s").targets == ((100.0, 2.0),)
    assert parse_duration_ms("1.5s") == 1500 and parse_duration_ms("250") == 250


def test_cost_per_million_good_requests():
    c = cost(goodput_rps=100.0, gpus=2, usd_per_gpu_hour=2.5)
    # 1e6 requests at 100/s take 10,000 s = 2.777 h on each of 2 GPUs.
    assert c["gpu_hours_per_million_good"] == pytest.approx(2 * 1e6 / 100 / 3600)
    assert c["usd_per_million_good"] == pytest.approx(c["gpu_hours_per_million_good"] * 2.5)
    assert cost(100.0, 1, None)["usd_per_million_good"] is None
    assert cost(0.0, 1, 2.0) is None and cost(None, 1, 2.0) is None


def test_no_rated_capacity_on_a_busy_machine_names_the_lateness_and_the_flag():
    """Every step invalid because the generator itself was late (a shared runner): the message says how
    late it was and which flag allows more, instead of only "No rated capacity"."""
    late = [
        StepVerdict(i, load, False, True, True, (), load, load, 50.0, ("generator behind schedule",), 12.5)
        for i, load in enumerate([10, 20, 30])
    ]
    knee = find_knee(late, "rps", SLA_500)
    assert knee.step is None and knee.summary.startswith("No rated capacity: the lowest step (10 req/s)")
    assert "p99 sender lateness 12.5 ms" in knee.summary and "--max-lateness-ms 20" in knee.summary
