"""proxy.core.dedup: the record table, decisions, settling, key scoping (pure, table-driven)."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import dedup as d
from proxy.core.wire import Reason

S, E = d.State, d.Step
STORED = d.Stored("fp", 200, [(b"content-type", b"application/json")], [b'{"a":', b"1}"], False)

ALLOWED = {
    (S.ABSENT, E.CLAIM): S.IN_FLIGHT,
    (S.IN_FLIGHT, E.STORE): S.COMPLETE,
    (S.IN_FLIGHT, E.RELEASE): S.ABSENT,
    (S.IN_FLIGHT, E.LAPSE): S.ABSENT,
    (S.COMPLETE, E.EXPIRE): S.ABSENT,
    (S.COMPLETE, E.EVICT): S.ABSENT,
}


@pytest.mark.parametrize("state,step", list(itertools.product(S, E)), ids=lambda x: x.value)
def test_every_transition_is_in_the_table_or_raises(state, step):
    if (state, step) in ALLOWED:
        assert d.advance(state, step) is ALLOWED[state, step]
    else:
        with pytest.raises(d.DedupStateError, match=f"from {state.value} on {step.value}"):
            d.advance(state, step)


IN_FLIGHT = d.Record(S.IN_FLIGHT, "fp", "owner-1")
COMPLETE = d.Record(S.COMPLETE, "fp", "", STORED)

DECISIONS = [
    (None, "fp", "coalesce", d.Lead()),
    (d.Record(S.ABSENT, "fp"), "other", "coalesce", d.Lead()),
    (IN_FLIGHT, "fp", "coalesce", d.Follow("owner-1")),
    (IN_FLIGHT, "fp", "conflict", d.InFlightConflict()),
    (IN_FLIGHT, "other", "coalesce", d.Mismatch()),  # a different payload is 422 even while running
    (IN_FLIGHT, "other", "conflict", d.Mismatch()),
    (COMPLETE, "fp", "coalesce", d.Replay(STORED)),
    (COMPLETE, "fp", "conflict", d.Replay(STORED)),
    (COMPLETE, "other", "coalesce", d.Mismatch()),
]


@pytest.mark.parametrize("record,fp,mode,expected", DECISIONS)
def test_decide(record, fp, mode, expected):
    assert d.decide(record, fp, mode) == expected


SETTLE = [
    # ok, status, size, overflowed -> verdict   (max_entry_bytes = 100)
    (True, 200, 10, False, d.Verdict.STORED),
    (True, 201, 100, False, d.Verdict.STORED),
    (True, 404, 10, False, d.Verdict.STORED),  # deterministic client error: replayed
    (True, 422, 10, False, d.Verdict.STORED),
    (True, 429, 10, False, d.Verdict.NOT_STORABLE),  # "try again" statuses are never kept
    (True, 408, 10, False, d.Verdict.NOT_STORABLE),
    (True, 500, 10, False, d.Verdict.NOT_STORABLE),
    (True, 503, 10, False, d.Verdict.NOT_STORABLE),
    (True, 200, 101, False, d.Verdict.TOO_LARGE),
    (True, 200, 10, True, d.Verdict.TOO_LARGE),
    (False, 200, 10, False, d.Verdict.FAILED),  # broke mid-stream
    (True, None, 0, False, d.Verdict.FAILED),  # no head recorded
    (False, None, 0, False, d.Verdict.FAILED),
]


@pytest.mark.parametrize("ok,status,size,overflowed,verdict", SETTLE)
def test_settle(ok, status, size, overflowed, verdict):
    assert d.settle(ok, status, size, 100, overflowed) is verdict


def test_untrusted_tenant_header_is_ignored_and_authorization_is_hashed():
    assert d.tenant_of(b"acme", b"Bearer sk-1", trust_tenant_header=False) == d.tenant_of(None, b"Bearer sk-1", False)
    assert d.tenant_of(b"acme", b"Bearer sk-1", trust_tenant_header=True) == "t:acme"
    hashed = d.tenant_of(None, b"Bearer sk-secret", False)
    assert hashed.startswith("a:") and "sk-secret" not in hashed
    assert d.tenant_of(None, b"Bearer sk-2", False) != hashed
    assert d.tenant_of(None, None, False) == d.ANONYMOUS


parts = st.binary(min_size=0, max_size=12)


@given(st.tuples(parts, parts, parts, parts), st.tuples(parts, parts, parts, parts))
def test_scope_differs_whenever_any_component_differs(a, b):
    sa = d.scope_key(a[0].decode("latin-1"), a[1], a[2], a[3])
    sb = d.scope_key(b[0].decode("latin-1"), b[1], b[2], b[3])
    assert (sa == sb) == (a == b)
    assert len(sa) == 40 and d.short(sa) == sa[:12]


@given(st.binary(max_size=40).filter(lambda k: len(k) > 3))
def test_scope_reveals_nothing_of_the_key(key):
    scope = d.scope_key("t", b"POST", b"/v1/x", key)
    assert key.hex() not in scope and int(scope, 16) >= 0


def test_fingerprint_covers_query_body_and_named_headers():
    base = d.fingerprint(b"{}", b"a=1", (b"gpt",))
    assert base == d.fingerprint(b"{}", b"a=1", (b"gpt",))
    assert base != d.fingerprint(b"{} ", b"a=1", (b"gpt",))
    assert base != d.fingerprint(b"{}", b"a=2", (b"gpt",))
    assert base != d.fingerprint(b"{}", b"a=1", (b"gpt2",))
    assert d.fingerprint(b"", b"", (None,)) != d.fingerprint(b"", b"", (b"",))  # absent differs from empty
    assert d.fingerprint(b"ab", b"c") != d.fingerprint(b"a", b"bc")


def test_replay_events_mark_the_head_and_keep_the_chunks():
    events = d.replay_events(STORED)
    assert events[0] == d.Head(200, [*STORED.headers, (b"idempotent-replayed", b"true")], False)
    assert events[1:] == [d.Chunk(b'{"a":'), d.Chunk(b"1}"), d.END]
    assert STORED.headers == [(b"content-type", b"application/json")]  # not mutated


def test_stored_round_trips_through_msgpack_and_knows_its_size():
    again = msgspec.msgpack.decode(msgspec.msgpack.encode(STORED), type=d.Stored)
    assert again == STORED
    assert STORED.size == len(b'{"a":1}') + len(b"content-type") + len(b"application/json")


def test_storable_statuses():
    assert [s for s in (100, 200, 204, 301, 400, 404, 408, 409, 425, 429, 499, 500, 502) if d.is_storable(s)] == [
        100,
        200,
        204,
        301,
        400,
        404,
        409,
        499,
    ]
    assert Reason.IDEMPOTENCY_KEY_REUSED.value == "idempotency_key_reused"
