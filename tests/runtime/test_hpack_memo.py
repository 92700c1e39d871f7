"""The remembering HPACK coder codes exactly as hpack does (proxy/http/hpack_memo.py)."""

from __future__ import annotations

import h2.config
import h2.connection
import hpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.http import hpack_memo
from proxy.http.hpack_memo import MemoDecoder, MemoEncoder

NAMES = [b"content-type", b"server", b"x-a", b"x-b", b"date", b"cookie"]
VALUES = [b"application/json", b"nginx", b"1", b"2", b"a-much-longer-value-" * 3, b""]
header = st.builds(
    lambda n, v, never: hpack.NeverIndexedHeaderTuple(n, v) if never else (n, v),
    st.sampled_from(NAMES),
    st.sampled_from(VALUES),
    st.booleans(),
)
head = st.lists(header, min_size=0, max_size=5).map(lambda hs: [(b":status", b"200"), *hs])
# A sequence of coder calls: a head (repeats are likely: few names and values), or a table resize.
call = st.one_of(head.map(lambda h: ("head", h)), st.sampled_from([0, 64, 256, 4096]).map(lambda n: ("size", n)))


_A = b"application/json"


@settings(max_examples=150, deadline=None)
@given(st.lists(call, min_size=1, max_size=40))
@example(  # found by Hypothesis: `server` learnt volatile, then a never-indexed head after the tables parted
    [
        ("head", [(b":status", b"200"), (b"server", _A), (b"server", b"nginx")]),
        ("size", 64),
        ("head", [(b":status", b"200")]),
        ("head", [(b":status", b"200"), (b"server", _A), (b"content-type", _A)]),
        ("head", [(b":status", b"200"), (b"server", _A)]),
        ("head", [(b":status", b"200"), hpack.NeverIndexedHeaderTuple(b"content-type", _A)]),
    ]
)
def test_encoder_and_decoder_code_every_sequence_as_hpack_does(calls):
    plain_enc, memo_enc = hpack.Encoder(), MemoEncoder()
    plain_dec, memo_dec, peer_dec = hpack.Decoder(), MemoDecoder(), hpack.Decoder()
    for kind, arg in calls:
        if kind == "size":
            if arg != plain_enc.header_table_size:  # hpack 4.x drops a pending update when set twice alike
                plain_enc.header_table_size = memo_enc.header_table_size = arg
            continue
        block = plain_enc.encode(arg)
        # Once a name is volatile its fields go as literals that plain hpack would have indexed, so
        # the two encoders' tables part for good (even for heads without that name, or with
        # HeaderTuple kinds that go straight to hpack): from then on only what the peer decodes
        # is comparable, not the bytes.
        diverged = bool(memo_enc.volatile)
        mine = memo_enc.encode(list(arg))
        if not diverged:
            assert mine == block  # nothing learnt volatile yet: exactly hpack's bytes
        assert peer_dec.decode(mine, raw=True) == arg  # what the peer decodes: the same fields, in order
        assert memo_dec.decode(block, raw=True) == plain_dec.decode(block, raw=True) == arg
    assert peer_dec.decode(memo_enc.encode([]), raw=True) == []  # carries a pending table size update
    assert list(memo_enc.header_table.dynamic_entries) == list(peer_dec.header_table.dynamic_entries)
    assert list(memo_dec.header_table.dynamic_entries) == list(plain_dec.header_table.dynamic_entries)


def test_a_changing_value_is_learnt_volatile_and_the_rest_stays_remembered():
    """grpc-timeout changes on every call: after VOLATILE_AFTER changes it goes as a literal without
    indexing where it stands, the table stops changing, and the runs around it are memo hits again."""
    enc, peer = MemoEncoder(), hpack.Decoder()
    fixed = [(b":method", b"POST"), (b":path", b"/svc/M"), (b"content-type", b"application/grpc")]
    for i in range(50):
        head = [*fixed, (b"grpc-timeout", b"%du" % (4_999_000 - i)), (b"te", b"trailers")]
        block = enc.encode(head)
        assert peer.decode(block, raw=True) == head
    assert enc.volatile == {b"grpc-timeout"}
    entries = list(enc.header_table.dynamic_entries)
    before = enc.hits
    for i in range(10):
        enc.encode([*fixed, (b"grpc-timeout", b"%dm" % i), (b"te", b"trailers")])
    assert enc.hits == before + 20  # the runs before and after it are remembered
    assert list(enc.header_table.dynamic_entries) == entries == list(peer.header_table.dynamic_entries)


