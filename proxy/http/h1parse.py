"""HTTP/1.1 parsing on httptools (llhttp), both directions, with every framing rule written down. Sans I/O.

Theory of operation: `RequestParser` (the server's side of a client connection)
and `ResponseParser` (the upstream pool's side) wrap one llhttp parser each. The
owner feeds bytes as they arrive; llhttp calls back per element (target, header,
head complete, body piece, message complete) and the callbacks append what the
owner needs to `events`, in order:

    RequestHead | bytes (a body piece) | END | FramingError (then nothing more)

so pipelined requests come out one after the other and the owner decides when to
look at the next one. Nothing here blocks, reads a clock or touches a socket.

Why hand-written framing on llhttp rather than h11: h11 was the largest single
cost of the data path. Parsing one typical request head costs ~1.3 us here and
~57 us through h11 (a new h11 connection per request, as the old server paid per
connection plus its per-event machinery: /tmp/micro.py figures on the shared
machine, see docs/multicore.md), and minimal trio proxies measured 190-227 us of
CPU per request on h11 against 58-62 us on httptools (issue 15). llhttp is the
parser Node.js ships; what h11 did beyond parsing (framing decisions, keep-alive,
100-continue, the checks below) is written out here and in the connection
modules, each rule with a test (tests/runtime/test_h1_framing.py).

Framing rules enforced on requests (RFC 9112; status answered, then the
connection closes):
- Content-Length together with Transfer-Encoding: 400 (6.1, smuggling; llhttp).
- Content-Length duplicated (even with equal values), empty, not digits, or too
  large for 64 bits: 400 (6.3, 8.6 of RFC 9110; llhttp). Over max_body_bytes: 413
  (the connection's rule, not framing).
- Transfer-Encoding other than exactly `chunked`: 501 (6.1; h11 did the same);
  Transfer-Encoding on an HTTP/1.0 request: 400 (6.1: faulty framing).
- chunk size not hex or over 64 bits, missing CRLF after chunk data: 400, as a
  body error (the head was already handed on; llhttp).
- bare LF or bare CR as a line end, obs-fold (a header line starting with
  whitespace), whitespace before the colon, control characters in a value: 400
  (2.2, 5.1, 5.2 allow rejecting; llhttp in strict mode). h11 accepted bare LF
  and unfolded obs-fold; rejecting is what keeps two parsers from disagreeing.
- a head over max_header_bytes: 431. Exact for a complete head (target plus
  fields); a head still incomplete holds at most max_header_bytes plus one read
  before it is refused, so memory stays bounded while it trickles in. Trailer
  fields of a chunked body count against the same cap (and are dropped).
- HTTP/1.1 without Host, or with several: 400 (3.2). A version other than 1.0
  or 1.1: 505 (HTTP/0.9 and garbage: 400). An unknown method: 400 (llhttp knows
  the registered ones).
- request target (3.2): origin-form `/...` as is; absolute-form
  `http://host/path` is normalised to origin-form and its authority replaces Host
  (3.2.2); `OPTIONS *` is flagged for the connection to answer; anything else
  (authority-form, CONNECT, `GET *`): 400.
- `Upgrade` requests are served as plain HTTP/1.1 (the server may ignore an
  upgrade; the forwarder drops the hop-by-hop fields).

Keep-alive (9.3): HTTP/1.1 unless `connection: close`; HTTP/1.0 only with
`connection: keep-alive`. `expect: 100-continue` on HTTP/1.1 is flagged.

Responses (the upstream's): the same llhttp checks (CL with TE, duplicate or
invalid CL, chunk errors, bare LF) are protocol errors; Transfer-Encoding other
than chunked is refused too (its coding would be lost on the way through); 1xx
answers are skipped; a 101 is an error (we never ask to upgrade); responses to
HEAD and 204/304 have no body whatever their framing fields say; a response with
neither Content-Length nor chunked ends when the upstream closes (`eof()`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import httptools

from proxy.http.messages import Headers

# Field names whose values decide framing or routing; everything else passes through untouched.
_CONTENT_LENGTH = b"content-length"
_TRANSFER_ENCODING = b"transfer-encoding"
_HOST = b"host"
_CONNECTION = b"connection"
_EXPECT = b"expect"
_SPECIAL = frozenset({_CONTENT_LENGTH, _TRANSFER_ENCODING, _HOST, _CONNECTION, _EXPECT})
_REQUEST_LINE_WORDS = ("method", "url", "version", "start line", "request line", "HTTP/")
_SMUGGLING = ("can't be present with",)
_BAD_LENGTH = ("Content-Length",)


class FramingError(Exception):
    """A message that must not be processed as it is: answer `status` (requests) and close."""

    def __init__(self, status: int, kind: str, message: str, *, in_body: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind  # metric label (protocol_errors{kind})
        self.message = message
        self.in_body = in_body  # the head was already handed on: the body read fails instead


class _End:
    __slots__ = ()

    def __repr__(self) -> str:
        return "END"


END = _End()  # the message (head and body) is complete


class RequestHead:
    """A parsed, checked request head."""

    __slots__ = (
        "asterisk",
        "authority",
        "chunked",
        "content_length",
        "expect_continue",
        "headers",
        "keep_alive",
        "method",
        "target",
        "version",
    )

    def __init__(
        self,
        method: bytes,
        target: bytes,
        version: str,
        headers: Headers,
        authority: bytes,
        content_length: int | None,
        keep_alive: bool,
        expect_continue: bool,
        asterisk: bool = False,
    ) -> None:
        self.method = method
        self.target = target
        self.version = version  # "1.1" or "1.0"
        self.headers = headers  # lower-case names, in order
        self.authority = authority  # Host, or the absolute-form target's authority
        self.content_length = content_length  # None: chunked
        self.chunked = content_length is None
        self.keep_alive = keep_alive
        self.expect_continue = expect_continue
        self.asterisk = asterisk  # OPTIONS *: the server answers for itself

    def __repr__(self) -> str:
        return f"<RequestHead {self.method.decode()} {self.target.decode('latin-1')} HTTP/{self.version}>"


def _tokens(value: bytes) -> set[bytes]:
    return {t.strip().lower() for t in value.split(b",")}


def _head_size(headers: Headers) -> int:
    """A head's fields counted as on the wire (name, ": ", value, CRLF)."""
    return sum([len(k) + len(v) + 4 for k, v in headers])


