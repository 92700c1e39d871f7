"""Request bodies that go upstream as they arrive: gRPC client streaming and bidi streaming.

Theory of operation: the request path reads a body whole before admission (cost
estimate, dedup fingerprint). A gRPC call whose request stream has not ended when its
handler starts cannot wait for that: a bidirectional stream whose client sends message
2 only after it read reply 1 would wait forever, and a long client stream would sit
in the sidecar's memory first. So such a call is admitted on its headers alone (its
cost from the route's fixed cost or `x-cost-hint` metadata: `classify` with no body)
and, once admitted, its body is the H2 stream's `PassingBody`: the upstream
connection's upload task reads it chunk by chunk while the relay sends the response
back message by message (proxy/http/upstream_h2.py, "Full duplex"), and the
client's flow-control window reopens only as the upstream takes the bytes
(proxy/http/h2stream.py `PassingBody`).

Which calls (`streamed`): an HTTP/2 request with a gRPC content-type whose body has
not all arrived when the handler starts (the stream workers start once the read that
opened the stream is handled, so a unary call whose DATA came with its HEADERS is
complete by then and read whole, as before), without an idempotency-key (a
fingerprint needs the whole body) and not on a batching route. A call admitted so
whose body did finish while it queued goes up as bytes after all (`settle`: one
write with the head, no upload task).

Request trailers (gRPC clients send none, other h2 clients may) are unknown when the
upstream stream opens; they arrive after the last DATA, and the upload sends them in
place of END_STREAM (`PassingBody.trailers`). A request stream past
listen.max_body_bytes is answered RESOURCE_EXHAUSTED: trailers-only while the upstream
has not answered yet (grpc_wire.too_large), else in trailers after the replies already
relayed (grpc_wire.too_large_status, proxy/http/exchange.py); the upstream call is reset. Everything else the request path does (deadline,
admission slot held until the upstream's part is over, cancellation resetting the
upstream stream, gRPC-shaped rejections) is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.core import grpc_wire
from proxy.http.h2stream import H2Body, PassingBody
from proxy.http.messages import Request
from proxy.runtime.fields import Fields


def streamed(request: Request, fields: Fields, batches: Callable[[Request], bool]) -> PassingBody | None:
    """The body to pass upstream as it arrives, or None: read it whole (module doc). `fields`: the
    request's header fields (the edge's one pass); `batches`: whether the request's route batches
    (Batcher.batches), asked only of a gRPC stream."""
    body = request.body
    if not isinstance(body, H2Body) or body.complete or body.started:
        return None  # HTTP/1.1, or the body is all here: the usual case costs two checks
    if not grpc_wire.is_grpc(fields.content_type) or fields.idempotency_key is not None:
        return None
    return None if batches(request) else body.passing()


async def settle(body: PassingBody, request: Request) -> bytes | PassingBody:
    """A passing body that has all arrived by now (while the call queued), as bytes; else as it is."""
    if body.whole_here():
        return await request.body.read_all()
    return body