def test_a_repeated_indexed_head_is_coded_once():
    enc, dec = MemoEncoder(), MemoDecoder()
    head = [(b":method", b"POST"), (b":path", b"/v1/x"), (b"content-type", b"application/json")]
    first, second = enc.encode(head), enc.encode(head)  # the first adds :path and content-type to the table
    assert first != second
    assert enc.encode(head) == second and (enc.hits, enc.misses) == (1, 2)
    dec.decode(first, raw=True)
    for _ in range(3):
        assert dec.decode(second, raw=True) == head
    assert (dec.hits, dec.misses) == (2, 2)


def test_nginx_heads_into_a_table_sized_zero_are_remembered():
    """nginx sizes its table 0, then sends literal-with-indexing fields: adding to it changes nothing."""
    dec = MemoDecoder()
    size_zero = bytes.fromhex("20")
    block = bytes.fromhex(
        "887689aa6355e580ae212e1f6197dd6d5f4a09f5349fba82009c502f5c6c171b6d4c5a37ff5f8b1d75d0620d263d4c7441ea5c023131"
    )
    first = dec.decode(size_zero + block, raw=True)
    assert first[0] == (b":status", b"200") and (b"content-length", b"11") in first
    assert dec.decode(block, raw=True) == dec.decode(block, raw=True) == first
    assert dec.hits == 1 and dec.header_table.dynamic_entries == type(dec.header_table.dynamic_entries)()


def test_a_never_indexed_field_is_not_taken_for_a_plain_one():
    never = [hpack.NeverIndexedHeaderTuple(b"authorization", b"secret")]
    enc = MemoEncoder()
    first = enc.encode(never)  # a literal that is never indexed: the table stays empty
    assert enc.encode([(b"authorization", b"secret")]) != first  # a plain one is indexed
    assert hpack.Decoder().decode(first, raw=True)[0].indexable is False


def test_a_table_change_forgets_what_was_coded_under_the_old_table():
    dec, enc = MemoDecoder(), hpack.Encoder()
    enc.encode([(b"x-a", b"1")])  # now indexed in enc's table; dec's is still empty
    indexed = enc.encode([(b"x-a", b"1")])
    with pytest.raises(hpack.InvalidTableIndex):
        dec.decode(indexed, raw=True)  # refers to an entry dec does not have: raises, not remembered
    with pytest.raises(hpack.InvalidTableIndex):
        dec.decode(indexed, raw=True)


def test_a_smaller_header_list_limit_is_checked_again():
    dec = MemoDecoder()
    block = hpack.Encoder().encode([(b"x-a", b"v" * 100)])
    dec.decode(block, raw=True)
    dec.max_header_list_size = 50
    with pytest.raises(hpack.OversizedHeaderListError):
        dec.decode(block, raw=True)


def test_install_swaps_the_coder_of_a_fresh_h2_connection_only():
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    assert hpack_memo.install(conn)
    assert isinstance(conn.encoder, MemoEncoder) and isinstance(conn.decoder, MemoDecoder)
    conn.send_headers(
        1, [(b":method", b"GET"), (b":path", b"/"), (b":scheme", b"http"), (b":authority", b"a")], end_stream=True
    )
    used = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    used.initiate_connection()
    used.send_headers(1, [(b":method", b"GET"), (b":path", b"/x"), (b":scheme", b"http"), (b":authority", b"a")])
    assert not hpack_memo.install(used)  # its table already holds fields


@given(
    name=st.sampled_from([b"grpc-timeout", b"x-request-id", b"content-length", b"date", b"x-rampmeter-queue-ms"]),
    value=st.binary(max_size=300),
)
def test_the_fast_literal_codes_what_the_plain_literal_codes(name, value):
    """A volatile field's literal, with the name's part remembered and a short length as one byte,
    is byte for byte what `_literal` codes (and hpack decodes it back)."""
    from proxy.http.hpack_memo import _literal, _literal_fast

    assert _literal_fast(name, value) == _literal(name, value)
    assert hpack.Decoder().decode(_literal_fast(name, value), raw=True) == [(name, value)]
