"""The policy calibrate writes, from a Calibration built by hand: it checks, and says where each value came from."""

from __future__ import annotations

import datetime

import pytest

from proxy.calibrate import render
from proxy.calibrate.fit import CancelTrial, Coefficients, Loaded, SweepStep
from proxy.calibrate.measure import Calibration, RouteCalibration, ShapeFigure
from proxy.calibrate.shapes import Endpoint

WHEN = datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.UTC)


def calibration(
    *,
    stops: bool | None = False,
    gauges=(),
    limit: int = 1,
    batch: int | None = None,
    knee_at: int = 0,
    loaded: tuple[Loaded, ...] = (),
) -> Calibration:
    chat = RouteCalibration(
        Endpoint("chat", "/chat/completions"),
        Coefficients(6.5, 0.2, 4.0),
        (
            ShapeFigure("chat:short", "chat", "/chat/completions", 16, 16, 74.0, 3, True, b'{"messages": []}'),
            ShapeFigure("chat:long_output", "chat", "/chat/completions", 16, 128, 525.0, 3, True),
            ShapeFigure("chat:long_prompt", "chat", "/chat/completions", 256, 16, 122.0, 3, True),
        ),
        4.0,
        1.0,
    )
    infer = RouteCalibration(
        Endpoint("fixed", "/v2/models/tiny/infer", b"{}"),
        Coefficients(220.0, 0.0, 0.0),
        (ShapeFigure("fixed:/v2/models/tiny/infer", "fixed", "/v2/models/tiny/infer", 0, 0, 220.0, 5, False),),
        None,
        None,
    )
    sweep = (
        SweepStep(1, 13.6, 74.0, 80.0, 40, 0),
        SweepStep(2, 13.0, 147.0, 160.0, 40, 0),
        SweepStep(4, 13.6, 294.0, 300.0, 40, 0),
        SweepStep(32, 47.8, 703.0, 900.0, 400, 0, 8, 24),
    )
    return Calibration(
        url="http://127.0.0.1:8600",
        health="health /models (discovered after /health 404)",
        health_path="/models",
        model="m",
        tried=("POST /v1/chat/completions 404", "POST /chat/completions 200"),
        routes=(chat, infer),
        sweep_label="chat:short",
        sweep=sweep,
        knee=sweep[knee_at],
        limit=limit,
        engine_batch=batch,
        long_label="chat:cancel",
        long_alone_ms=965.0,
        cancel_trials=(CancelTrial("latency", 656.0, delay_ms=649.0), CancelTrial("latency", 656.0, delay_ms=646.0)),
        stops_on_cancel=stops,
        engine_gauges=tuple(gauges),
        metrics_path="/metrics",
        duration_s=20.0,
        loaded=loaded,
        long_output_tokens=300,
    )


def test_the_written_policy_checks_and_carries_the_measured_values():
    text = render.policy_toml(calibration(), command="rampmeter calibrate http://127.0.0.1:8600", when=WHEN)
    policy = render.check_policy(text)
    assert policy.upstreams[0].url == "http://127.0.0.1:8600"
    assert policy.warmup.health_path == "/models" and policy.warmup.probes[0].path == "/chat/completions"
    assert (policy.limits.kind, policy.limits.initial_limit, policy.limits.max_limit) == ("fixed", 1, 1)
    chat = next(r for r in policy.routes if r.path_prefix == "/chat/completions")
    assert (chat.kind, chat.base_ms, chat.ms_per_prompt_token, chat.ms_per_output_token) == ("chat", 6.5, 0.2, 4.0)
    infer = next(r for r in policy.routes if r.path_prefix == "/v2/models/tiny/infer")
    assert (infer.kind, infer.base_ms) == ("fixed", 220.0)
    # Budgets in turns of the slowest request alone (the cancel test's long one, 965 ms; a serial
    # server, so nothing was measured under load): 2, 4 and 30 turns.
    assert {n: c.default_timeout_ms for n, c in policy.classes.items()} == {
        "realtime": 2000,
        "interactive": 3900,
        "batch": 29000,
    }
    assert "4 turns of 965 ms, the chat:cancel alone" in text
    assert "Budgets hold answers up to 300 output tokens (chat:cancel" in text
    assert policy.shedding.codel_target_ms == 3900 - 80 and policy.shedding.codel_interval_ms == 3900
    assert "on 2026-01-02 03:04 UTC after 20 s of probing" in text


def test_every_written_value_has_a_comment_above_it_or_is_a_name():
    text = render.policy_toml(calibration(), when=WHEN)
    lines = text.splitlines()
    names = ("url", "protocol", "path_prefix", "kind", "priority", "on_unmeetable", "name", "path", "body", "unit")
    names += ("min_limit", "max_limit", "rules", "order", "default_class", "count", "ms_per_prompt_token")
    names += ("ms_per_output_token", "max_timeout_ms", "max_queue_wait_ms")
    for i, line in enumerate(lines):
        if not line or line.startswith(("#", "[")):
            continue
        key = line.split(" = ", 1)[0]
        if key in names:
            continue
        assert lines[i - 1].startswith("#"), f"{key} has no comment: {line!r}"


