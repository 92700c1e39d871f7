"""RFC 9113 section 8 on a request header block: one test per rule, and h2rules' guarantee for HTTP/1.1."""

from __future__ import annotations

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.http import h2rules
from proxy.http.h2rules import Malformed, RequestHead, h1_request_head, parse_request

PSEUDO = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"pod:8000"), (b":path", b"/v1/chat")]


def parse(extra=(), pseudo=PSEUDO):
    return parse_request(list(pseudo) + list(extra))


def malformed(result, status: int = 400) -> str:
    assert type(result) is Malformed, result
    assert result.status == status
    return result.message


def test_a_well_formed_request_is_picked_apart():
    head = parse(
        [(b"content-type", b"application/json"), (b"content-length", b"12"), (b"cookie", b"a=1"), (b"cookie", b"b=2")]
    )
    assert head == RequestHead(
        method=b"POST",
        target=b"/v1/chat",
        authority=b"pod:8000",
        scheme=b"http",
        headers=(
            (b"content-type", b"application/json"),
            (b"content-length", b"12"),
            (b"cookie", b"a=1"),
            (b"cookie", b"b=2"),
        ),
        content_length=12,
        size=sum(len(n) + len(v) + 32 for n, v in PSEUDO) + 4 * 32 + 12 + 16 + 14 + 2 + 6 + 3 + 6 + 3,
    )


# --- 8.2 / 8.2.1: field names ---
@pytest.mark.parametrize(
    "name", [b"Content-Type", b"X-UPPER", b"a b", b"a:b", b"", b"\x00x", b"caf\xc3\xa9", b"a\x7f", b"(x)"]
)
def test_field_names_must_be_lower_case_tokens(name):
    assert "header name" in malformed(parse([(name, b"v")]))


# --- 8.2.1: field values ---
@pytest.mark.parametrize(
    "value", [b"a\x00b", b"a\rb", b"a\nb", b"a\x01b", b"a\x7fb", b" lead", b"trail ", b"\ttab", b"tab\t"]
)
def test_field_values_without_nul_cr_lf_ctl_or_edge_whitespace(value):
    assert "invalid value" in malformed(parse([(b"x-v", value)]))


@pytest.mark.parametrize("value", [b"", b"a b", b"a\tb", b"\x80\xff obs-text"])
def test_field_values_may_be_empty_or_hold_inner_whitespace_and_obs_text(value):
    assert type(parse([(b"x-v", value)])) is RequestHead


# --- 8.2.2: connection-specific fields ---
@pytest.mark.parametrize("name", sorted(h2rules.CONNECTION_SPECIFIC))
def test_connection_specific_fields_are_malformed(name):
    assert "connection-specific" in malformed(parse([(name, b"x")]))


def test_te_only_as_trailers():
    assert type(parse([(b"te", b"trailers")])) is RequestHead
    assert "te is only allowed" in malformed(parse([(b"te", b"gzip")]))


# --- 8.3: pseudo-header fields ---
def test_pseudo_headers_only_before_regular_fields():
    fields = [*PSEUDO[:3], (b"x-a", b"1"), PSEUDO[3]]
    assert "after a regular field" in malformed(parse_request(fields))


@pytest.mark.parametrize("name", [b":status", b":protocol", b":custom"])
def test_only_request_pseudo_headers(name):
    assert "not allowed in a request" in malformed(parse(pseudo=[*PSEUDO, (name, b"x")]))


@pytest.mark.parametrize("pseudo", PSEUDO, ids=lambda p: p[0].decode())
def test_no_pseudo_header_twice(pseudo):
    assert "duplicate" in malformed(parse(pseudo=[*PSEUDO, pseudo]))


# --- 8.3.1: request pseudo-headers ---
@pytest.mark.parametrize("missing", [b":method", b":scheme", b":path"])
def test_method_scheme_and_path_are_required(missing):
    assert "missing" in malformed(parse(pseudo=[p for p in PSEUDO if p[0] != missing]))


@pytest.mark.parametrize("path", [b"", b"v1/chat", b"http://pod/v1/chat", b"*", b"/a b", b"/a\x00"])
def test_path_is_origin_form(path):
    message = malformed(parse(pseudo=[*PSEUDO[:3], (b":path", path)]))
    assert ":path" in message


def test_options_star_is_the_one_exception():
    pseudo = [(b":method", b"OPTIONS"), (b":scheme", b"http"), (b":authority", b"pod"), (b":path", b"*")]
    assert parse(pseudo=pseudo).target == b"*"


def test_connect_is_refused_with_405():
    pseudo = [(b":method", b"CONNECT"), (b":authority", b"pod:443")]
    malformed(parse(pseudo=pseudo), status=405)


@pytest.mark.parametrize("method", [b"", b"GE T", b"G\x00"])
def test_method_is_a_token(method):
    assert ":method" in malformed(parse(pseudo=[(b":method", method), *PSEUDO[1:]]))


@pytest.mark.parametrize("scheme", [b"ftp", b""])
def test_scheme_is_http_or_https(scheme):
    assert ":scheme" in malformed(parse(pseudo=[PSEUDO[0], (b":scheme", scheme), *PSEUDO[2:]]))


