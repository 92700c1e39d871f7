"""relay._json_usage: a body without a `usage` key is not parsed, and gives what a parse would."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.decisions import Observed
from proxy.runtime import relay


def test_usage_is_read_plain_or_escaped_and_absent_without_a_parse(monkeypatch):
    assert relay._json_usage(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 5}}') == Observed(3, 5)
    assert relay._json_usage(b'{"\\u0075sage": {"prompt_tokens": 3}}') == Observed(3, None)  # an escaped key
    calls = []
    monkeypatch.setattr(relay, "_decode_usage", lambda body: calls.append(body))
    assert relay._json_usage(b'{"id": "x", "choices": []}') is None
    assert calls == []  # no "usage" in the bytes: not decoded


@given(st.dictionaries(st.sampled_from(["id", "usage", "choices", "use"]), st.integers(0, 9) | st.none()))
def test_the_skip_agrees_with_decoding(fields):
    import json

    body = json.dumps(fields).encode()
    try:
        usage = relay._decode_usage(body).usage
        expected = None if usage is None else Observed(usage.prompt_tokens, usage.completion_tokens)
    except Exception:
        expected = None
    assert relay._json_usage(body) == expected