@pytest.mark.parametrize("stops, value", [(True, "true"), (False, "false"), (None, '"auto"')])
def test_stops_on_cancel_is_written_as_a_key_where_the_schema_has_it(monkeypatch, stops, value):
    text = render.policy_toml(calibration(stops=stops), when=WHEN)
    if render.supports(render.Upstream, stops_on_cancel=True):
        assert f"\nstops_on_cancel = {value}\n" in text
    else:
        assert f"\n# stops_on_cancel = {value}   (needs a rampmeter with [[upstreams]] stops_on_cancel)" in text
    render.check_policy(text)
    assert "next short request +649 ms (work left >= 656 ms)" in text


def test_engine_gauges_cap_the_limit_and_point_the_metrics_reader_at_them():
    gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    text = render.policy_toml(calibration(gauges=gauges, limit=8, batch=8, knee_at=3), when=WHEN)
    policy = render.check_policy(text)
    assert policy.gpu.upstream_metrics_path == "/metrics"
    assert policy.limits.initial_limit == 8
    assert "the engine never ran more than 8 at once while others waited inside it" in text
    if render.supports(render.Limits, kind="engine_queue"):  # it follows the engine, bounded at twice
        assert (policy.limits.kind, policy.limits.max_limit) == ("engine_queue", 64)  # where the queue stood
        # Read the gauges every two short requests' time at the limit (the step at 4 users: p50 294 ms),
        # not at the knee (32 users, p50 703 ms: that counts the engine's queue), within 1-2 s.
        assert policy.gpu.upstream_metrics_interval_s == 1.0
        assert "two short requests' time at 4 users (p50 294 ms)" in text
    else:
        assert policy.limits.kind == "fixed" and policy.limits.max_limit == 8
        assert 'kind = "engine_queue" (follow it) needs a newer rampmeter' in text


def test_supports_asks_the_schema():
    assert render.supports(render.Limits, kind="fixed")
    assert not render.supports(render.Limits, kind="no-such-kind")
    assert not render.supports(render.Upstream, no_such_key=True)


def test_budgets_hold_the_long_request_as_the_server_serves_it_under_load():
    # vLLM's CPU build: the long request took 965 ms alone but 2,480 ms (p99) with 8 in flight; the
    # budgets follow the loaded figure, so a closed loop the server serves is not rejected as unmeetable.
    loaded = (
        Loaded("chat:short", 8, 240.0, 610.0, 40),
        Loaded("chat:cancel", 8, 2100.0, 2480.0, 9, 300),
        Loaded("chat:never", 8, 9e9, 9e9, 0),  # no answer: not a figure
    )
    gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    text = render.policy_toml(calibration(gauges=gauges, limit=8, batch=8, knee_at=3, loaded=loaded), when=WHEN)
    policy = render.check_policy(text)
    assert {n: c.default_timeout_ms for n, c in policy.classes.items()} == {
        "realtime": 5000,
        "interactive": 10_000,
        "batch": 75_000,
    }
    assert "4 turns of 2,480 ms, the p99 of chat:cancel with 8 in flight" in text
    assert "#   chat:cancel            2,100     2,480 ms, 9 answers" in text


def test_a_budget_fixed_by_hand_sets_the_default_class_and_what_follows_it():
    # bench.real_servers --budget-ms: the clients' deadline and the policy's must be the same, whatever
    # calibrate measured at a quiet moment (round 1: 4 s budgets against 2-6 s answers under load).
    text = render.policy_toml(calibration(), when=WHEN, budget_ms=12_345)
    policy = render.check_policy(text)
    classes = {n: c.default_timeout_ms for n, c in policy.classes.items()}
    assert classes == {"realtime": 6200, "interactive": 12_345, "batch": 93_000}  # turns of 12,345 / 4
    assert policy.classes["interactive"].max_timeout_ms == 123_450
    assert policy.shedding.codel_interval_ms == 12_345
    assert "default budget fixed by hand at 12345 ms (--budget-ms)" in text


def test_each_class_may_queue_what_the_server_answers_within_its_budget():
    """A queue the backend drains in time is never cut by the class cap (2x on vLLM: ~250 answered in 10 s)."""
    cal = calibration(knee_at=3)  # 47.8/s at the knee
    policy = render.check_policy(render.policy_toml(cal, command="c", when=WHEN, budget_ms=10_000))
    for name, klass in policy.classes.items():
        drained = 47.8 * klass.default_timeout_ms / 1000
        assert klass.max_queue_length >= min(render.QUEUE_LENGTH_CAP, drained), name
        assert klass.max_queue_length <= render.QUEUE_LENGTH_CAP
    assert policy.classes["interactive"].max_queue_length == 478  # 47.8/s x 10 s
    slow = calibration(knee_at=0)  # 13.6/s: 136 in 10 s, below the schema's 256
    assert (
        render.check_policy(render.policy_toml(slow, command="c", when=WHEN, budget_ms=10_000))
        .classes["interactive"]
        .max_queue_length
        == 256
    )


def test_the_starvation_backstop_is_the_budget_and_the_global_queue_cap_is_above_every_class():
    """Half a budget made SJF FCFS under any queue standing longer (s28, sim at 3x: short p50 8.9 s against
    1.4 s with the backstop out of the way); the global queue_length cap must not undo the classes' caps."""
    policy = render.check_policy(render.policy_toml(calibration(knee_at=3), command="c", when=WHEN, budget_ms=10_000))
    for name, klass in policy.classes.items():
        assert klass.max_queue_wait_ms == klass.default_timeout_ms, name
        assert klass.max_queue_length <= policy.shedding.max_queued_requests, name
    assert policy.scheduling.fcfs_wait_multiple > 0  # the bound that acts first
