"""The scheduling comparison's workload, oracle hints, policies and figures (proxy/testing/scheduling.py)."""

from __future__ import annotations

from array import array

import msgspec

from proxy.core.cost import CostEstimator
from proxy.core.service_model import ServiceModel
from proxy.loadtest import Plan, build_trace
from proxy.loadtest.records import OK, ReasonTable, Records, StepRun
from proxy.loadtest.result import RunResult
from proxy.loadtest.target import Target
from proxy.policy.load import parse_policy
from proxy.simpod.profiles import get_profile
from proxy.simpod.workload import oracle
from proxy.testing import scheduling as sc

PROFILE = get_profile("llm", speed=2.0, stop_mean_tokens=200)


def test_chat_mix_is_80_20_with_distinct_bodies_the_cost_estimate_cannot_tell_apart():
    mix = sc.chat_mix(variants=16)
    shares = {}
    for s in mix.shapes:
        shares[s.name] = shares.get(s.name, 0.0) + s.weight
    assert abs(shares[sc.SHORT] - 0.8) < 1e-9 and abs(shares[sc.LONG] - 0.2) < 1e-9
    assert len({s.body for s in mix.shapes}) == 32
    estimator = CostEstimator(parse_policy("").routes, 1 << 20)
    for name in (sc.SHORT, sc.LONG):
        costs = {estimator.estimate(s.path, s.body) for s in mix.shapes if s.name == name}
        assert len(costs) == 1  # same prompt length and max_tokens: one estimate per class
    lengths = {oracle(s.path, s.body, PROFILE).output_tokens for s in mix.shapes if s.name == sc.LONG}
    assert len(lengths) > 8  # ... while the pod gives each body its own true length


def test_oracle_hints_order_exactly_like_the_true_service_time():
    mix = sc.with_oracle_hints(sc.chat_mix(variants=16), PROFILE, seed=3, limit=32)
    per_prompt, _ = sc.oracle_prior(PROFILE, 32)
    pairs = [(sc.oracle_ms(s, PROFILE, 3, 32), s.cost_hint) for s in mix.shapes]
    for true_ms, hint in pairs:
        assert abs(hint * per_prompt - true_ms) <= per_prompt  # the hint is the true time in slope units
    # Through the oracle policy's route and service model, expected_ms orders like the truth.
    policy = parse_policy(sc.policy_toml("sjf", 32, PROFILE, oracle_route=True))
    route = policy.routes[0]
    estimator = CostEstimator(policy.routes, 1 << 20)
    model = ServiceModel.from_route(route, prior_samples=policy.scheduling.model_prior_samples)
    expected = []
    for s in mix.shapes:
        cost = estimator.estimate(s.path, s.body, s.cost_hint)
        assert (cost.prompt_tokens, cost.output_tokens) == (s.cost_hint, 0)
        expected.append(model.expected_ms(cost.prompt_tokens, cost.output_tokens))
    truth = [t for t, _ in pairs]
    assert sorted(range(len(truth)), key=truth.__getitem__) == sorted(range(len(expected)), key=expected.__getitem__)
    assert all(abs(e - t) <= 2 * per_prompt for e, t in zip(expected, truth, strict=True))


def test_policies_differ_only_in_order_and_load():
    fcfs = parse_policy(sc.policy_toml("fcfs", 24, PROFILE))
    sjf = parse_policy(sc.policy_toml("sjf", 24, PROFILE))
    a, b = msgspec.to_builtins(fcfs), msgspec.to_builtins(sjf)
    assert a["scheduling"].pop("order") == "fcfs" and b["scheduling"].pop("order") == "sjf"
    assert a == b
    assert (sjf.limits.kind, sjf.limits.initial_limit, sjf.shedding.rules, sjf.slow_start.window_s) == (
        "fixed",
        24,
        [],
        0,
    )
    assert list(sjf.classes) == ["chat"] and sjf.classes["chat"].on_unmeetable == "try"
    assert sjf.classes["chat"].max_queue_wait_ms == 5000  # 10 s at speed 1, scaled by speed 2


def _result(rows: list[tuple[int, float, int]]) -> RunResult:
    """A one-step result (20 s, no warm-up) from (shape index, latency s, status) rows."""
    mix = sc.chat_mix(variants=1)
    trace = build_trace(Plan.sweep([1.0], step_s=20.0), mix, seed=1)
    rec = Records(len(rows))
    rec.intended = array("d", (float(i) * 0.1 for i in range(len(rows))))
    rec.end = array("d", (rec.intended[i] + lat for i, (_, lat, _) in enumerate(rows)))
    rec.shape = array("H", (s for s, _, _ in rows))
    rec.status = array("H", (st for _, _, st in rows))
    rec.error = array("B", [OK]) * len(rows)
    run = StepRun(0, 1.0, 0.0, 20.0, 0.0, rec)
    return RunResult(trace, Target("http://127.0.0.1:1"), [run], ReasonTable(), 0.0)


def test_class_figures_pool_variants_and_count_goodput_against_each_class_sla():
    # shape 0 is short_chat, 1 long_chat; SLA short 1 s, long 10 s (speed 1 values, given directly)
    rows = [(0, 0.2, 200), (0, 0.4, 200), (0, 1.5, 200), (0, 0.3, 503), (1, 4.0, 200), (1, 12.0, 200)]
    step = sc.class_figures(_result(rows), {sc.SHORT: 1000.0, sc.LONG: 10_000.0})[0]
    short, long_ = step[sc.SHORT], step[sc.LONG]
    assert short["requests"] == 4 and short["ok"] == 3
    assert abs(short["mean_ms"] - 600.0) < 1e-6 and abs(short["p50_ms"] - 300.0) < 1e-6
    assert abs(short["goodput_rps"] - 2 / 20) < 1e-9  # 0.2 and 0.4 s; 1.5 s is late, the 503 is not ok
    assert abs(long_["goodput_rps"] - 1 / 20) < 1e-9  # 4 s within 10 s; 12 s is late
    assert abs(step["all"]["goodput_rps"] - 3 / 20) < 1e-9
    assert step["all"]["requests"] == 6
