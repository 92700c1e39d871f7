"""The HTTP message types shared by the server, the upstream client and handlers.

Theory of operation: the server (`proxy/http/server.py`) parses HTTP/1.1 (h11) or
HTTP/2 (h2) into one protocol-neutral `Request` and hands it, with a
`ResponseSink`, to a handler coroutine. Handlers never see h11 or h2. The same
handler interface serves the sidecar, its admin listener and the simulated pod.

Invariants:
- header names are lower-case bytes; HTTP/2 pseudo-headers are not in `headers`
  (they are `method`, `target`, `authority`, `scheme`).
- the handler runs in its own cancel scope; when the client disconnects (h1 EOF,
  h2 RST_STREAM or connection loss) the server sets `request.client_gone` and
  cancels that scope, so work for nobody stops at once.
- a handler that returns without finishing its response gets it finished for it
  (500 if nothing was sent, else the stream/connection is aborted).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

Headers = list[tuple[bytes, bytes]]

# RFC 9110 7.6.1 connection-specific fields, plus the non-standard ones proxies strip.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"http2-settings",
    }
)


def header_value(headers: Headers, name: bytes) -> bytes | None:
    """First value of `name` (lower-case), or None."""
    for k, v in headers:
        if k == name:
            return v
    return None


def strip_hop_by_hop(headers: Headers) -> Headers:
    """Drop hop-by-hop headers, including any named in `connection`."""
    extra: set[bytes] = set()
    for k, v in headers:
        if k == b"connection":
            extra.update(t.strip().lower() for t in v.split(b","))
    if not extra:
        return [(k, v) for k, v in headers if k not in HOP_BY_HOP]
    return [(k, v) for k, v in headers if k not in HOP_BY_HOP and k not in extra]


class RequestBody(Protocol):
    """A request body, read at most once, bounded by the server's body cap."""

    content_length: int | None

    def chunks(self) -> AsyncIterator[bytes]:
        """Yield the body as it arrives (h2 flow control opens as it is consumed)."""
        ...

    async def read_all(self) -> bytes:
        """The whole body; raises `BodyTooLarge` past the server's cap."""
        ...


class Request:
    __slots__ = (
        "authority",
        "body",
        "client",
        "client_gone",
        "deadline",
        "headers",
        "klass",
        "http_version",
        "method",
        "received_at",
        "scheme",
        "target",
        "trailers",
    )

    def __init__(
        self,
        method: bytes,
        target: bytes,
        headers: Headers,
        body: RequestBody,
        *,
        authority: bytes = b"",
        scheme: bytes = b"http",
        http_version: str = "1.1",
        client: str = "",
        received_at: float = 0.0,
    ) -> None:
        self.method = method
        self.target = target
        self.authority = authority
        self.scheme = scheme
        self.headers = headers
        self.body = body
        self.http_version = http_version  # "1.1", "1.0" or "2"
        self.client = client  # peer IP address, for x-forwarded-for
        self.client_gone = False
        self.klass = ""  # the request class, once the handler has classified it (metrics label)
        self.received_at = received_at  # trio.current_time() when the head was parsed
        # Set by a handler that has one: the server then gives up on a client that keeps it
        # waiting past it (HTTP/1.1: a response the client does not read), answering as gone.
        self.deadline = math.inf
        # Request trailer fields (HTTP/2 clients only), once the body has ended; forwarded after it.
        self.trailers: Headers | None = None

    @property
    def path(self) -> bytes:
        return self.target.split(b"?", 1)[0]

    def header(self, name: bytes) -> bytes | None:
        return header_value(self.headers, name)

    def __repr__(self) -> str:
        return f"<Request {self.method.decode()} {self.target.decode('latin-1')} HTTP/{self.http_version}>"


class ResponseSink(Protocol):
    """Where a handler writes its response. Exactly one of `respond` or `start`."""

    @property
    def headers_sent(self) -> bool:
        """Whether the head has gone (an answer can no longer be chosen)."""
        ...

    async def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        """A whole response in one go (the fast path: one write on HTTP/1.1)."""
        ...

    async def start(self, status: int, headers: Headers) -> None:
        """Send the head of a streamed response (chunked on HTTP/1.1 without content-length)."""
        ...

    async def send(self, data: bytes) -> None:
        """Send body bytes now, unbuffered (SSE tokens reach the client as they come)."""
        ...

    async def end(self) -> None:
        """Finish the streamed response."""
        ...

    async def trailers(self, headers: Headers) -> None:
        """Finish the streamed response with trailer fields (gRPC's grpc-status): HTTP/2 sends a trailing
        HEADERS frame with END_STREAM; HTTP/1.1 a chunked trailer section to a client that sent
        `te: trailers`, else it ends as `end()` (the fields are dropped)."""
        ...


Handler = Callable[[Request, ResponseSink], Awaitable[None]]
