"""Outgoing h11 events, built at a fraction of h11's constructor cost.

Theory of operation: h11's event constructors validate every header with two
regular expressions behind two helper calls each (`bytesify`, `validate`, which
also builds a match groupdict), about 3 us per header: the largest single cost of
sending a head. h11's own parser skips that for what it has already checked by
passing the private `_parsed=True`. We do the same for what we send, after
checking each header with h11's own compiled patterns, so what is accepted is
exactly what h11 accepts. Most pairs repeat request after request (server,
content-type, via, ...), so a pair that passed is remembered in a bounded set and
the next identical pair costs one hash lookup. Anything that fails the check (a
str, a bad character, a list instead of a tuple) is handed to h11's validating
constructor, so the error raised is h11's own `LocalProtocolError`. With `_parsed=True` h11 still lower-cases names
and checks content-length / transfer-encoding framing, and still validates the
request method and target.

`header_list()` turns a parsed event's headers into our `Headers` list from
h11's internal triples, three times faster than iterating h11's `Headers`
(an abc Sequence that builds each pair through `__getitem__`).

`_parsed`, the two patterns and `Headers._full_items` are private h11 API: pyproject.toml pins h11 to
the minor version this was written against (0.16.x); an h11 upgrade must re-check
`h11._events` and `h11._headers` before moving the pin.

h11 events are immutable, so `END` (a bodiless EndOfMessage) is shared.
"""

from __future__ import annotations

import h11
import h11._headers
from h11._headers import _field_name_re, _field_value_re

from proxy.http.messages import Headers

END = h11.EndOfMessage()

_name_ok = _field_name_re.fullmatch
_value_ok = _field_value_re.fullmatch
# Accepted (name, value) pairs. Bounded: cleared when full, and long pairs (cookies,
# tokens) are checked every time rather than kept, so memory stays under ~1 MiB.
_KNOWN: set[tuple[bytes, bytes]] = set()
KNOWN_MAX = 4096
KNOWN_PAIR_BYTES = 200


def headers_ok(headers: Headers) -> bool:
    """True if h11 would accept every (name, value) as it is (bytes, valid characters)."""
    known = _KNOWN
    for pair in headers:
        try:
            if pair in known:
                continue
            name, value = pair
        except (TypeError, ValueError):  # not a hashable 2-tuple: let h11 say what is wrong
            return False
        if type(name) is not bytes or type(value) is not bytes:
            return False
        if _name_ok(name) is None or _value_ok(value) is None:
            return False
        if len(name) + len(value) <= KNOWN_PAIR_BYTES:
            if len(known) >= KNOWN_MAX:
                known.clear()
            known.add(pair)
    return True


def header_list(headers: h11._headers.Headers) -> Headers:
    """(lower-case name, value) pairs of a parsed event's headers, in order."""
    return [(name, value) for _, name, value in headers._full_items]


def response(status: int, headers: Headers, reason: bytes) -> h11.Response:
    if headers_ok(headers):
        return h11.Response(status_code=status, headers=headers, reason=reason, _parsed=True)
    return h11.Response(status_code=status, headers=headers, reason=reason)


def request(method: bytes, target: bytes, headers: Headers) -> h11.Request:
    if headers_ok(headers):
        return h11.Request(method=method, target=target, headers=headers, _parsed=True)
    return h11.Request(method=method, target=target, headers=headers)
