"""Built-in request shapes, mixes and JSONL workloads (errors name file and line)."""

from __future__ import annotations

import msgspec
import pytest

from proxy.loadtest.jsonl import JsonlError, parse_lines
from proxy.loadtest.shapes import BUILTIN_NAMES, CHARS_PER_TOKEN, Mix, builtin


def body(shape) -> dict:
    return msgspec.json.decode(shape.body)


def test_builtin_shapes_have_the_documented_sizes():
    short, long_ = body(builtin("short_chat")), body(builtin("long_chat"))
    assert len(short["messages"][0]["content"]) == 100 * CHARS_PER_TOKEN and short["max_tokens"] == 32
    assert len(long_["messages"][0]["content"]) == 1500 * CHARS_PER_TOKEN and long_["max_tokens"] == 512
    assert body(builtin("short_chat_stream"))["stream"] is True and builtin("short_chat_stream").stream
    assert len(body(builtin("embed_long"))["input"]) == 400 * CHARS_PER_TOKEN
    assert builtin("embed_short").path == "/v1/embeddings"
    assert "model" not in short and body(builtin("tiny", model="m"))["model"] == "m"
    assert len(BUILTIN_NAMES) == len(set(BUILTIN_NAMES))


def test_unknown_shape_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown shape 'huge_chat'; built-in shapes: tiny, short_chat"):
        Mix.parse("short_chat,huge_chat")


def test_mix_parse_weights_classes_and_deadlines():
    mix = Mix.parse("short_chat@interactive=3, long_chat@batch", class_deadlines_ms={"interactive": 300})
    a, b = mix.shapes
    assert (a.label, a.weight, a.cls, a.deadline_ms) == ("short_chat@interactive", 3.0, "interactive", 300)
    assert (b.label, b.weight, b.deadline_ms) == ("long_chat@batch", 1.0, None)
    headers = dict(a.headers())
    assert headers[b"x-priority"] == b"interactive" and headers[b"x-request-timeout-ms"] == b"300"
    assert [d["share"] for d in mix.describe()] == [0.75, 0.25]
    with pytest.raises(ValueError, match="listed twice"):
        Mix.parse("short_chat,short_chat")
    with pytest.raises(ValueError, match="bad weight"):
        Mix.parse("short_chat=lots")
    with pytest.raises(ValueError, match="weight must be > 0"):
        Mix.parse("short_chat=0")


def test_jsonl_bodies_and_envelopes():
    lines = [
        '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}',
        "",
        (
            '{"body": {"prompt": "x", "stream": true}, "class": "batch", "deadline_ms": 900, "cost_hint": 12,'
            ' "weight": 2}'
        ),
        '{"body": {"input": "abc"}, "name": "emb", "path": "/v2/embed"}',
    ]
    mix = parse_lines(lines, "w.jsonl", model="m1")
    chat, comp, emb = mix.shapes
    assert (chat.name, chat.path, body(chat)["model"]) == ("chat", "/v1/chat/completions", "m1")
    assert (comp.name, comp.stream, comp.cls, comp.deadline_ms, comp.cost_hint, comp.weight) == (
        "completion_stream",
        True,
        "batch",
        900,
        12,
        2.0,
    )
    assert dict(comp.headers())[b"x-cost-hint"] == b"12"
    assert (emb.name, emb.path) == ("emb", "/v2/embed")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{broken", "w.jsonl:2: invalid JSON"),
        ("[1, 2]", "w.jsonl:2: each line must be a JSON object"),
        ('{"body": {"prompt": "x"}, "priority": "high"}', "w.jsonl:2: unknown key(s) priority"),
        ('{"model": "m"}', "w.jsonl:2: cannot tell the endpoint"),
        ('{"body": {"prompt": "x"}, "deadline_ms": -5}', "w.jsonl:2: 'deadline_ms' must be a positive integer"),
        ('{"body": {"prompt": "x"}, "weight": 0}', "w.jsonl:2: 'weight' must be a number > 0"),
    ],
)
def test_malformed_jsonl_lines_name_file_and_line(line, message):
    with pytest.raises(JsonlError) as info:
        parse_lines(['{"prompt": "ok"}', line], "w.jsonl")
    assert str(info.value).startswith(message)


def test_a_jsonl_workload_without_requests_is_an_error():
    with pytest.raises(JsonlError, match="w.jsonl: no requests"):
        parse_lines(["", "  "], "w.jsonl")
