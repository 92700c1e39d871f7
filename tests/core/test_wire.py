"""The sidecar's side of the wire contract: parsers and the rejection answer."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import wire


def test_every_reason_has_a_status():
    assert set(wire.STATUS_FOR_REASON) == set(wire.Reason)


def test_rejection_carries_reason_retry_after_and_openai_style_body():
    status, headers, body = wire.rejection(wire.Reason.QUEUE_FULL, "queue full", retry_after_ms=1200)
    assert status == 503
    h = dict(headers)
    assert h[b"x-rampmeter-reason"] == b"queue_full"
    assert h[b"retry-after"] == b"2"  # whole seconds, rounded up
    assert h[b"x-rampmeter-retry-after-ms"] == b"1200"
    assert json.loads(body) == {
        "error": {"type": "rampmeter_rejected", "code": "queue_full", "message": "queue full", "retry_after_ms": 1200}
    }


@pytest.mark.parametrize("reason", list(wire.Reason), ids=[r.value for r in wire.Reason])
def test_a_rejection_with_retry_after_tells_plain_clients_the_same_wait_and_to_retry(reason):
    # The OpenAI (Stainless) SDKs read retry-after-ms before retry-after, and x-should-retry.
    _, headers, _ = wire.rejection(reason, "", retry_after_ms=2417)
    h = dict(headers)
    assert h[b"retry-after-ms"] == h[b"x-rampmeter-retry-after-ms"] == b"2417"
    assert h[b"x-should-retry"] == b"true"


@pytest.mark.parametrize("reason", list(wire.Reason), ids=[r.value for r in wire.Reason])
def test_a_rejection_without_retry_after_says_a_retry_cannot_help_except_upstream_ones(reason):
    _, headers, _ = wire.rejection(reason, "")
    h = dict(headers)
    assert b"retry-after" not in h and b"retry-after-ms" not in h
    if reason in (wire.Reason.UPSTREAM_UNAVAILABLE, wire.Reason.UPSTREAM_TIMEOUT):
        assert b"x-should-retry" not in h  # the client's own 502/504 rule: it knows if the request is idempotent
    else:
        assert h[b"x-should-retry"] == b"false"


def test_the_hint_key_names_the_route_and_cost_bucket():
    assert wire.hint_key("/v1/chat/completions", 9) == b"/v1/chat/completions#9"
    assert wire.hint_key("/v1/caf\xe9", 0) == b"/v1/caf\\xe9#0"  # never a non-ASCII header byte


def test_tenant_quota_is_429_and_expiry_504():
    assert wire.rejection(wire.Reason.TENANT_QUOTA, "")[0] == 429
    assert wire.rejection(wire.Reason.DEADLINE_EXPIRED, "")[0] == 504


def test_retry_after_is_at_least_one_second():
    _, headers, _ = wire.rejection(wire.Reason.OVERLOADED, "", retry_after_ms=10)
    assert dict(headers)[b"retry-after"] == b"1"


@given(st.integers(min_value=0, max_value=10**9))
def test_timeout_ms_round_trips(n):
    assert wire.parse_timeout_ms(str(n).encode()) == n


@pytest.mark.parametrize("bad", [b"", b"-1", b"1.5", b"abc", b"12345678901"])
def test_timeout_ms_rejects_garbage_naming_the_header(bad):
    with pytest.raises(wire.HeaderError, match="x-request-timeout-ms"):
        wire.parse_timeout_ms(bad)


@pytest.mark.parametrize(
    ("value", "ms"), [(b"1S", 1000), (b"250m", 250), (b"2M", 120_000), (b"1H", 3_600_000), (b"1500u", 2), (b"1n", 1)]
)
def test_grpc_timeout_units(value, ms):
    assert wire.parse_grpc_timeout_ms(value) == ms


@pytest.mark.parametrize("bad", [b"", b"S", b"123456789S", b"10x", b"1.5S"])
def test_grpc_timeout_rejects_garbage(bad):
    with pytest.raises(wire.HeaderError, match="grpc-timeout"):
        wire.parse_grpc_timeout_ms(bad)


@given(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=255))
def test_printable_keys_are_accepted(key):
    assert wire.validate_idempotency_key(key.encode()) == key.encode()


@pytest.mark.parametrize("bad", [b"", b"x" * 256, b"a\x00b", b"caf\xc3\xa9", b" lead"])
def test_bad_idempotency_keys_name_the_header(bad):
    with pytest.raises(wire.HeaderError, match="idempotency-key"):
        wire.validate_idempotency_key(bad)
