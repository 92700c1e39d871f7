"""The shortcuts h1parse takes on its hot path give what the long way gives.

- The parsers count a head's size only when the reads it came in could hold more than
  the limit (the common short head costs no per-field arithmetic): the bound is exact
  at the limit for every split point, for requests and responses.
- A response's version is read from its first bytes when they are "HTTP/1.1 " (httptools
  formats the string anew per call): any other start, a split status line, or an
  interim 1xx response before the final one, asks llhttp.
"""

from __future__ import annotations

import pytest

from proxy.http.h1parse import FramingError, RequestHead, RequestParser, ResponseParser

LIMIT = 256


def _request(pad: int) -> bytes:
    return b"GET /x HTTP/1.1\r\nhost: h\r\nx-pad: " + b"a" * pad + b"\r\n\r\n"


def _head_size(pad: int) -> int:
    # fields as the parser counts them (name + ": " + value + CRLF) plus the target
    return len(b"host") + 1 + 4 + len(b"x-pad") + pad + 4 + len(b"/x")


def _parse_request(data: bytes, split: int) -> list:
    parser = RequestParser(LIMIT)
    parser.feed(data[:split])
    parser.feed(data[split:])
    return list(parser.events)


@pytest.mark.parametrize("over", [False, True])
def test_request_head_limit_holds_at_every_split(over):
    pad = LIMIT - _head_size(0) + (1 if over else 0)
    data = _request(pad)
    for split in range(0, len(data) + 1, 7):
        events = _parse_request(data, split)
        refused = [e for e in events if isinstance(e, FramingError)]
        if over:
            assert refused and refused[0].status == 431, (split, events)
        else:
            assert not refused and isinstance(events[0], RequestHead), (split, events)


def test_short_head_in_a_long_read_is_not_refused():
    # A short head followed by pipelined requests: the read is far longer than the limit.
    data = _request(10) * 50
    parser = RequestParser(LIMIT)
    parser.feed(data)
    heads = [e for e in parser.events if isinstance(e, RequestHead)]
    assert len(heads) == 50 and not any(isinstance(e, FramingError) for e in parser.events)


@pytest.mark.parametrize("over", [False, True])
def test_response_head_limit_holds_at_every_split(over):
    fixed = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-pad: "
    counted = len(b"content-length") + 1 + 4 + len(b"x-pad") + 4
    # Over: one byte past the counted limit. Under: clear of it by the status line and blank line,
    # which the bound on bytes read while the head is incomplete also counts (as it always has).
    pad = LIMIT - counted + 1 if over else LIMIT - counted - 24
    data = fixed + b"a" * pad + b"\r\n\r\nok"
    for split in range(0, len(data) + 1, 7):
        rp = ResponseParser(LIMIT)
        rp.expect(b"GET")
        rp.feed(data[:split])
        rp.feed(data[split:])
        if over:
            assert rp.error is not None and rp.head is None, split
        else:
            assert rp.error is None and rp.complete and b"".join(rp.body) == b"ok", split


@pytest.mark.parametrize(
    ("reads", "version", "keep_alive"),
    [
        ([b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"], "1.1", True),
        ([b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"], "1.0", False),
        ([b"HTTP/1.", b"0 200 OK\r\ncontent-length: 0\r\n\r\n"], "1.0", False),
        ([b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n"], "1.0", False),
        ([b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"], "1.1", True),
    ],
)
def test_response_version_matches_llhttp(reads, version, keep_alive):
    rp = ResponseParser()
    rp.expect(b"GET")
    for data in reads:
        rp.feed(data)
    assert rp.error is None and rp.head is not None and rp.complete
    assert (rp.head.version, rp.head.keep_alive) == (version, keep_alive)
