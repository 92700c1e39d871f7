"""Forwarding headers: what the proxy strips, adds and translates on the way through.

Theory of operation: the request path calls `request_headers(req, authority)` once
per request and `response_headers(headers)` once per response; the upstream pool
calls `h2_request_headers(...)` when the chosen upstream speaks h2c. Every function
builds a fresh list in one pass over its input (no per-header allocations beyond
the output tuples) and never mutates what it was given.

Rules (RFC 9110 7.6, RFC 9113 8.2/8.3):
- hop-by-hop fields (`proxy.http.messages.HOP_BY_HOP`) and every field named in
  `connection` are dropped in both directions, except a client's `te` that lists
  `trailers`, which goes on as `te: trailers`: it says the client reads trailers,
  which the proxy now relays, and gRPC servers reset a call without it.
- the client's Host goes upstream as-is; absent (HTTP/2 clients send :authority),
  it is the client's :authority, else the upstream's own authority.
- `via` and `x-forwarded-for` are appended to (one combined field, since many
  parsers only read the first occurrence); `x-forwarded-proto` is set, never
  trusted from the client.
- HTTP/2 requests carry :method :scheme :authority :path first, no Host, no
  connection-specific fields, and `te` only as `trailers`. Several `cookie`
  fields (legal in HTTP/2) are joined with "; " (RFC 9113 8.2.3) so an HTTP/1.1
  upstream gets exactly one.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from proxy.http.messages import HOP_BY_HOP, Headers, Request

_VIA_NAME = b"rampmeter"
_TE_TRAILERS = (b"te", b"trailers")
_VIA = {"1.0": b"1.0 rampmeter", "1.1": b"1.1 rampmeter", "2": b"2 rampmeter"}

# Fields HTTP/2 forbids in any message (RFC 9113 8.2.2), `te` handled apart.
H2_CONNECTION_SPECIFIC = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade", b"http2-settings"}
)


def via_token(http_version: str) -> bytes:
    """The `via` entry for a message received over `http_version` ("1.0", "1.1", "2")."""
    return _VIA.get(http_version) or http_version.encode("ascii") + b" " + _VIA_NAME


def _dropped(headers: Headers) -> frozenset[bytes]:
    """Hop-by-hop names plus any listed in `connection` (case-insensitive tokens)."""
    values: list[bytes] | None = None
    for k, v in headers:
        if k == b"connection":
            if values is None:
                values = [v]
            else:
                values.append(v)
    if values is None:
        return HOP_BY_HOP
    if len(values) == 1:
        common = _COMMON_CONNECTION.get(values[0])
        if common is not None:
            return common  # what nearly every message says: no split, no new set
    extra: set[bytes] = set()
    for v in values:
        extra.update([t.strip().lower() for t in v.split(b",")])
    return HOP_BY_HOP | extra


# The names to drop for the usual `connection` values, computed once (the same as the split would give).
_COMMON_CONNECTION = {v: HOP_BY_HOP | {v.lower()} for v in (b"keep-alive", b"close", b"Keep-Alive", b"Close")}


def _lists_trailers(te: bytes) -> bool:
    return b"trailers" in [t.split(b";")[0].strip().lower() for t in te.split(b",")]


def _append(previous: bytes | None, value: bytes) -> bytes:
    return value if previous is None else previous + b", " + value


def request_headers(req: Request, upstream_authority: bytes) -> Headers:
    """Headers to send upstream for `req` (lower-case names, Host first)."""
    drop = _dropped(req.headers)
    out: Headers = [(b"host", b"")]  # placeholder keeps Host first without an insert
    host = xff = via = cookie = None
    for k, v in req.headers:
        if k in drop or k == b"x-forwarded-proto":
            if k == b"te" and _lists_trailers(v) and _TE_TRAILERS not in out:
                out.append(_TE_TRAILERS)  # the one hop-by-hop field that goes on (module doc)
            continue
        if k == b"host":
            if host is None:
                host = v
            continue
        if k == b"x-forwarded-for":
            xff = _append(xff, v)
        elif k == b"via":
            via = _append(via, v)
        elif k == b"cookie":
            cookie = v if cookie is None else cookie + b"; " + v
        else:
            out.append((k, v))
    out[0] = (b"host", host if host is not None else (req.authority or upstream_authority))
    if cookie is not None:
        out.append((b"cookie", cookie))
    if req.client:
        client = req.client.encode("latin-1")
        xff = client if xff is None else xff + b", " + client
    if xff:
        out.append((b"x-forwarded-for", xff))
    out.append((b"x-forwarded-proto", req.scheme or b"http"))
    token = _VIA.get(req.http_version) or via_token(req.http_version)
    out.append((b"via", token if via is None else via + b", " + token))
    return out


def response_headers(headers: Headers, http_version: str = "1.1") -> Headers:
    """Upstream response headers to send downstream: hop-by-hop gone, `via` appended.

    `http_version` is the protocol the upstream answered with ("1.1" or "2").
    """
    drop = _dropped(headers)
    out: Headers = []
    via = None
    for k, v in headers:
        if k in drop:
            continue
        if k == b"via":
            via = _append(via, v)
        else:
            out.append((k, v))
    token = _VIA.get(http_version) or via_token(http_version)
    out.append((b"via", token if via is None else via + b", " + token))
    return out


def h2_request_headers(
    method: bytes, target: bytes, headers: Headers, *, scheme: bytes = b"http", authority: bytes = b""
) -> Headers:
    """HTTP/2 request header block: pseudo-headers first, :authority from Host.

    `authority` is used when `headers` has no Host.
    """
    out: Headers = [(b":method", method), (b":scheme", scheme), (b":authority", authority), (b":path", target)]
    host = None
    cookie = None
    for k, v in headers:
        if k == b"host":
            if host is None:
                host = v
        elif k in H2_CONNECTION_SPECIFIC:
            continue
        elif k == b"te":
            if v.strip().lower() == b"trailers":
                out.append((k, b"trailers"))
        elif k == b"cookie":
            cookie = v if cookie is None else cookie + b"; " + v
        else:
            out.append((k, v))
    if host:
        out[2] = (b":authority", host)
    if cookie is not None:
        out.append((b"cookie", cookie))
    return out


def request_trailers(trailers: Headers) -> Headers:
    """Request trailer fields to send on: hop-by-hop and pseudo-headers never (RFC 9110 6.5.1)."""
    return [(k, v) for k, v in trailers if k not in HOP_BY_HOP and k[:1] != b":" and k != b"content-length"]