def test_authority_or_host_is_required_and_they_agree():
    no_authority = [p for p in PSEUDO if p[0] != b":authority"]
    assert "missing :authority" in malformed(parse(pseudo=no_authority))
    assert parse([(b"host", b"pod:8000")], pseudo=no_authority).authority == b"pod:8000"
    assert parse([(b"host", b"pod:8000")]).authority == b"pod:8000"
    assert "differ" in malformed(parse([(b"host", b"elsewhere")]))
    assert "more than one host" in malformed(
        parse([(b"host", b"pod:8000"), (b"host", b"pod:8000")], pseudo=no_authority)
    )


@pytest.mark.parametrize("authority", [b"user@pod", b"po d", b"pod\x7f"])
def test_authority_has_no_userinfo_or_controls(authority):
    assert ":authority" in malformed(parse(pseudo=[*PSEUDO[:2], (b":authority", authority), PSEUDO[3]]))


# --- content-length (RFC 9110 8.6; h2 checks it against the DATA frames) ---
@pytest.mark.parametrize("values", [[b"-1"], [b"1.0"], [b"0x10"], [b" 5"], [b"5", b"6"]])
def test_content_length_is_digits_and_consistent(values):
    assert "content-length" in malformed(parse([(b"content-length", v) for v in values]))


def test_repeated_equal_content_lengths_are_one():
    assert parse([(b"content-length", b"5"), (b"content-length", b"5")]).content_length == 5


# --- the memo and the guarantee ---
def test_a_repeated_block_comes_from_the_memo_and_malformed_ones_are_never_kept():
    fields = [*PSEUDO, (b"x-memo", b"1")]
    assert parse_request(list(fields)) is parse_request(list(fields))
    bad = [*PSEUDO, (b"X-Bad", b"1")]
    parse_request(bad)
    assert tuple(bad) not in h2rules._memo


def test_the_memo_is_bounded():
    for i in range(h2rules.MEMO_ENTRIES + 50):
        parse_request([*PSEUDO, (b"x-i", b"%d" % i)])
    assert len(h2rules._memo) <= h2rules.MEMO_ENTRIES


# Mostly valid characters, with every kind of bad one mixed in, so both verdicts are common.
field_names = st.lists(st.sampled_from(list(b"abz09-_.!~Z :(\x00\x7f\xe9")), max_size=8).map(bytes)
field_values = st.lists(st.sampled_from(list(b'az09 \t;="\x80\xff\x01\r\n\x00\x7f')), max_size=12).map(bytes)


@given(st.lists(st.tuples(field_names, field_values), max_size=6))
def test_whatever_passes_is_valid_http1_as_h11_sees_it(extra):
    """The guarantee: an accepted request's head can be written to HTTP/1.1 unchecked."""
    head = parse(extra)
    if type(head) is not RequestHead:
        return
    wire = h1_request_head(head.method, head.target, [(b"host", head.authority), *head.headers])
    server = h11.Connection(h11.SERVER)
    server.receive_data(wire)
    event = server.next_event()
    assert type(event) is h11.Request, wire
    assert [(k, v) for k, v in event.headers] == [(b"host", head.authority), *head.headers]


def test_a_response_head_is_status_and_regular_fields():
    fields = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-encoding", b"identity")]
    status, headers = h2rules.parse_response(fields)
    assert (status, headers) == (200, fields[1:])
    headers.append((b"x-edited", b"1"))  # a caller's edit never reaches the remembered block
    assert h2rules.parse_response(fields) == (200, fields[1:])


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ([(b"content-type", b"a")], "missing :status"),
        ([(b":status", b"20")], "invalid :status"),
        ([(b":status", b"200"), (b":status", b"200")], "pseudo-header"),
        ([(b":status", b"200"), (b":path", b"/")], "pseudo-header"),
        ([(b":status", b"200"), (b"a", b"1"), (b":status", b"204")], "pseudo-header"),
        ([(b":status", b"200"), (b"Upper", b"1")], "invalid header name"),
        ([(b":status", b"200"), (b"x", b"a\nb")], "invalid value"),
        ([(b":status", b"200"), (b"transfer-encoding", b"chunked")], "connection-specific"),
        ([(b":status", b"200"), (b"te", b"gzip")], "connection-specific"),
    ],
)
def test_malformed_response_heads_say_why(fields, why):
    problem = h2rules.parse_response(fields)
    assert isinstance(problem, str) and why in problem


def test_trailers_take_no_pseudo_headers():
    assert h2rules.parse_trailers([(b"grpc-status", b"0"), (b"grpc-message", b"")]) == [
        (b"grpc-status", b"0"),
        (b"grpc-message", b""),
    ]
    assert "pseudo-header" in h2rules.parse_trailers([(b":status", b"200")])
    assert "invalid value" in h2rules.parse_trailers([(b"grpc-message", b"a\r\n")])


def test_trailers_are_remembered_and_handed_out_fresh():
    block = [(b"grpc-status", b"0"), (b"grpc-message", b"")]
    first = h2rules.parse_trailers(block)
    first.append((b"edited", b"by the caller"))
    assert h2rules.parse_trailers(list(block)) == block  # the memo's copy was not the caller's
    assert "invalid value" in h2rules.parse_trailers([(b"grpc-message", b"a\r\n")])  # failures are not remembered
    assert "invalid value" in h2rules.parse_trailers([(b"grpc-message", b"a\r\n")])
