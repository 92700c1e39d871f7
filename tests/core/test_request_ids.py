"""Request ids (pure): what is kept, what is replaced, and the id inside a rejection body."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from proxy.core import request_ids, wire

ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/+=@"


@given(st.binary(max_size=300))
def test_an_accepted_id_is_short_and_needs_no_escaping_anywhere(value):
    kept = request_ids.accept(value)
    if kept is not None:
        assert kept == value and 1 <= len(kept) <= request_ids.MAX_LEN
        text = kept.decode("ascii")
        assert set(text) <= set(ALPHABET)
        assert json.dumps(text) == f'"{text}"'  # no JSON escaping needed


@given(st.text(alphabet=ALPHABET, min_size=1, max_size=request_ids.MAX_LEN))
def test_every_id_of_the_alphabet_is_kept(text):
    assert request_ids.accept(text.encode()) == text.encode()


def test_what_is_replaced():
    for bad in (None, b"", b"x" * 129, b'a"b', b"a\\b", b"a b", b"a\r\nb", "é".encode()):
        assert request_ids.accept(bad) is None


@given(st.integers(min_value=0))
def test_made_ids_are_32_hex_digits(bits):
    made = request_ids.make(bits)
    assert len(made) == 32 and request_ids.accept(made) == made
    assert int(made, 16) == bits % (1 << 128)


@given(st.sampled_from(list(wire.Reason)), st.text(max_size=50), st.one_of(st.none(), st.integers(0, 10**6)))
def test_the_id_goes_into_every_rejection_body_which_stays_json(reason, message, retry_ms):
    _, _, body = wire.rejection(reason, message, retry_ms)
    err = json.loads(wire.with_request_id(body, b"r-1"))["error"]
    assert (err["code"], err["message"], err["request_id"]) == (reason.value, message, "r-1")


def test_a_body_that_is_no_rejection_is_left_alone():
    for body in (b"", b'{"error": {"type": "invalid_request_error"}}', b'{"choices": []}'):
        assert wire.with_request_id(body, b"r-1") == body
