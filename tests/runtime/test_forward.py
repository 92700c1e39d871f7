"""Forwarding header rules (proxy/http/forward.py): pure functions, no I/O."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.http.forward import (
    h2_request_headers,
    request_headers,
    response_headers,
    via_token,
)
from proxy.http.messages import HOP_BY_HOP, Request


class _NoBody:
    content_length = 0


def req(headers, *, version="1.1", client="10.0.0.7", authority=b"", scheme=b"http") -> Request:
    return Request(
        b"GET",
        b"/v1/models",
        headers,
        _NoBody(),
        http_version=version,
        client=client,
        authority=authority,
        scheme=scheme,
    )


def names(headers) -> list[bytes]:
    return [k for k, _ in headers]


def test_hop_by_hop_and_connection_listed_fields_are_dropped():
    out = request_headers(
        req(
            [
                (b"host", b"api.example"),
                (b"connection", b"keep-alive, X-Secret"),
                (b"keep-alive", b"timeout=5"),
                (b"x-secret", b"1"),
                (b"te", b"trailers"),
                (b"transfer-encoding", b"chunked"),
                (b"upgrade", b"h2c"),
                (b"proxy-authorization", b"Basic x"),
                (b"accept", b"*/*"),
            ]
        ),
        b"127.0.0.1:8000",
    )
    assert not set(names(out)) & (HOP_BY_HOP - {b"te"} | {b"x-secret"})
    assert (b"accept", b"*/*") in out
    assert (b"te", b"trailers") in out  # the client reads trailers (gRPC needs it); any other te is dropped


def test_te_goes_on_only_as_trailers():
    assert (b"te", b"trailers") in request_headers(req([(b"te", b"gzip, Trailers;q=1")]), b"up:1")
    assert b"te" not in names(request_headers(req([(b"te", b"gzip")]), b"up:1"))


def test_client_host_is_kept_as_is_and_first():
    out = request_headers(req([(b"accept", b"*/*"), (b"host", b"api.example:443")]), b"127.0.0.1:8000")
    assert out[0] == (b"host", b"api.example:443")
    assert names(out).count(b"host") == 1


def test_missing_host_comes_from_h2_authority_then_upstream():
    assert request_headers(req([], version="2", authority=b"front.example"), b"up:1")[0] == (b"host", b"front.example")
    assert request_headers(req([]), b"127.0.0.1:8000")[0] == (b"host", b"127.0.0.1:8000")


def test_via_and_forwarded_for_are_appended_and_proto_is_set():
    out = dict(
        request_headers(
            req(
                [
                    (b"host", b"h"),
                    (b"via", b"1.1 edge"),
                    (b"x-forwarded-for", b"1.2.3.4"),
                    (b"x-forwarded-for", b"5.6.7.8"),
                    (b"x-forwarded-proto", b"https"),
                ]
            ),
            b"up:1",
        )
    )
    assert out[b"via"] == b"1.1 edge, 1.1 rampmeter"
    assert out[b"x-forwarded-for"] == b"1.2.3.4, 5.6.7.8, 10.0.0.7"
    assert out[b"x-forwarded-proto"] == b"http"  # never trusted from the client


def test_via_names_the_received_protocol():
    assert dict(request_headers(req([], version="2"), b"u:1"))[b"via"] == b"2 rampmeter"
    assert dict(request_headers(req([], version="1.0"), b"u:1"))[b"via"] == b"1.0 rampmeter"
    assert via_token("3") == b"3 rampmeter"


def test_unknown_client_address_adds_no_empty_forwarded_for():
    assert b"x-forwarded-for" not in names(request_headers(req([(b"host", b"h")], client=""), b"u:1"))


def test_h2_cookie_fields_are_joined_for_http1():
    out = request_headers(req([(b"cookie", b"a=1"), (b"cookie", b"b=2")], version="2"), b"u:1")
    assert [v for k, v in out if k == b"cookie"] == [b"a=1; b=2"]


def test_response_headers_strip_hop_by_hop_and_append_via():
    out = response_headers(
        [
            (b"content-type", b"text/event-stream"),
            (b"connection", b"keep-alive, x-internal"),
            (b"x-internal", b"1"),
            (b"transfer-encoding", b"chunked"),
            (b"keep-alive", b"timeout=5"),
            (b"via", b"1.1 model"),
        ]
    )
    assert out == [(b"content-type", b"text/event-stream"), (b"via", b"1.1 model, 1.1 rampmeter")]
    assert dict(response_headers([], "2"))[b"via"] == b"2 rampmeter"


def test_h2_block_has_pseudo_headers_first_and_authority_from_host():
    block = h2_request_headers(
        b"POST",
        b"/v1/chat?x=1",
        [
            (b"host", b"api.example"),
            (b"content-type", b"application/json"),
            (b"connection", b"close"),
            (b"keep-alive", b"1"),
            (b"transfer-encoding", b"chunked"),
            (b"upgrade", b"websocket"),
            (b"te", b"gzip"),
            (b"cookie", b"a=1"),
            (b"cookie", b"b=2"),
        ],
        authority=b"fallback:1",
    )
    assert block[:4] == [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":authority", b"api.example"),
        (b":path", b"/v1/chat?x=1"),
    ]
    rest = block[4:]
    assert all(not k.startswith(b":") for k, _ in rest)
    assert names(rest) == [b"content-type", b"cookie"]
    assert dict(rest)[b"cookie"] == b"a=1; b=2"


def test_h2_block_keeps_te_trailers_and_falls_back_to_given_authority():
    block = h2_request_headers(b"GET", b"/", [(b"te", b"Trailers")], authority=b"up:8000")
    assert (b":authority", b"up:8000") in block
    assert (b"te", b"trailers") in block


_names = st.sampled_from(
    [
        b"host",
        b"accept",
        b"connection",
        b"x-a",
        b"x-b",
        b"te",
        b"via",
        b"x-forwarded-for",
        b"cookie",
        b"keep-alive",
        b"upgrade",
        b"transfer-encoding",
        b"content-length",
    ]
)
_values = st.sampled_from([b"1", b"x-a", b"close, x-b", b"trailers", b"keep-alive"])


@given(st.lists(st.tuples(_names, _values), max_size=12))
def test_forwarded_request_never_carries_a_hop_by_hop_field(headers):
    out = request_headers(req(headers), b"up:1")
    listed = {t.strip().lower() for k, v in headers if k == b"connection" for t in v.split(b",")}
    assert not set(names(out)) & (HOP_BY_HOP - {b"te"} | listed - {b"te"})
    # te only as `trailers`, once, and only when the client said it
    assert [v for k, v in out if k == b"te"] == ([b"trailers"] if (b"te", b"trailers") in headers else [])
    assert names(out).count(b"host") == 1 and out[0][0] == b"host"
    assert names(out).count(b"via") == 1
    # the forwarded h2 block is legal whatever the client sent
    block = h2_request_headers(b"GET", b"/", out)
    assert names(block)[:4] == [b":method", b":scheme", b":authority", b":path"]
    assert not set(names(block)) & {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"upgrade"}