def _keeps_alive(connection: bytes | None, version: str) -> bool:
    """Whether a message with this `connection` field leaves the connection open (RFC 9112 9.3)."""
    if connection is None:
        return version == "1.1"
    if connection == b"keep-alive":  # what nearly every upstream sends: no token split
        return True
    tokens = _tokens(connection)
    return b"close" not in tokens if version == "1.1" else b"keep-alive" in tokens


def _classify(reason: str, in_body: bool) -> FramingError:
    """llhttp's error reason -> status, metric kind and a short message."""
    if any(w in reason for w in _SMUGGLING):
        return FramingError(400, "h1_content_length_with_transfer_encoding", f"bad framing: {reason}")
    if in_body:
        kind = "h1_bad_chunked" if "chunk" in reason.lower() else "h1_bad_body"
        return FramingError(400, kind, f"malformed request body: {reason}", in_body=True)
    if any(w in reason for w in _BAD_LENGTH):
        return FramingError(400, "h1_bad_content_length", f"bad framing: {reason}")
    if any(w in reason for w in _REQUEST_LINE_WORDS):
        return FramingError(400, "h1_bad_head", f"malformed request line: {reason}")
    return FramingError(400, "h1_bad_head", f"malformed header: {reason}")


def _absolute_to_origin(target: bytes) -> tuple[bytes, bytes] | None:
    """`http://host[:port]/path?q` -> (b"/path?q", b"host[:port]"); None if it is not absolute-form http(s)."""
    scheme, sep, rest = target.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        return None
    cut = len(rest)
    for stop in (b"/", b"?"):
        i = rest.find(stop)
        if i != -1 and i < cut:
            cut = i
    authority, path = rest[:cut], rest[cut:]
    if not authority or b"@" in authority:  # RFC 9110 4.2.4: userinfo is not allowed in http(s) targets
        return None
    return (path if path.startswith(b"/") else b"/" + path), authority


