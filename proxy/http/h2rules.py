"""What RFC 9113 section 8 requires of a request header block, checked in one pass.

Theory of operation: the h2 server runs h2 with its own header validation and
normalisation off (measured: a tenth of the h2c front end's CPU per request, for
checks spread over seven generator passes) and calls `parse_request(fields)` on each
decoded block instead. One loop over the fields checks exactly the rules below and
picks out what the Request needs; the answer is a value, a `RequestHead` or a
`Malformed` (status and message), never an exception.

Rules (RFC 9113; the section in brackets):
- field names are lower case, non-empty tokens; pseudo-header names start with ":"
  and are only `:method :scheme :authority :path` in a request, each at most once,
  all before the first regular field [8.2, 8.2.1, 8.3, 8.3.1];
- field values hold no NUL, CR, LF or other control character but HTAB, and do not
  start or end with SP or HTAB [8.2.1; RFC 9110 5.5 lets us refuse other CTLs, and
  then every accepted field is also valid on an HTTP/1.1 wire];
- no connection-specific fields (connection, keep-alive, proxy-connection,
  transfer-encoding, upgrade), and `te` only as "trailers" [8.2.2];
- :method, :scheme and :path present; :path is origin-form ("/...") or "*" for
  OPTIONS, never empty [8.3.1]; CONNECT is refused (405: not a tunnel);
- :authority or Host present, the same when both are, at most one Host, and no
  userinfo in :authority [8.3.1]; :scheme is http or https;
- content-length is digits (h2 itself checks it against the DATA received and, being
  a state machine detail, that a malformed one is a connection error).
Multiple `cookie` fields are allowed (8.2.3): they stay apart here and are joined
when forwarded (proxy/http/forward.py).

Guarantee for whoever writes these fields onward: every name is a lower-case
token and every value is field-content, so an HTTP/1.1 head can be serialised from
a parsed request (plus the forwarding layer's own fields) without checking them
again (`h1_request_head`, for the upstream writer).

Cost: clients repeat their heads, and the HPACK memo (hpack_memo.py) hands back the
very same field tuples for a repeated block, so whole blocks that passed are
remembered (bounded, oldest first) and a repeat costs one dict lookup.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.http.messages import Headers

# RFC 9110 5.6.2 tchar, lower case only (RFC 9113 8.2: upper case is malformed).
_NAME_OK = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-z]+").fullmatch
_VALUE_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]|\A[ \t]|[ \t]\Z").search
_TARGET_BAD = re.compile(rb"[\x00-\x20\x7f]").search  # :path and :authority: no CTL, no SP
_TOKEN_OK = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-zA-Z]+").fullmatch
CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})
_PSEUDO = frozenset({b":method", b":scheme", b":authority", b":path"})
_SCHEMES = frozenset({b"http", b"https"})

MEMO_ENTRIES = 256
MEMO_MAX_FIELDS = 64
MEMO_MAX_BYTES = 4096  # larger heads are parsed every time: the memo stays under ~1 MiB


@dataclass(frozen=True, slots=True)
class RequestHead:
    method: bytes
    target: bytes
    authority: bytes
    scheme: bytes
    headers: tuple[tuple[bytes, bytes], ...]  # regular fields, in order; copied into each Request
    content_length: int | None
    size: int  # RFC 9113 6.5.2 header list size: names + values + 32 per field


@dataclass(frozen=True, slots=True)
class Malformed:
    status: int  # 400, or 405 for CONNECT
    message: str


_memo: dict[tuple, RequestHead] = {}


def parse_request(fields: list[tuple[bytes, bytes]]) -> RequestHead | Malformed:
    """The request in a decoded header block, or why it is malformed (RFC 9113 section 8)."""
    key = None
    if len(fields) <= MEMO_MAX_FIELDS:
        key = tuple(fields)
        hit = _memo.get(key)
        if hit is not None:
            return hit
    head = _parse(fields)
    if key is not None and type(head) is RequestHead and head.size <= MEMO_MAX_BYTES:
        if len(_memo) >= MEMO_ENTRIES:
            del _memo[next(iter(_memo))]  # the oldest (dicts keep insertion order)
        _memo[key] = head
    return head


def _parse(fields: list[tuple[bytes, bytes]]) -> RequestHead | Malformed:
    method = target = authority = scheme = host = None
    regular: list[tuple[bytes, bytes]] = []
    size = 0
    length = None
    for field in fields:
        name, value = field
        size += len(name) + len(value) + 32
        if name[:1] == b":":
            if regular:
                return Malformed(400, f"pseudo-header {_show(name)} after a regular field")
            if name not in _PSEUDO:
                return Malformed(400, f"pseudo-header {_show(name)} is not allowed in a request")
            if name == b":method":
                if method is not None:
                    return _duplicate(name)
                method = value
            elif name == b":path":
                if target is not None:
                    return _duplicate(name)
                target = value
            elif name == b":authority":
                if authority is not None:
                    return _duplicate(name)
                authority = value
            else:
                if scheme is not None:
                    return _duplicate(name)
                scheme = value
            continue
        if _NAME_OK(name) is None:
            return Malformed(400, f"invalid header name {_show(name)} (names are lower-case tokens)")
        if _VALUE_BAD(value) is not None:
            return Malformed(400, f"invalid value for header {_show(name)}")
        if name in CONNECTION_SPECIFIC:
            return Malformed(400, f"connection-specific header {_show(name)} is not allowed in HTTP/2")
        if name == b"te" and value != b"trailers":
            return Malformed(400, 'te is only allowed as "trailers" in HTTP/2')
        if name == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                return Malformed(400, "invalid content-length")
            length = int(value)
        elif name == b"host":
            if host is not None:
                return Malformed(400, "more than one host header")
            host = value
        regular.append(field)
    return _check_pseudo(method, target, authority, scheme, host, regular, length, size)


def _check_pseudo(method, target, authority, scheme, host, regular, length, size) -> RequestHead | Malformed:
    if method is None or _TOKEN_OK(method) is None:
        return Malformed(400, "missing or invalid :method")
    if method == b"CONNECT":
        return Malformed(405, "CONNECT is not supported")
    if scheme is None or scheme not in _SCHEMES:
        return Malformed(400, "missing or unsupported :scheme (http or https)")
    if not target or _TARGET_BAD(target) is not None:
        return Malformed(400, "missing, empty or invalid :path")
    if target[:1] != b"/" and not (target == b"*" and method == b"OPTIONS"):
        return Malformed(400, ':path must be origin-form ("/...") or "*" for OPTIONS')
    if authority is not None:
        if _TARGET_BAD(authority) is not None or b"@" in authority:
            return Malformed(400, "invalid :authority")
        if host is not None and host != authority:
            return Malformed(400, ":authority and host differ")
    elif host is None:
        return Malformed(400, "missing :authority and host")
    return RequestHead(method, target, authority or host or b"", scheme, tuple(regular), length, size)


def _duplicate(name: bytes) -> Malformed:
    return Malformed(400, f"duplicate pseudo-header {_show(name)}")


def _show(name: bytes) -> str:
    return repr(name[:40])[1:]


def h1_request_head(method: bytes, target: bytes, headers: Headers) -> bytes:
    """An HTTP/1.1 request head for fields that passed `parse_request` (or that we made).

    No checks here, by the module's guarantee; header names are written as they are
    (lower case, which HTTP/1.1 treats as equal)."""
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


# --- what an HTTP/2 upstream sends back (the upstream client runs h2 with inbound validation off too) ---

_response_memo: dict[tuple, tuple[int, list[tuple[bytes, bytes]]]] = {}


def parse_response(fields: list[tuple[bytes, bytes]]) -> tuple[int, list[tuple[bytes, bytes]]] | str:
    """(status, regular fields) of a response header block, or why it is malformed (RFC 9113 8.3.2).

    The same field rules as a request's (names lower-case tokens, values field-content, no
    connection-specific fields, pseudo-headers first), with `:status` (three digits) the only
    pseudo-header, exactly once. A caller gets a fresh list each time (it may edit it); whole
    blocks that passed are remembered as `parse_request` remembers them."""
    key = None
    if len(fields) <= MEMO_MAX_FIELDS:
        key = tuple(fields)
        hit = _response_memo.get(key)
        if hit is not None:
            return hit[0], list(hit[1])
    status = None
    regular: list[tuple[bytes, bytes]] = []
    for field in fields:
        name, value = field
        if name[:1] == b":":
            if regular or name != b":status" or status is not None:
                return f"pseudo-header {_show(name)} misplaced, repeated or not allowed in a response"
            if len(value) != 3 or not value.isdigit():
                return "invalid :status"
            status = int(value)
            continue
        problem = _field_problem(name, value)
        if problem:
            return problem
        regular.append(field)
    if status is None:
        return "missing :status"
    if key is not None and sum(len(n) + len(v) for n, v in regular) <= MEMO_MAX_BYTES:
        if len(_response_memo) >= MEMO_ENTRIES:
            del _response_memo[next(iter(_response_memo))]
        _response_memo[key] = (status, regular)
        return status, list(regular)
    return status, regular


_trailers_memo: dict[tuple, list[tuple[bytes, bytes]]] = {}


def parse_trailers(fields: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]] | str:
    """The fields of a trailer block, or why it is malformed: no pseudo-headers (RFC 9113 8.1).

    A fresh list each time; blocks that passed are remembered as `parse_response` remembers
    heads (a gRPC upstream ends every call with the same `grpc-status: 0`)."""
    key = None
    if len(fields) <= MEMO_MAX_FIELDS:
        key = tuple(fields)
        hit = _trailers_memo.get(key)
        if hit is not None:
            return list(hit)
    out = []
    for field in fields:
        name, value = field
        problem = "pseudo-header in trailers" if name[:1] == b":" else _field_problem(name, value)
        if problem:
            return problem
        out.append(field)
    if key is not None and sum(len(n) + len(v) for n, v in out) <= MEMO_MAX_BYTES:
        if len(_trailers_memo) >= MEMO_ENTRIES:
            del _trailers_memo[next(iter(_trailers_memo))]
        _trailers_memo[key] = out
        return list(out)
    return out


def _field_problem(name: bytes, value: bytes) -> str:
    if _NAME_OK(name) is None:
        return f"invalid header name {_show(name)} (names are lower-case tokens)"
    if _VALUE_BAD(value) is not None:
        return f"invalid value for header {_show(name)}"
    if name in CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
        return f"connection-specific header {_show(name)} is not allowed in HTTP/2"
    return ""
