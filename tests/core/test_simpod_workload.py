"""Request parsing, true output lengths, the oracle, profiles and fault windows (pure)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.simpod.engine import Engine
from proxy.simpod.faults import HEALTHY, Fault, Faults, fault_from_json
from proxy.simpod.profiles import PROFILES, Profile, get_profile
from proxy.simpod.workload import CHAT, COMPLETION, EMBEDDING, BadRequest, oracle, parse_job

LLM = PROFILES["llm"]


def test_prompt_tokens_are_ceil_of_chars_over_chars_per_token() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "abcde"},
            {"role": "user", "content": [{"type": "text", "text": "fgh"}]},
        ],
    }
    job = parse_job(CHAT, body, LLM)
    assert job.prompt_tokens == math.ceil(8 / 4) and job.output_tokens == LLM.default_max_tokens
    assert parse_job(COMPLETION, {"prompt": "x" * 9, "max_tokens": 5}, LLM).prompt_tokens == 3
    assert parse_job(COMPLETION, {"prompt": ["ab", "cd"], "max_tokens": 5}, LLM).prompt_tokens == 1
    three = parse_job(EMBEDDING, {"input": ["a" * 8, "b", [1, 2, 3]]}, LLM)
    assert (three.prompt_tokens, three.output_tokens, three.steps, len(three.inputs)) == (2 + 1 + 3, 0, 1, 3)
    assert parse_job(EMBEDDING, {"input": "hello"}, get_profile("llm", chars_per_token=1.0)).prompt_tokens == 5


def test_kv_reservation_and_stream_flags() -> None:
    body = {"prompt": "x" * 40, "max_tokens": 7, "stream": True, "stream_options": {"include_usage": True}}
    job = parse_job(COMPLETION, json.dumps(body).encode(), LLM)
    assert (job.prompt_tokens, job.max_tokens, job.kv_tokens, job.stream, job.include_usage) == (10, 7, 17, True, True)


@pytest.mark.parametrize(
    "kind, raw, param",
    [
        (CHAT, b"{not json", None),
        (CHAT, b"[1, 2]", None),
        (CHAT, b'{"model": "m"}', "messages"),
        (CHAT, b'{"messages": []}', "messages"),
        (CHAT, b'{"messages": [{"content": "x"}]}', "messages"),
        (COMPLETION, b'{"model": "m"}', "prompt"),
        (COMPLETION, b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
        (COMPLETION, b'{"prompt": "x", "max_tokens": "5"}', "max_tokens"),
        (COMPLETION, b'{"prompt": "x", "max_tokens": 9000}', "max_tokens"),
        (COMPLETION, b'{"prompt": "x", "stream": "yes"}', "stream"),
        (EMBEDDING, b'{"input": []}', "input"),
        (EMBEDDING, b'{"input": [{"a": 1}]}', "input"),
        (EMBEDDING, b'{"input": "x", "encoding_format": "hex"}', "encoding_format"),
    ],
)
def test_invalid_requests_name_the_problem(kind, raw, param) -> None:
    with pytest.raises(BadRequest) as info:
        parse_job(kind, raw, LLM)
    assert info.value.param == param and str(info.value)


def test_stop_distribution_is_deterministic_per_body_and_seed() -> None:
    profile = get_profile("llm", stop_mean_tokens=20.0)
    bodies = [{"prompt": f"request {i}", "max_tokens": 200} for i in range(200)]
    lengths = [parse_job(COMPLETION, b, profile, seed=7).output_tokens for b in bodies]
    # the same body as bytes (any key order, any spacing) gives the same length
    again = [
        parse_job(COMPLETION, json.dumps(dict(reversed(b.items())), indent=1).encode(), profile, seed=7).output_tokens
        for b in bodies
    ]
    assert lengths == again
    assert [parse_job(COMPLETION, b, profile, seed=8).output_tokens for b in bodies] != lengths
    assert all(1 <= n <= 200 for n in lengths)
    assert 12 < sum(lengths) / len(lengths) < 30  # geometric with mean 20, lightly capped
    capped = parse_job(COMPLETION, {"prompt": "request 0", "max_tokens": 2}, profile, seed=7)
    assert capped.output_tokens <= 2


def test_oracle_gives_true_length_and_uncontended_service_time() -> None:
    profile = Profile(base_ms=5.0, per_seq_ms=1.0, prefill_ms_per_token=0.1, speed=2.0)
    o = oracle(COMPLETION, {"prompt": "x" * 400, "max_tokens": 10}, profile)
    assert (o.prompt_tokens, o.output_tokens, o.steps) == (100, 10, 10)
    assert oracle("/v1/completions", {"prompt": "x" * 400, "max_tokens": 10}, profile) == o
    assert o.service_s == pytest.approx((6.0 * 10 + 0.1 * 100) / 1000 / 2.0)
    # matches what the engine charges a lone sequence
    engine = Engine(profile)
    engine.submit(parse_job(COMPLETION, {"prompt": "x" * 400, "max_tokens": 10}, profile), 0.0)
    now = 0.0
    while engine.has_work:
        now += engine.begin_step(now)
        engine.end_step(now)
    assert now == pytest.approx(o.service_s)


def test_fixed_profile_runs_exactly_n_steps_and_its_capacity_formula() -> None:
    fixed = get_profile("fixed", speed=10.0)
    for kind, body in (
        (CHAT, {"messages": [{"role": "user", "content": "x" * 999}], "max_tokens": 3}),
        (EMBEDDING, {"input": "hi"}),
    ):
        assert oracle(kind, body, fixed).steps == fixed.fixed_steps
        assert oracle(kind, body, fixed).service_s == pytest.approx(fixed.fixed_steps * fixed.base_ms / 1000 / 10)
    assert fixed.fixed_capacity_rps() == pytest.approx(32 / (10 * 0.010 / 10))
    with pytest.raises(ValueError):
        PROFILES["llm"].fixed_capacity_rps()


def test_profiles_validate_and_override() -> None:
    assert get_profile("llm", max_num_seqs=8, speed=None).max_num_seqs == 8
    with pytest.raises(ValueError):
        get_profile("gpt")
    with pytest.raises(ValueError):
        Profile(speed=0.0)
    with pytest.raises(ValueError):
        Profile(max_num_seqs=0)


# --- faults ---
def test_fault_windows_combine_and_expire() -> None:
    faults = Faults([Fault(3.0, 0.0, 10.0, 20.0), Fault(2.0, 0.5, 15.0, 30.0), Fault()])
    assert faults.at(5.0) is HEALTHY
    assert faults.at(12.0).slowdown == 3.0
    state = faults.at(16.0)
    assert (state.slowdown, state.error_rate) == (6.0, 0.5)
    assert faults.at(20.0).slowdown == 2.0
    assert faults.at(30.0) is HEALTHY
    faults.replace(None)
    assert faults.at(16.0) is HEALTHY


def test_fault_json_bodies() -> None:
    f = fault_from_json({"slowdown": 3, "error_rate": 0.25, "duration_s": 10}, 100.0)
    assert (f.slowdown, f.error_rate, f.start_s, f.end_s) == (3.0, 0.25, 100.0, 110.0)
    assert fault_from_json({}, 5.0) is None
    assert fault_from_json({"slowdown": 1}, 5.0) is None
    assert fault_from_json({"slowdown": 2}, 5.0).end_s == math.inf
    for bad in ({"slowdown": 0}, {"error_rate": 2}, {"slowness": 2}, {"duration_s": -1}, {"slowdown": "x"}, [1]):
        with pytest.raises((TypeError, ValueError)):
            fault_from_json(bad, 0.0)


@given(
    st.lists(st.tuples(st.floats(0.1, 10), st.floats(0, 1), st.floats(0, 50), st.floats(0, 50)), max_size=5),
    st.floats(0, 100),
)
def test_combined_fault_state_is_always_valid(windows, now) -> None:
    faults = Faults([Fault(s, e, a, a + d) for s, e, a, d in windows])
    state = faults.at(now)
    assert state.slowdown > 0 and 0.0 <= state.error_rate <= 1.0
