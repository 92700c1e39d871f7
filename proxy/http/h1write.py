"""HTTP/1.1 heads and body framing, written by hand: the sending half of `h1parse`.

Theory of operation: a head is one bytes object, built in one pass:
`response_head(status, headers)` and `request_head(method, target, headers)`.
Bodies are framed by the caller's choice: as they are (Content-Length, or close
-delimited), or `chunk(data)` ... `LAST_CHUNK`. Framing fields are the callers'
business (the connection modules decide Content-Length, chunked and
`connection`); this module only writes what it is given, after checking it.

The check is the one h11 made on everything we sent (its field-name and
field-value grammar, RFC 9110 5.1 and 5.5, relaxed as h11 relaxes it): a name is
a token; a value has no NUL, CR, LF or other whitespace but inner runs of SP and
HTAB, and none leading or trailing. A value with CR LF in it would let whoever chose it add fields of
their own (response splitting), so nothing is written unchecked. Most pairs
repeat request after request (server, content-type, via, ...): a pair that
passed is remembered in a bounded set, and a head whose pairs are all known
costs one `issuperset` call. A bad field raises `FieldError` (a bug in whoever
built the head: the exchange answers 500 and logs it).

Why by hand rather than h11's event objects: building h11 events and letting
h11 serialise them cost ~3 us per header even with the private fast paths that
`h11events` used to take. The fields are joined in C: `b"\r\n".join(map(b": ".join,
headers))` builds one bytes object per field and no Python frame, against three
concatenations per field in a list comprehension (timeit, six fields: ~2x faster).
A request's method passed the token check once per distinct method (`_METHODS`, bounded):
the method set is small, the target is checked every time.

Fields whose maker built them valid need not wait for the check: the sidecar's own request id
(a made one is 32 hex digits; a caller's is kept only in proxy/core/request_ids.py's alphabet,
1-128 bytes, within the field-value grammar) is new on every request, so checked here it went
through both regexes and into the known set each time, which then filled and was cleared every
~4,000 requests. Its maker `vouch`es for the pair (it is known from then on) and `forget`s it when
the request is over, so the set holds only the live requests' ids. A vouched pair is only ever
one that would pass: were it missing (forgotten, or cleared with the set), it is checked as any other.
"""

from __future__ import annotations

import http
import re

from proxy.http.messages import Headers

_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+").fullmatch
# h11's own relaxed field-value (any byte but NUL and whitespace, single inner runs of SP/HTAB):
# what the old data path accepted, so no handler that worked before gets a 500 now.
_VALUE = re.compile(rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?").fullmatch
_TARGET = re.compile(rb"[\x21-\x7e\x80-\xff]+").fullmatch
# Accepted (name, value) pairs. Bounded: cleared when full, and long pairs (cookies,
# tokens) are checked every time rather than kept, so memory stays under ~1 MiB.
_KNOWN: set[tuple[bytes, bytes]] = set()
KNOWN_MAX = 4096
KNOWN_PAIR_BYTES = 200

# A field its maker built valid (module doc), for as long as it is in use: no Python frame per call.
vouch = _KNOWN.add
forget = _KNOWN.discard

LAST_CHUNK = b"0\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STATUS_LINES: dict[int, bytes] = {}
_REASONS: dict[int, bytes] = {}
_METHODS: set[bytes] = set()  # methods that passed _TOKEN (module doc); cleared past KNOWN_MAX
_CRLF = b"\r\n"
_FIELD = b": ".join  # (name, value) -> b"name: value", in C


class FieldError(ValueError):
    """A header field that must not be written (bad name or value characters)."""


def check_fields(headers: Headers) -> None:
    """Raise FieldError unless every (name, value) is a valid field; remember the ones that pass."""
    known = _KNOWN
    if known.issuperset(headers):
        return
    for pair in headers:
        if pair in known:
            continue
        try:
            name, value = pair
        except (TypeError, ValueError):
            raise FieldError(f"header field must be a (name, value) pair, got {pair!r}") from None
        if type(name) is not bytes or type(value) is not bytes:
            raise FieldError(f"header field must be bytes, got {pair!r}")
        if _TOKEN(name) is None:
            raise FieldError(f"illegal header name {name!r}")
        if _VALUE(value) is None:
            raise FieldError(f"illegal header value {value[:100]!r}")
        if len(name) + len(value) <= KNOWN_PAIR_BYTES:
            if len(known) >= KNOWN_MAX:
                known.clear()
            known.add(pair)


def reason_phrase(status: int) -> bytes:
    """The standard reason phrase (some clients, h2load among them, need one to see the status)."""
    reason = _REASONS.get(status)
    if reason is None:
        try:
            reason = http.HTTPStatus(status).phrase.encode()
        except ValueError:
            reason = b""
        _REASONS[status] = reason
    return reason


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        if not 100 <= status <= 999:
            raise FieldError(f"status {status} is not three digits")
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, reason_phrase(status))
    return line


def response_head(status: int, headers: Headers) -> bytes:
    """`HTTP/1.1 status reason`, the fields, and the blank line."""
    line = _status_line(status)
    check_fields(headers)  # also what makes every pair a (bytes, bytes) for the join below
    if not headers:
        return line + _CRLF
    return line + _CRLF.join(map(_FIELD, headers)) + b"\r\n\r\n"


def request_head(method: bytes, target: bytes, headers: Headers) -> bytes:
    """`METHOD target HTTP/1.1`, the fields, and the blank line."""
    if type(method) is not bytes or method not in _METHODS:
        if _TOKEN(method) is None:
            raise FieldError(f"illegal request line {method[:20]!r} {target[:100]!r}")
        if type(method) is bytes:
            if len(_METHODS) >= KNOWN_MAX:
                _METHODS.clear()
            _METHODS.add(method)
    if _TARGET(target) is None:
        raise FieldError(f"illegal request line {method[:20]!r} {target[:100]!r}")
    check_fields(headers)  # also what makes every pair a (bytes, bytes) for the join below
    if not headers:
        return method + b" " + target + b" HTTP/1.1\r\n\r\n"
    return method + b" " + target + b" HTTP/1.1\r\n" + _CRLF.join(map(_FIELD, headers)) + b"\r\n\r\n"


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (never empty: an empty chunk would end the body)."""
    return b"%x\r\n%s\r\n" % (len(data), data)
