"""How the load generator talks to a target: the project's own HTTP/1.1 and h2c connections.

Theory of operation: `open_transport(target, shapes, nursery)` returns the
transport for the target's protocol (`h1transport.py`: one keep-alive
connection per worker; `h2transport.py`: streams over a few shared
connections). Each runner worker holds a `session()`; a session's `send(shape,
key)` returns a response with `status`, `headers`, `receive()` and `aclose()`
(the `UpstreamResponse` shape), and `aclose()` never awaits, so the runner's
`finally` releases it exactly once, also on timeout. `inproc.HandlerTransport`
is a third transport, for handlers in the same process.

Uses `proxy.http.upstream_h1/h2` directly rather than `UpstreamPool`: the pool's
semaphore, metrics and retry policy are what a sidecar needs, not a generator.
"""

from __future__ import annotations

import trio

from proxy.loadtest.h1transport import H1Transport
from proxy.loadtest.h2transport import H2Transport
from proxy.loadtest.shapes import Shape
from proxy.loadtest.target import PROTOCOLS, Prepared, Target, prepare

__all__ = ["PROTOCOLS", "H1Transport", "H2Transport", "Prepared", "Target", "open_transport", "prepare"]


def open_transport(target: Target, shapes: tuple[Shape, ...], nursery: trio.Nursery) -> H1Transport | H2Transport:
    if target.protocol == "h2c":
        return H2Transport(target, shapes, nursery)
    return H1Transport(target, shapes)
