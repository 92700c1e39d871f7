"""What to load-test and the requests rendered for it: `Target`, `Prepared`, `prepare()`.

Theory of operation: a `Target` is a URL, a protocol and the client's limits
(connections, in-flight cap, timeout). `prepare(shapes, url)` renders every
shape once into the exact request parts for that URL (method, path with the
URL's prefix, HTTP/1.1 headers with Host and framing, the h2 header block with
pseudo-headers, body), so sending costs no per-request header building beyond
an optional idempotency key. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.http.forward import h2_request_headers
from proxy.http.messages import Headers
from proxy.http.pool import parse_url
from proxy.http.upstream_h1 import framed
from proxy.loadtest.shapes import Shape

PROTOCOLS = ("http1", "h2c")
IDEMPOTENCY_KEY = b"idempotency-key"


@dataclass(frozen=True)
class Target:
    url: str
    protocol: str = "http1"
    name: str = ""  # how reports and comparisons call it (default: the URL)
    connections: int = 1  # h2c: connections to spread streams over (more open when all are full)
    max_in_flight: int = 10_000  # workers (h1: connections) at most; beyond, requests wait and the step is invalid
    timeout_s: float = 30.0  # client timeout, from each request's intended send time
    check_json: bool = True  # a 2xx non-streaming body must parse as JSON, else it counts as non_json

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; choose from {', '.join(PROTOCOLS)}")
        if not self.url.startswith("http://"):
            raise ValueError(f"target URL must start with http:// (cleartext HTTP/1.1 or h2c), got {self.url!r}")
        try:
            parse_url(self.url)
        except ValueError:
            raise ValueError(f"bad target URL {self.url!r}: want http://HOST:PORT[/PREFIX]") from None
        if self.connections < 1 or self.max_in_flight < 1 or not self.timeout_s > 0:
            raise ValueError("connections and max_in_flight must be >= 1 and timeout_s > 0")

    @property
    def label(self) -> str:
        return self.name or self.url


@dataclass(frozen=True)
class Prepared:
    method: bytes
    target: bytes
    h1_headers: Headers
    h2_block: Headers
    body: bytes
    stream: bool


def prepare(shapes: tuple[Shape, ...], url: str) -> list[Prepared]:
    _host, _port, prefix = parse_url(url)
    authority = url.removeprefix("http://").partition("/")[0].encode()
    out = []
    for s in shapes:
        method, path = s.method.encode(), prefix + s.path.encode()
        headers = framed(method, [(b"host", authority), *s.headers()], s.body)
        block = h2_request_headers(method, path, headers, authority=authority)
        out.append(Prepared(method, path, headers, block, s.body, s.stream))
    return out
