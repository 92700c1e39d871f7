"""What calibration sends: candidate paths, shapes that separate the cost terms, halving when too long."""

from __future__ import annotations

import json

import pytest

from proxy.calibrate import shapes as cs


def test_chat_shapes_separate_prompt_and_output_and_are_greedy():
    shapes = cs.shapes_for(cs.Endpoint("chat", "/chat/completions"), "m")
    assert [s.label for s in shapes] == ["chat:short", "chat:long_output", "chat:long_prompt"]
    sizes = [(s.prompt_tokens, s.max_tokens) for s in shapes]
    assert sizes == [(cs.SHORT_PROMPT, cs.SHORT_OUTPUT), (cs.SHORT_PROMPT, cs.LONG_OUTPUT), (cs.LONG_PROMPT, 16)]
    body = json.loads(shapes[0].shape.body)
    assert body["model"] == "m" and body["temperature"] == 0 and body["max_tokens"] == 16
    assert len(body["messages"][0]["content"]) == cs.prompt_chars(cs.SHORT_PROMPT)
    assert all(s.shape.path == "/chat/completions" for s in shapes)


def test_embeddings_and_named_requests():
    emb = cs.shapes_for(cs.Endpoint("embeddings", "/embeddings"), None)
    assert [(s.prompt_tokens, s.max_tokens) for s in emb] == [(cs.EMBED_SHORT, 0), (cs.EMBED_LONG, 0)]
    assert "model" not in json.loads(emb[0].shape.body)
    named = cs.parse_request('/v2/models/m/infer={"inputs": []}')
    (only,) = cs.shapes_for(named, "m")
    assert (only.kind, only.shape.path, only.shape.body) == ("fixed", "/v2/models/m/infer", b'{"inputs": []}')
    with pytest.raises(ValueError, match="PATH=JSON-BODY"):
        cs.parse_request("no-slash=1")


def test_halving_shrinks_the_long_part_until_the_short_size():
    endpoint = cs.Endpoint("chat", "/v1/chat/completions")
    long_prompt = cs.shapes_for(endpoint, None)[2]
    sizes = []
    s = long_prompt
    while (s := cs.halved(s, endpoint, None)) is not None:
        sizes.append(s.prompt_tokens)
        assert s.label == "chat:long_prompt" and len(json.loads(s.shape.body)["messages"][0]["content"]) > 0
    assert sizes == [128, 64, 32]  # then 32 is the floor: twice the short prompt
    long_out = cs.shapes_for(endpoint, None)[1]
    assert cs.halved(long_out, endpoint, None).max_tokens == 64
    assert cs.halved(cs.shapes_for(endpoint, None)[0], endpoint, None) is None


def test_long_shape_asks_vllm_to_ignore_eos_only_when_told():
    endpoint = cs.Endpoint("completions", "/v1/completions")
    plain = json.loads(cs.long_shape(endpoint, None, 300).shape.body)
    assert plain["max_tokens"] == 300 and "ignore_eos" not in plain
    assert json.loads(cs.long_shape(endpoint, None, 300, ignore_eos=True).shape.body)["ignore_eos"] is True
