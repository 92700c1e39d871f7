"""The standard gRPC health check (grpc.health.v1.Health/Check) against one upstream, over h2c.

Theory of operation: one check is one short HTTP/2 connection of the sidecar's own
h2 client (`proxy.http.upstream_h2.H2UpstreamConnection`, not the data-path pool: the check
must work while the data path rejects everything, and must not count in its limits),
one unary call with the serialized `HealthCheckRequest{service}` framed by
`proxy.core.grpc_wire`, and the answer read back: healthy only when the call ended
with grpc-status 0 and the response says SERVING. Everything else is a reason, for
/readyz: connect refused, an HTTP status, a gRPC status (UNIMPLEMENTED: the server
has no health service; NOT_FOUND: it does not know that service name), NOT_SERVING.
The check is bounded by the caller's cancel scope (health_timeout_ms, in probes.py).
`unary()` is the same call for any method: warm-up probes with `grpc = true`.
A connection per check costs a handshake every health_interval_s; it also notices a
restarted server at once, where a kept connection would first have to fail.
"""

from __future__ import annotations

from proxy.core import grpc_wire
from proxy.errors import RampmeterError, UpstreamError
from proxy.http.upstream_h2 import H2UpstreamConnection

_MAX_ANSWER = grpc_wire.MAX_MESSAGE_BYTES + 5  # a health answer is a few bytes; a probe's is read whole


async def check(host: str, port: int, service: str) -> tuple[bool, str]:
    """(healthy, what it answered) for one Health/Check of `service` at host:port."""
    what = f"grpc health {service or '(server)'}"
    ok, detail, body = await unary(host, port, grpc_wire.HEALTH_CHECK_PATH, grpc_wire.health_request(service))
    if not ok:
        return False, f"{what}: {detail}"
    try:
        status = grpc_wire.health_status(grpc_wire.unframe(body))
    except ValueError as exc:
        return False, f"{what}: unreadable answer: {exc}"
    name = grpc_wire.SERVING_STATUS.get(status, str(status))
    return status == grpc_wire.SERVING, f"{what}: {name}"


async def unary(host: str, port: int, path: bytes, message: bytes) -> tuple[bool, str, bytes]:
    """One unary gRPC call on a connection of its own: (grpc-status 0, what it answered, response body).

    `message` is the serialized request; it is framed here. Also the warm-up probe of a
    `[[warmup.probes]]` with grpc = true (proxy/runtime/probes.py)."""
    block = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":authority", f"{host}:{port}".encode()),
        (b":path", path),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        (b"user-agent", b"rampmeter-probe"),
    ]
    try:
        async with H2UpstreamConnection.connect(host, port, label=f"{host}:{port}") as conn:
            resp = await conn.send(block, grpc_wire.frame(message))
            async with resp:
                body = await _read_bounded(resp)
                trailers = resp.trailers if resp.trailers is not None else resp.headers  # trailers-only
    except RampmeterError as exc:  # connect refused, reset, GOAWAY, a bad answer
        return False, str(exc), b""
    except OSError as exc:
        return False, f"{type(exc).__name__}: {exc}", b""
    if resp.status != 200:
        return False, f"HTTP {resp.status}", b""
    code = grpc_wire.status_of(trailers)
    if code != grpc_wire.Code.OK:
        return False, f"grpc-status {_code_name(code)}", b""
    return True, "grpc-status 0 OK", body


async def _read_bounded(resp) -> bytes:
    parts, size = [], 0
    while chunk := await resp.receive():
        size += len(chunk)
        if size > _MAX_ANSWER:
            raise UpstreamError(f"health answer larger than {_MAX_ANSWER} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _code_name(code: int | None) -> str:
    if code is None:
        return "missing"
    try:
        return f"{code} {grpc_wire.Code(code).name}"
    except ValueError:
        return str(code)
