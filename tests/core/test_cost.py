"""Cost estimation at arrival, over many body shapes, including malformed ones."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.cost import Cost, CostEstimator, CostSource
from proxy.policy.admission import Route, default_routes

CHAT, COMPL, EMB = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"


@pytest.fixture
def est() -> CostEstimator:
    return CostEstimator(default_routes(), parse_max_bytes=4096)


def body(obj) -> bytes:
    return json.dumps(obj).encode()


def test_chat_string_and_part_contents(est):
    b = body(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "x" * 8},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "y" * 9},
                        {"type": "image_url", "image_url": {"url": "data:..."}},
                    ],
                },
                {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
            ],
            "max_tokens": 50,
            "temperature": 0.2,
        }
    )
    assert est.estimate(CHAT, b) == Cost(2 + 3, 50, 55, CostSource.PARSED, CHAT)


def test_max_completion_tokens_wins_and_n_multiplies(est):
    b = body(
        {
            "messages": [{"role": "user", "content": "abcd"}],
            "max_tokens": 10,
            "max_completion_tokens": 20,
            "n": 3,
        }
    )
    assert est.estimate(CHAT, b).output_tokens == 60


def test_default_max_tokens_when_absent(est):
    cost = est.estimate(CHAT, body({"messages": []}))
    assert (cost.prompt_tokens, cost.output_tokens) == (0, 256)


@pytest.mark.parametrize(
    "prompt, tokens, batch",
    [
        ("a" * 10, 3, 1),  # ceil(10 / 4)
        ([1, 2, 3, 4, 5], 5, 1),  # token ids count as their length
        (["a" * 4, "b" * 5], 1 + 2, 2),  # a batch of prompts
        ([[1, 2], [3, 4, 5]], 5, 2),  # a batch of token-id prompts
        ([], 0, 1),
    ],
)
def test_completion_prompt_shapes(est, prompt, tokens, batch):
    cost = est.estimate(COMPL, body({"prompt": prompt, "max_tokens": 7}))
    assert (cost.prompt_tokens, cost.output_tokens, cost.source) == (
        tokens,
        7 * batch,
        CostSource.PARSED,
    )


@pytest.mark.parametrize("value, tokens", [("a" * 9, 3), (["aaaa", "bbbbbbbb"], 3), ([7, 8, 9], 3), ([[1], [2, 3]], 3)])
def test_embeddings_have_no_output(est, value, tokens):
    assert est.estimate(EMB, body({"input": value, "model": "e"})) == Cost(tokens, 0, tokens, CostSource.PARSED, EMB)


def test_chars_per_token_is_per_route():
    e = CostEstimator(
        [Route(path_prefix="/x", kind="completions", chars_per_token=2.0, default_max_tokens=0)],
        4096,
    )
    assert e.estimate("/x", body({"prompt": "a" * 9})).prompt_tokens == 5


def test_invalid_json_is_estimated_from_size_and_flagged(est):
    raw = b'{"messages": [ this is not json'
    cost = est.estimate(CHAT, raw)
    assert cost.source is CostSource.INVALID_JSON
    assert cost.prompt_tokens == math.ceil(len(raw) / 4) and cost.output_tokens == 256


@pytest.mark.parametrize(
    "obj",
    [
        {"messages": "not a list"},
        {"messages": [{"content": 5}]},
        {"messages": [{"content": ["a bare string part"]}]},
        {"max_tokens": "ten"},
        ["a", "list"],
        "a string",
    ],
)
def test_unexpected_shapes_are_estimated_from_size(est, obj):
    cost = est.estimate(CHAT, body(obj))
    assert cost.source is CostSource.UNEXPECTED_SHAPE
    assert cost.units == cost.prompt_tokens + cost.output_tokens > 0


def test_body_over_the_parse_cap_is_estimated_from_its_size(est):
    big = body({"messages": [{"role": "user", "content": "z" * 5000}]})
    cost = est.estimate(CHAT, big)
    assert cost.source is CostSource.SIZE and cost.prompt_tokens == math.ceil(len(big) / 4)


def test_cost_hint_replaces_the_total_keeping_the_split(est):
    b = body({"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 100})  # 100 + 100
    assert est.estimate(CHAT, b, hint=1000) == Cost(500, 500, 1000, CostSource.HINT, CHAT)
    assert est.estimate(CHAT, b"", hint=40) == Cost(
        0, 40, 40, CostSource.HINT, CHAT
    )  # empty body: size 0 + default output
    assert est.estimate("/other", b"", hint=9) == Cost(9, 0, 9, CostSource.HINT, "/")


def test_longest_prefix_wins_and_the_query_is_ignored(est):
    assert est.route_for("/v1/chat/completions?stream=true").path_prefix == CHAT
    assert est.route_for("/v1/completions").path_prefix == COMPL
    assert est.route_for("/healthz").path_prefix == "/"
    assert est.estimate("/v1/models", b"{}") == Cost(1, 0, 1, CostSource.FIXED, "/")


def test_unmatched_paths_without_a_catch_all_route_cost_one_token():
    e = CostEstimator([Route(path_prefix="/v1/embeddings", kind="embeddings")], 4096)
    assert e.estimate("/elsewhere", b"whatever") == Cost(1, 0, 1, CostSource.FIXED, "/")
    assert "parse_max_bytes=4096" in repr(e)


@given(st.binary(max_size=300), st.sampled_from([CHAT, COMPL, EMB, "/x"]))
def test_any_bytes_give_a_consistent_estimate(raw, path):
    cost = CostEstimator(default_routes(), 200).estimate(path, raw)
    assert cost.prompt_tokens >= 0 and cost.output_tokens >= 0
    assert cost.units == cost.prompt_tokens + cost.output_tokens


texts = st.text(max_size=40)
parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}), max_size=3)


@given(
    st.lists(
        st.fixed_dictionaries({"role": st.just("user"), "content": st.one_of(texts, parts, st.none())}),
        max_size=5,
    ),
    st.one_of(st.none(), st.integers(0, 10_000)),
    st.integers(1, 4),
)
def test_chat_estimate_matches_a_reference_count(messages, max_tokens, n):
    payload = {"messages": messages, "n": n}
    if max_tokens is not None:
        payload["max_tokens"] = max_tokens
    chars = 0
    for m in messages:
        c = m["content"]
        chars += len(c) if isinstance(c, str) else sum(len(p["text"]) for p in c or [])
    cost = CostEstimator(default_routes(), 1 << 20).estimate(CHAT, body(payload))
    assert cost.prompt_tokens == math.ceil(chars / 4)
    assert cost.output_tokens == (256 if max_tokens is None else max_tokens) * n
