"""Cost estimation at arrival, over many body shapes, including malformed ones."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.cost import ROUTE_CACHE, ROUTE_CACHE_CHARS, Cost, CostEstimator, CostSource
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


# --- routes by shape (issue 12 item 5) -------------------------------------------------


@pytest.mark.parametrize(
    "path, obj, route, tokens",
    [
        ("/embeddings", {"input": "a" * 8, "model": "e"}, EMB, (2, 0)),
        ("/embed", {"input": ["aaaa", "bbbb"]}, EMB, (2, 0)),
        ("/chat/completions", {"messages": [{"role": "user", "content": "x" * 8}], "max_tokens": 5}, CHAT, (2, 5)),
        ("/completion", {"prompt": "y" * 12, "max_tokens": 3}, COMPL, (3, 3)),
        ("/v2/generate", {"prompt": [[1, 2], [3]], "max_tokens": 2}, COMPL, (3, 4)),
    ],
)
def test_unmatched_paths_are_costed_by_their_bodys_shape(est, path, obj, route, tokens):
    cost = est.estimate(path, body(obj))
    assert (cost.route, (cost.prompt_tokens, cost.output_tokens), cost.source) == (route, tokens, CostSource.SHAPE)


@pytest.mark.parametrize("raw", [b"", b"{}", b'{"inputs": [1]}', b"not json", b'{"messages": "x"}', b"[1, 2]"])
def test_unmatched_bodies_of_no_known_shape_stay_fixed(est, raw):
    assert est.estimate("/v2/models/m/infer", raw) == Cost(1, 0, 1, CostSource.FIXED, "/")


def test_a_named_route_is_never_second_guessed_by_shape(est):
    # /v1/embeddings is named: a chat-shaped body there is still costed as embeddings.
    cost = est.estimate(EMB, body({"messages": [{"content": "abcd"}], "input": "a" * 8}))
    assert (cost.route, cost.source, cost.output_tokens) == (EMB, CostSource.PARSED, 0)


def test_without_a_route_of_that_kind_the_catch_all_figures_cost_it():
    e = CostEstimator([Route(path_prefix="/", kind="fixed", chars_per_token=2.0, default_max_tokens=9)], 4096)
    cost = e.estimate("/chat", body({"messages": [{"content": "abcd"}]}))
    assert cost == Cost(2, 9, 11, CostSource.SHAPE, "/")  # 4 chars / 2, the catch-all's default output
    # And with no "/" route at all, the built-in fallback's (under its "/" model).
    e = CostEstimator([Route(path_prefix="/v1/chat/completions", kind="chat")], 4096)
    assert e.estimate("/embed", body({"input": "a" * 8})) == Cost(2, 0, 2, CostSource.SHAPE, "/")


def test_by_shape_false_keeps_the_catch_all_fixed():
    e = CostEstimator([Route(path_prefix="/", kind="fixed", fixed_tokens=0, by_shape=False)], 4096)
    assert e.estimate("/v1/chat/completions", body({"messages": []}), hint=7) == Cost(7, 0, 7, CostSource.HINT, "/")
    assert e.statistics()["unmatched_requests"] == 0


def test_a_hint_keeps_the_shape_split_and_route(est):
    cost = est.estimate("/embeddings", body({"input": "a" * 40}), hint=30)
    assert cost == Cost(30, 0, 30, CostSource.HINT, EMB)


def test_stats_name_the_unmatched_paths_and_what_they_were_costed_as(est):
    for _ in range(3):
        est.estimate("/embeddings?x=1", body({"input": "abc"}))
    est.estimate("/health", b"")
    est.estimate(CHAT, body({"messages": []}))  # matched: not counted
    stats = est.statistics()
    assert stats["unmatched_requests"] == 4
    assert stats["by_source"] == {"shape": 3, "fixed": 1}
    assert stats["paths"][0] == {"path": "/embeddings", "requests": 3, "overcount": 0, "costed_as": EMB}
    assert stats["paths"][1]["path"] == "/health" and stats["paths"][1]["costed_as"] == "fixed"


def test_unmatched_path_table_is_bounded_and_keeps_heavy_hitters():
    from proxy.core.cost import MAX_PATH_CHARS, MAX_UNMATCHED_PATHS, UnmatchedPaths

    table = UnmatchedPaths()
    fixed = Cost(1, 0, 1, CostSource.FIXED, "/")
    for i in range(5000):  # an attacker's one-off paths, with a real client's path among them
        table.record(f"/junk/{i}/" + "z" * 500, fixed)
        if i % 4 == 0:
            table.record("/embeddings", fixed)
    stats = table.statistics()
    assert len(stats["paths"]) == MAX_UNMATCHED_PATHS and stats["unmatched_requests"] == 5000 + 1250
    assert stats["paths"][0]["path"] == "/embeddings"  # > total / capacity: always listed
    top = stats["paths"][0]
    assert top["requests"] - top["overcount"] <= 1250 <= top["requests"]  # Space-Saving's guarantee
    assert all(len(p["path"]) <= MAX_PATH_CHARS for p in stats["paths"])


@given(st.lists(st.sampled_from([f"/p{i}" for i in range(12)]), max_size=300), st.integers(1, 8))
def test_space_saving_counts_bound_the_truth(paths, capacity):
    from proxy.core.cost import UnmatchedPaths

    table = UnmatchedPaths(capacity)
    for p in paths:
        table.record(p, Cost(1, 0, 1, CostSource.FIXED, "/"))
    listed = table.statistics()["paths"]
    assert len(listed) <= capacity and sum(e["requests"] for e in listed) == len(paths)
    for e in listed:
        assert e["requests"] - e["overcount"] <= paths.count(e["path"]) <= e["requests"]


# --- bodies nested past the decoder's recursion bound (issue 13 defect 8) ----------------


def _deep(field: str) -> bytes:
    return (f'{{"{field}": ' + "[" * 1990 + "]" * 1990 + "}").encode()  # 4 KB, within parse_max_bytes


@pytest.mark.parametrize("path", [CHAT, COMPL, EMB, "/embeddings"])
@pytest.mark.parametrize("field", ["prompt", "input", "other"])
def test_deep_nesting_is_flagged_not_raised(est, path, field):
    # prompt / input decode as Any, unknown fields are skipped: both recurse inside msgspec.
    cost = est.estimate(path, _deep(field), hint=10)
    assert cost.source is CostSource.TOO_DEEP  # and a hint does not launder it
    assert cost.units == cost.prompt_tokens + cost.output_tokens > 0


def test_deep_nesting_where_the_body_is_not_read_or_fails_first(est):
    assert est.estimate("/v1/models", _deep("other")).source is CostSource.TOO_DEEP  # unmatched: sniffed
    named_fixed = CostEstimator([Route(path_prefix="/v2", kind="fixed")], 4096)
    assert named_fixed.estimate("/v2/x", _deep("other")).source is CostSource.FIXED  # a named fixed route: not read
    # messages must be a list of objects: validation stops at the first inner list, no recursion.
    assert est.estimate(CHAT, _deep("messages")).source is CostSource.UNEXPECTED_SHAPE
    assert est.estimate("/chat", _deep("messages")).source is CostSource.FIXED


@pytest.mark.parametrize("target", ["http://x:1/v1/models?q=1", "*", "", "x/v1/chat/completions"])
def test_targets_that_do_not_start_with_a_slash_are_unmatched_not_a_crash(est, target):
    cost = est.estimate(target, body({"input": "a" * 8}))
    assert (cost.route, cost.source) == (EMB, CostSource.SHAPE)  # costed by shape under the catch-all rule
    assert est.estimate(target, b"") == Cost(1, 0, 1, CostSource.FIXED, "/")


def test_a_fixed_routes_cost_is_built_once_and_equals_a_fresh_one():
    """CostEstimator hands out one Cost value per fixed route (no dataclass built per request)."""
    from proxy.core.cost import Cost, CostEstimator, CostSource
    from proxy.policy.schema import Policy

    est = CostEstimator(Policy().routes, 1 << 20)
    first, again = est.estimate("/anything", b""), est.estimate("/other", b"")
    assert first is again
    catch = est.route_for("/anything")
    assert first == Cost(catch.fixed_tokens, 0, catch.fixed_tokens, CostSource.FIXED, catch.path_prefix)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/embed", "/", "x"]), max_size=30
    )
)
def test_the_remembered_route_is_the_matched_one(paths) -> None:
    est = CostEstimator(default_routes(), parse_max_bytes=4096)
    for path in paths:
        assert est.estimate(path, b"").route == est.estimate(path, b"").route == est.route_for(path).path_prefix


def test_the_route_memory_is_bounded_against_a_flood_of_paths() -> None:
    est = CostEstimator(default_routes(), parse_max_bytes=4096)
    for i in range(ROUTE_CACHE * 3):
        est.estimate(f"/v1/chat/completions/{i}", b"")
    assert len(est._route_of) == ROUTE_CACHE
    est = CostEstimator(default_routes(), parse_max_bytes=4096)
    est.estimate("/v1/" + "x" * ROUTE_CACHE_CHARS, b"")
    assert not est._route_of  # a long path is matched each time, never kept
