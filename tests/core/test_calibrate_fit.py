"""Calibration's conclusions from figures by hand: priors, knee, engine batch, cancel habit, budgets."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.calibrate.fit import (
    CancelTrial,
    Loaded,
    Point,
    SweepStep,
    at_limit,
    budgets,
    cancel_verdict,
    engine_batch,
    engine_queue_ceiling,
    fit_service,
    knee,
    limit_for,
    metrics_interval_s,
    round_up,
    sweep_done,
    turn,
)

SHAPES = [(16, 16), (16, 128), (256, 16)]


@given(st.floats(0, 200), st.floats(0, 2), st.floats(0, 50))
def test_three_shapes_recover_the_three_terms(base, per_prompt, per_output):
    points = [Point(p, o, base + per_prompt * p + per_output * o) for p, o in SHAPES]
    c = fit_service(points)
    assert c.base_ms == pytest.approx(base, abs=1e-6)
    assert c.ms_per_prompt_token == pytest.approx(per_prompt, abs=1e-6)
    assert c.ms_per_output_token == pytest.approx(per_output, abs=1e-6)


def test_no_term_goes_below_zero():
    # HTTP overhead leaking in: the long prompt came back *faster* (the issue's -0.1 ms/token on vLLM).
    c = fit_service([Point(16, 16, 100.0), Point(16, 128, 660.0), Point(256, 16, 80.0)])
    assert c.ms_per_prompt_token == 0.0
    assert c.ms_per_output_token == pytest.approx(5.0, rel=0.05)  # refitted with the prompt term at 0
    assert c.base_ms >= 0 and all(v >= 0 for v in (c.base_ms, c.ms_per_prompt_token, c.ms_per_output_token))


def test_a_term_that_never_varies_stays_zero():
    emb = fit_service([Point(8, 0, 10.0), Point(256, 0, 60.0)])  # embeddings: no output
    assert emb.ms_per_output_token == 0.0 and emb.ms_per_prompt_token == pytest.approx(50 / 248)
    fixed = fit_service([Point(0, 0, 220.0)])  # a named request
    assert (fixed.base_ms, fixed.ms_per_prompt_token, fixed.ms_per_output_token) == (220.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        fit_service([])


def steps(*rates, running=None, waiting=None):
    out = []
    for i, r in enumerate(rates):
        run = None if running is None else running[i]
        wait = None if waiting is None else waiting[i]
        out.append(SweepStep(2**i, r, 10.0 * 2**i, 20.0 * 2**i, 100, 0, run, wait))
    return out


def test_the_knee_is_the_first_step_near_the_best_throughput():
    serial = steps(3.0, 3.1, 2.9)
    assert knee(serial).concurrency == 1
    batching = steps(4.0, 7.9, 15.0, 28.0, 30.0, 30.5)
    assert knee(batching).concurrency == 16  # 30 >= 0.95 * 30.5 > 28
    triton = steps(4.4, 8.5, 17.1, 36.0, 67.6, 73.9, 75.0)  # PyTriton, batches of 16
    assert knee(triton).concurrency == 32
    # A step that mostly failed does not count as the best.
    broken = [*steps(4.0, 8.0), SweepStep(4, 50.0, 1, 1, 100, 60)]
    assert knee(broken).concurrency == 2


def test_the_sweep_stops_once_throughput_is_flat_or_failing():
    assert not sweep_done(steps(4.0, 8.0))
    assert not sweep_done(steps(4.0, 8.0, 8.5))  # one flat step is not a plateau
    assert sweep_done(steps(4.0, 8.0, 8.5, 8.6))
    assert sweep_done(steps(3.0, 3.1, 3.0))  # serial: flat from the start
    assert sweep_done([SweepStep(1, 1.0, 1, 1, 10, 5)])


def test_the_limit_is_capped_at_the_engines_own_batch():
    # Client-side throughput still grew to 16 (HTTP overhead overlapped), but the engine ran 8 with others waiting.
    sweep = steps(29, 53, 97, 180, 202, 211, running=[1, 2, 4, 8, 8, 8], waiting=[0, 1, 3, 3, 8, 23])
    assert knee(sweep).concurrency == 16 and engine_batch(sweep) == 8 and limit_for(sweep) == 8
    # Waiting blips while every user runs are not a full engine.
    assert engine_batch(steps(10, 20, running=[1, 2], waiting=[1, 1])) is None
    assert limit_for(steps(10, 20, 21, 21)) == 2  # no gauges: the knee


def test_cancel_verdicts():
    keeps = CancelTrial("latency", 600.0, delay_ms=640.0)
    stops = CancelTrial("latency", 600.0, delay_ms=20.0)
    unclear = CancelTrial("latency", 600.0, delay_ms=200.0)
    assert (keeps.verdict(), stops.verdict(), unclear.verdict()) == (False, True, None)
    assert cancel_verdict([keeps, keeps, unclear]) is False
    assert cancel_verdict([keeps, stops]) is None  # they disagree: "auto"
    assert cancel_verdict([unclear, unclear, stops]) is None  # one clear vote of three is no majority
    drained = CancelTrial("gauge", 600.0, drained_ms=15.0, watched_ms=15.0)
    busy = CancelTrial("gauge", 600.0, drained_ms=None, watched_ms=600.0)
    assert (drained.verdict(), busy.verdict()) == (True, False)
    assert cancel_verdict([drained, drained, keeps]) is True  # the engine's own gauge outranks latency
    assert "empty after 15 ms" in drained.describe() and "+640 ms" in keeps.describe()


def test_budgets_are_turns_rounded_up():
    assert round_up(1234) == 1300 and round_up(87.1) == 88 and round_up(0) == 0 and round_up(5000) == 5000
    assert budgets(340.0) == {"realtime": 680, "interactive": 1400, "batch": 11000}
    assert budgets(1.0)["realtime"] == 100  # at least MIN_BUDGET_MS
    assert budgets(9e9, 3000) == {"realtime": 1500, "interactive": 3000, "batch": 23000}  # by hand: the turn ignored


def test_a_turn_is_the_slowest_request_where_the_sidecar_keeps_the_server():
    at_knee = SweepStep(8, 37.1, 194.0, 540.0, 100, 0, 8, 0)
    alone = [("chat:short", 110.0), ("chat:long_output", 461.0), ("chat:cancel", 852.0)]
    # Alone, the long request (852 ms) is the slowest; the knee's short p99 (540 ms) is not.
    assert turn(at_knee, "chat:short", alone, ()) == (852.0, "chat:cancel alone")
    # vLLM's CPU build with 8 in flight: the long request's p99 is 2.6 s, and that is the turn.
    loaded = [Loaded("chat:short", 8, 290.0, 560.0, 60), Loaded("chat:cancel", 8, 2200.0, 2617.0, 12, 303)]
    assert turn(at_knee, "chat:short", alone, loaded) == (2617.0, "p99 of chat:cancel with 8 in flight")
    assert budgets(2617.0)["interactive"] == 11_000  # 4 turns: the 1.7-2.2 s budgets shed 31-39 of a closed loop
    # A shape that never answered under load is no figure; an infinite p99 (no latency) is none either.
    assert turn(at_knee, "chat:short", alone, [Loaded("chat:cancel", 8, 0.0, 99e9, 0)])[0] == 852.0
    inf_knee = SweepStep(8, 0.0, math.inf, math.inf, 10, 10)
    assert turn(inf_knee, "chat:short", [], ()) == (100.0, "no figure")


@given(
    st.floats(1, 1e5),
    st.lists(st.tuples(st.text(max_size=3), st.floats(0, 1e6)), max_size=4),
    st.lists(st.tuples(st.floats(0, 1e6), st.integers(0, 5)), max_size=4),
)
def test_a_turn_is_never_shorter_than_any_answered_figure(knee_p99, alone, loaded):
    at_knee = SweepStep(4, 10.0, knee_p99 / 2, knee_p99, 10, 0)
    shapes = [Loaded(f"s{i}", 4, p99 / 2, p99, n) for i, (p99, n) in enumerate(loaded)]
    ms, _ = turn(at_knee, "short", alone, shapes)
    assert ms >= knee_p99 and all(ms >= a for _, a in alone) and all(ms >= s.p99_ms for s in shapes if s.samples)
    budget = budgets(ms)
    assert budget["interactive"] >= 4 * ms and budget["realtime"] >= 2 * ms


def test_the_engine_queue_limit_may_climb_past_the_batch_to_where_the_engine_queued():
    # vLLM CPU, --max-num-seqs 8 (main 2026-12-01): knee 8, the engine's queue stood from 16 users on.
    vllm = steps(6.4, 17.0, 22.6, 37.1, 23.2, 28.7, running=[1, 2, 4, 8, 8, 8], waiting=[0, 0, 0, 0, 8, 24])
    assert (knee(vllm).concurrency, limit_for(vllm), engine_queue_ceiling(vllm)) == (8, 8, 16)
    # Another run of the same: the knee at 16 is the ceiling too.
    busy = steps(5.5, 10.0, 26.0, 32.5, 46.4, 39.8, running=[1, 2, 4, 7, 8, 8], waiting=[0, 0, 0, 0, 8, 24])
    assert (knee(busy).concurrency, limit_for(busy), engine_queue_ceiling(busy)) == (16, 8, 16)
    # The sim pod: a request waiting a moment at 4 users (all running) is no standing queue.
    sim = steps(18.9, 36.2, 72.4, 137.5, 125.0, running=[1, 2, 4, 8, 8], waiting=[0, 0, 1, 0, 8])
    assert (limit_for(sim), engine_queue_ceiling(sim)) == (8, 16)
    # No gauges, or a queue that never stood: the knee.
    assert engine_queue_ceiling(steps(4.0, 8.0, 15.0, 15.2)) == 4
    assert engine_queue_ceiling(steps(4.0, 8.0, 15.0, 15.2, running=[1, 2, 4, 4], waiting=[0, 0, 0, 0])) == 4


def test_the_gauges_are_read_every_two_short_requests_within_bounds():
    def at(p50_ms):
        return SweepStep(8, 30.0, p50_ms, 2 * p50_ms, 100, 0)

    assert metrics_interval_s(at(239.0)) == 1.0  # vLLM CPU: 0.48 s, at the floor (a read costs its front end)
    assert metrics_interval_s(at(671.0)) == 1.35
    assert metrics_interval_s(at(5000.0)) == 2.0  # a serial LLM: not slower than the old default
    assert metrics_interval_s(at(math.inf)) == 2.0
    # The step at the limit, not the knee past it (2026-12-01 run: knee at 32 users, p50 576 ms: 1.15 s).
    sweep = steps(6.2, 6.2, 14.4, 22.5, 17.5, 51.1)
    assert at_limit(sweep, 8).concurrency == 8 and at_limit(sweep, 6).concurrency == 4
    assert at_limit(sweep, 0).concurrency == 1