class RequestParser:
    """The client's requests on one connection. See the module doc for what `events` holds."""

    __slots__ = (
        "_cl",
        "_connection",
        "_expect",
        "_fresh",
        "_headers",
        "_hosts",
        "_in_body",
        "_p",
        "_partial",
        "_head_reads",
        "_span",
        "_te",
        "_trailers",
        "_url",
        "events",
        "failed",
        "in_head",
        "max_header_bytes",
    )

    def __init__(self, max_header_bytes: int) -> None:
        self.max_header_bytes = max_header_bytes
        self.events: deque[Any] = deque()  # RequestHead | bytes | END | FramingError (module doc), told apart by type()
        self.failed = False
        self._p = httptools.HttpRequestParser(self)
        self.in_head = self._in_body = False  # in_head: a request head has begun and is not complete
        self._fresh = False  # a head began in the read being parsed
        self._partial = 0  # bytes of an incomplete head seen in reads after the one it began in
        self._span = 0  # length of the read being parsed
        self._head_reads = 0  # lengths of the reads the current head came in (an upper bound of its size)
        self._reset()

    def close(self) -> None:
        """Drop the llhttp parser: it holds this object's bound callbacks, a cycle per connection."""
        del self._p

    def _reset(self) -> None:
        self._url = b""
        self._headers: Headers = []
        self._cl: bytes | None = None
        self._te: bytes | None = None
        self._connection: bytes | None = None
        self._expect: bytes | None = None
        self._hosts: list[bytes] = []
        self._trailers = 0

    def feed(self, data: bytes) -> None:
        """Parse `data`; what it completes is appended to `events` (a FramingError last, if any)."""
        if self.failed:
            return
        self._fresh = False
        self._span = len(data)
        if self.in_head:
            self._head_reads += len(data)
        try:
            self._execute(data)
        except FramingError as exc:
            # Kept in `events` after this frame is gone: without its traceback and context, whose frames
            # (up to the connection's) would make the parser, and the connection with it, a reference cycle.
            exc.__context__ = None
            self._fail(exc.with_traceback(None))
            return
        if self.in_head:
            # The read a head begins in may hold earlier requests too: count only later reads.
            self._partial = 0 if self._fresh else self._partial + len(data)
            if self._partial > self.max_header_bytes:
                self._fail(FramingError(431, "h1_header_too_large", "request head too large"))

    def _execute(self, data: bytes) -> None:
        while True:
            try:
                self._p.feed_data(data)
                return
            except httptools.HttpParserUpgrade as exc:
                data = data[exc.args[0] :]  # an Upgrade we ignore: parsing goes on after that request
                if not data:
                    return
            except httptools.HttpParserCallbackError as exc:
                if isinstance(exc.__context__, FramingError):
                    raise exc.__context__ from None
                raise
            except httptools.HttpParserError as exc:
                raise _classify(str(exc), self._in_body) from None

    def _fail(self, exc: FramingError) -> None:
        self.failed = True
        self.events.append(exc)

    # --- llhttp callbacks ---
    def on_message_begin(self) -> None:
        self.in_head = self._fresh = True
        self._head_reads = self._span

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_body:  # a trailer field of a chunked body: bounded, then dropped
            self._trailers += len(name) + len(value) + 4
            if self._trailers > self.max_header_bytes:
                raise FramingError(431, "h1_header_too_large", "request trailers too large", in_body=True)
            return
        name = name.lower()
        self._headers.append((name, value))
        if name in _SPECIAL:
            if name == _CONTENT_LENGTH:
                self._cl = value
            elif name == _TRANSFER_ENCODING:
                self._te = value
            elif name == _HOST:
                self._hosts.append(value)
            elif name == _CONNECTION:
                self._connection = value if self._connection is None else self._connection + b"," + value
            else:
                self._expect = value

    def on_headers_complete(self) -> None:
        self.in_head = False
        head = self._head()
        self._in_body = True
        self.events.append(head)

    def on_body(self, body: bytes) -> None:
        self.events.append(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self.events.append(END)
        self._reset()

    # --- the rules (module doc) ---
    def _head(self) -> RequestHead:
        p = self._p
        version = p.get_http_version()
        if version != "1.1" and version != "1.0":
            if version.startswith("0."):
                raise FramingError(400, "h1_bad_head", "malformed request line: no HTTP/1.x version")
            raise FramingError(505, "h1_bad_version", f"HTTP/{version} is not supported")
        # The head's size is counted only when the bytes it came in could exceed the limit: a head
        # is never longer than the reads it arrived in (`_head_reads`), and nearly always they are short.
        if (
            self._head_reads > self.max_header_bytes
            and _head_size(self._headers) + len(self._url) > self.max_header_bytes
        ):
            raise FramingError(431, "h1_header_too_large", "request head too large")
        method = p.get_method()
        headers = self._headers
        hosts = self._hosts
        if len(hosts) > 1 or (not hosts and version == "1.1"):
            raise FramingError(400, "h1_bad_host", "exactly one Host header is required")
        authority = hosts[0] if hosts else b""
        if self._te is not None:
            if version == "1.0":
                raise FramingError(400, "h1_bad_framing", "bad framing: transfer-encoding in an HTTP/1.0 request")
            if self._te.strip().lower() != b"chunked":
                raise FramingError(501, "h1_transfer_encoding", "only transfer-encoding: chunked is supported")
            length = None
        else:
            length = int(self._cl) if self._cl is not None else 0  # llhttp checked the digits
        # No `connection` field (most requests): the version decides, without the call.
        connection = self._connection
        keep_alive = version == "1.1" if connection is None else _keeps_alive(connection, version)
        expect = version == "1.1" and self._expect is not None and self._expect.strip().lower() == b"100-continue"
        target = self._url
        asterisk = False
        if target[:1] != b"/":
            if target == b"*" and method == b"OPTIONS":
                asterisk = True
            else:
                origin = None if method == b"CONNECT" else _absolute_to_origin(target)
                if origin is None:
                    raise FramingError(400, "h1_bad_target", "request target must be a path starting with /")
                target, authority = origin
                headers = [(b"host", authority) if k == _HOST else (k, v) for k, v in headers]
                if not hosts:
                    headers.append((b"host", authority))
        return RequestHead(method, target, version, headers, authority, length, keep_alive, expect, asterisk)


class ResponseHead:
    __slots__ = ("content_length", "framing", "headers", "keep_alive", "status", "version")

    def __init__(
        self, status: int, version: str, headers: Headers, framing: str, content_length: int | None, keep_alive: bool
    ) -> None:
        self.status = status
        self.version = version
        self.headers = headers  # lower-case names, in order
        self.framing = framing  # "length", "chunked", "none" (HEAD, 204, 304) or "close" (until EOF)
        self.content_length = content_length
        self.keep_alive = keep_alive


class ResponseParser:
    """The upstream's responses on one connection, one request at a time.

    Before each request call `expect(method)`. Results: `head` once the final
    (non-1xx) head is in, body pieces appended to `body`, `complete` once the
    response ended, `error` (an exception message) when the upstream broke HTTP,
    `trailing` when bytes followed the response (the connection must not be reused).
    """

    __slots__ = (
        "_cl",
        "_connection",
        "_head_request",
        "_headers",
        "_lead",
        "_p",
        "_partial",
        "_span",
        "_te",
        "body",
        "complete",
        "error",
        "head",
        "max_header_bytes",
        "trailing",
    )

    def __init__(self, max_header_bytes: int = 65_536) -> None:
        self.max_header_bytes = max_header_bytes
        self._p = httptools.HttpResponseParser(self)
        self.body: deque[bytes] = deque()
        self._begin()
        self.expect(b"GET")

    def expect(self, method: bytes) -> None:
        """Ready for the response to a `method` request."""
        self._head_request = method == b"HEAD"
        self.head: ResponseHead | None = None
        self.complete = False
        self.trailing = False
        self.error: str | None = None
        self.body.clear()
        self._partial = 0
        self._lead: bytes | None = None  # the first 9 bytes of the response, once read
        # The head's fields are reset by on_message_begin, which comes first for every response.

    def _begin(self) -> None:
        self._headers: Headers = []
        self._span = 0
        self._cl: bytes | None = None
        self._te: bytes | None = None
        self._connection: bytes | None = None

    def feed(self, data: bytes) -> None:
        if self.error is not None or self.trailing:
            return
        self._span = len(data)
        if self._lead is None:
            self._lead = data[:9]  # the status line's start (see on_headers_complete)
        try:
            self._p.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            ctx = exc.__context__
            if isinstance(ctx, _Stop):
                return
            self._broken(str(ctx) if isinstance(ctx, FramingError) else str(exc))
        except httptools.HttpParserUpgrade:
            self._broken("101 Switching Protocols without an upgrade request")
        except httptools.HttpParserError as exc:
            self._broken(str(exc))
        else:
            if self.head is None:
                self._partial += len(data)
                if self._partial > self.max_header_bytes:
                    self._broken(f"response head larger than {self.max_header_bytes} bytes")

    def eof(self) -> None:
        """The upstream closed: that ends a close-delimited body; anything else incomplete is an error."""
        if self.complete or self.error is not None:
            return
        if self.head is not None and self.head.framing == "close":
            self.complete = True
        else:
            self._broken("closed the connection before the response ended")

    def _broken(self, message: str) -> None:
        if self.complete:
            self.trailing = True  # garbage after a complete response: keep it, drop the connection
        else:
            self.error = message

    # --- llhttp callbacks ---
    def on_message_begin(self) -> None:
        if self.complete:
            self.trailing = True
            raise _Stop
        self._headers = []  # _begin(), inline: once per response
        self._cl = self._te = self._connection = None

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head is not None:
            return  # trailer fields: dropped (llhttp bounds nothing here, the read size does)
        name = name.lower()
        self._headers.append((name, value))
        if name in _SPECIAL:
            if name == _CONTENT_LENGTH:
                self._cl = value
            elif name == _TRANSFER_ENCODING:
                self._te = value
            elif name == _CONNECTION:
                self._connection = value if self._connection is None else self._connection + b"," + value

    def on_headers_complete(self) -> None:
        p = self._p
        status = p.get_status_code()
        if status < 100:
            raise FramingError(502, "upstream", f"invalid status {status}")
        if status < 200:
            self._lead = b""  # the final head's version is not at the start of the reads any more
            return  # 1xx: skipped, llhttp completes it without a body
        # Counted only when the reads it came in could hold more than the limit (as for requests).
        if self._partial + self._span > self.max_header_bytes and _head_size(self._headers) > self.max_header_bytes:
            raise FramingError(502, "upstream", f"response head larger than {self.max_header_bytes} bytes")
        # httptools formats the version string anew per call (~1 us); the response's first bytes,
        # which llhttp has just accepted as its status line, say it for nearly every response.
        version = "1.1" if self._lead == b"HTTP/1.1 " else p.get_http_version()
        if self._te is not None and self._te.strip().lower() != b"chunked":
            raise FramingError(502, "upstream", "transfer-encoding other than chunked")
        length = int(self._cl) if self._cl is not None else None
        if self._head_request or status in (204, 304):
            framing = "none"
        elif self._te is not None:
            framing, length = "chunked", None
        else:
            framing = "length" if length is not None else "close"
        connection = self._connection
        keep_alive = version == "1.1" if connection is None else _keeps_alive(connection, version)
        self.head = ResponseHead(status, version, self._headers, framing, length, keep_alive and framing != "close")
        if self._head_request:
            # llhttp cannot be told a response has no body (its framing fields describe the GET it
            # would have been); stop it here. The connection is not reused after a HEAD.
            self.complete = True
            self.head.keep_alive = False
            raise _Stop

    def on_body(self, body: bytes) -> None:
        if body:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.head is not None:
            self.complete = True


class _Stop(Exception):
    """Raised in a callback to stop llhttp: the rest of the bytes belong to no response."""
