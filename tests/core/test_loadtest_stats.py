"""Percentile, goodput and validity arithmetic on hand-made rows."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.loadtest.analysis import analyze
from proxy.loadtest.records import (
    CONNECT_ERROR,
    NON_JSON,
    NOT_SENT,
    OK,
    TIMEOUT,
    ReasonTable,
    Records,
    StepRun,
)
from proxy.loadtest.shapes import Shape
from proxy.loadtest.stats import figures, in_window, percentile, summarize
from proxy.loadtest.verdict import SLA

SHAPES = (Shape("a", "/x", b"{}"), Shape("b", "/x", b"{}", cls="batch", deadline_ms=50))


def test_nearest_rank_percentiles_of_1_to_100():
    ordered = [float(i) for i in range(1, 101)]
    assert percentile(ordered, 50) == 50
    assert percentile(ordered, 95) == 95
    assert percentile(ordered, 99) == 99
    assert percentile(ordered, 99.9) == 100
    assert percentile(ordered, 100) == 100
    assert percentile([7.0], 50) == percentile([7.0], 99.9) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 0)


@given(
    st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=200),
    st.sampled_from([50.0, 95.0, 99.0, 99.9]),
)
def test_percentile_is_a_sample_with_enough_mass_below(values, q):
    ordered = sorted(values)
    p = percentile(ordered, q)
    assert p in ordered
    assert sum(v <= p for v in ordered) >= q / 100 * len(ordered) - 1e-9
    assert sum(v < p for v in ordered) < q / 100 * len(ordered) + 1e-9


def test_summary_in_milliseconds():
    s = summarize([0.001 * i for i in range(1, 1001)])  # 1..1000 ms
    assert (s.count, s.p50_ms, s.p99_ms, s.p999_ms, s.max_ms) == (
        1000,
        pytest.approx(500),
        pytest.approx(990),
        pytest.approx(999),
        pytest.approx(1000),
    )
    assert s.mean_ms == pytest.approx(500.5)
    assert s.at(99) == s.p99_ms and summarize([]) is None
    with pytest.raises(ValueError):
        s.at(90)


def row(
    rec: Records,
    intended: float,
    latency: float,
    status: int = 200,
    error: int = OK,
    shape: int = 0,
    reason: int = 0,
    ttft: float = math.nan,
    tokens: int = 0,
) -> None:
    i = rec.append(intended, shape)
    rec.sent[i] = intended
    rec.end[i] = intended + latency
    rec.status[i], rec.error[i], rec.reason[i] = status, error, reason
    rec.ttft[i], rec.tokens[i] = ttft, tokens


def hand_made() -> tuple[Records, ReasonTable]:
    reasons = ReasonTable()
    full = reasons.index(b"queue_full")
    rec = Records()
    row(rec, 0.0, 0.010)  # good
    row(rec, 0.1, 0.030)  # good
    row(rec, 0.2, 0.200)  # 2xx but over the 100 ms bound
    row(rec, 0.3, 0.002, status=503, reason=full)  # rejected fast
    row(rec, 0.4, 1.000, status=0, error=TIMEOUT)  # client timeout: censored latency 1 s
    row(rec, 0.5, 0.001, status=0, error=CONNECT_ERROR)  # no latency
    row(rec, 0.6, 0.020, error=NON_JSON)  # 2xx, unusable body
    row(rec, 0.7, 0.040, shape=1)  # class batch, own deadline 50 ms: good
    row(rec, 0.8, 0.060, shape=1)  # over its own 50 ms deadline although under 100 ms
    row(rec, 0.9, 0.090, ttft=0.010, tokens=9)  # a stream: TPOT = 80 ms / 8
    return rec, reasons


def test_figures_and_goodput_on_hand_made_rows():
    rec, reasons = hand_made()
    bounds = {0: 0.100, 1: 0.050}
    f = figures([(rec, list(range(len(rec))))], 2.0, bounds.get, reasons, achieved=7)
    assert (f.requests, f.responses, f.ok, f.good) == (10, 8, 6, 4)
    assert f.goodput_rps == 2.0 and f.offered_rps == 5.0 and f.achieved_rps == 3.5
    assert f.status == {"200": 7, "503": 1}
    assert f.reasons == {"queue_full": 1}
    assert f.errors == {"connect_error": 1, "non_json": 1, "timeout": 1}
    assert f.latency.count == 9  # everything but the connect error
    assert f.latency.max_ms == pytest.approx(1000.0)
    assert f.ttft.count == 1 and f.ttft.p50_ms == pytest.approx(10.0)
    assert f.tpot.p50_ms == pytest.approx(10.0)
    assert f.failed_fraction == pytest.approx(0.4)


def test_no_bound_means_every_2xx_is_good():
    rec, reasons = hand_made()
    f = figures([(rec, list(range(len(rec))))], 1.0, lambda s: None, reasons, achieved=0)
    assert f.good == f.ok == 6


def test_window_selection_by_intended_and_by_end():
    rec, _ = hand_made()
    assert in_window(rec, 0.25, 0.65) == [3, 4, 5, 6]
    assert in_window(rec, 0.25, 0.65, by="end") == [2, 3, 6]  # responses only, by end time


def run_of(rec: Records, start: float = 0.0, duration: float = 1.0, warmup: float = 0.0, lateness=()) -> StepRun:
    r = StepRun(0, 10.0, start, duration, warmup, rec, in_flight_cap=100)
    r.lateness.extend(lateness)
    return r


def test_warmup_rows_are_excluded_from_the_step_figures():
    rec, reasons = hand_made()
    a = analyze([run_of(rec, warmup=0.5)], SHAPES, reasons, SLA.parse("p99=100ms"), unit="rps")
    step = a.steps[0]
    assert step.overall.requests == 5  # intended at 0.5 .. 0.9
    assert step.overall.offered_rps == pytest.approx(10.0)
    assert set(step.by_shape) == {"a", "b@batch"} and set(step.by_class) == {"default", "batch"}
    assert step.by_class["batch"].good == 1


def test_sender_lateness_marks_a_step_invalid():
    rec, reasons = hand_made()
    sla = SLA.parse("p99=2s", max_failed_fraction=1.0)
    ok = analyze([run_of(rec, lateness=[0.001] * 100)], SHAPES, reasons, sla, unit="rps", max_lateness_ms=10)
    assert ok.steps[0].valid and ok.valid and ok.steps[0].verdict.within_sla
    late = analyze(
        [run_of(rec, lateness=[0.001] * 98 + [0.05, 0.06])], SHAPES, reasons, sla, unit="rps", max_lateness_ms=10
    )
    step = late.steps[0]
    assert not step.valid and not late.valid and step.verdict.late
    assert "behind schedule" in step.invalid_reasons[0]
    assert late.knee.step is None and "invalid" in late.knee.summary


def test_backlog_and_unsent_rows_mark_a_step_invalid():
    rec, reasons = hand_made()
    rec.error[9] = NOT_SENT
    run = run_of(rec)
    run.backlogged = 3
    step = analyze([run], SHAPES, reasons, SLA(), unit="rps").steps[0]
    assert not step.valid
    assert any("in-flight cap of 100" in r for r in step.invalid_reasons)
    assert any("never sent" in r for r in step.invalid_reasons)
    assert step.overall.errors["not_sent"] == 1


def test_achieved_counts_responses_ending_in_the_window_from_any_step():
    first, second, reasons = Records(), Records(), ReasonTable()
    row(first, 0.5, 0.8)  # intended in step 0, answered during step 1
    row(second, 1.2, 0.1)
    a = analyze([run_of(first), run_of(second, start=1.0)], SHAPES, reasons, SLA(), unit="rps")
    assert [s.overall.achieved_rps for s in a.steps] == [0.0, 2.0]
    assert a.overall.requests == 2 and a.overall.achieved_rps == pytest.approx(1.0)
