"""`POST /admin/drain`: stop admitting, let what was admitted finish, say when it has.

Theory of operation: in Kubernetes the sidecar is a native sidecar, so it gets
SIGTERM only after the model container has exited; its own SIGTERM drain then has
nothing left to drain, and whatever was still queued when the model stopped got a
502. The model container's `preStop` hook calls this instead (examples/kubernetes,
docs/operations.md "Shutting down"), before the kubelet stops the model:

    drain called -> /readyz 503 "draining" (the endpoint leaves the Service)
                 -> every new request: 503 draining, Retry-After (Edge, before its body is read)
                 -> queued and in-flight requests run to their end as usual
                 -> the call returns when none is left (200), or at its timeout (504)
    then the kubelet stops the model, then SIGTERMs the sidecar, which exits at once.

Draining is one way: there is no undrain (a drained replica is being replaced). A
second call while draining waits again and answers the same way. The timeout is the
query parameter `timeout_s` (0-3600; default listen.drain_timeout_s); keep it below
the pod's terminationGracePeriodSeconds, which the hook's time counts against.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs

import trio

log = logging.getLogger("rampmeter")

MAX_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class DrainResult:
    drained: bool  # nothing left inside the request path
    waited_ms: float
    in_flight_at_start: int
    in_flight: int  # left at the end (0 when drained)
    refused_while_draining: int  # new requests answered 503 draining so far

    @property
    def status(self) -> int:
        return 200 if self.drained else 504


class Drain:
    """Drains an `Edge` (proxy/runtime/edge.py); `on_start` flips readiness to draining."""

    def __init__(self, edge, *, default_timeout_s: Callable[[], float], on_start: Callable[[], None]) -> None:
        self._edge = edge
        self._default_timeout_s = default_timeout_s
        self._on_start = on_start

    async def __call__(self, timeout_s: float | None = None) -> DrainResult:
        edge = self._edge
        timeout_s = self._default_timeout_s() if timeout_s is None else timeout_s
        start = trio.current_time()
        at_start = edge.active
        if not edge.draining:
            edge.draining = True
            self._on_start()
            log.info("draining on request: %d requests in flight, up to %.1fs for them", at_start, timeout_s)
        with trio.move_on_after(timeout_s):
            await edge.idle()
        result = DrainResult(
            drained=not edge.active,
            waited_ms=round((trio.current_time() - start) * 1000.0, 1),
            in_flight_at_start=at_start,
            in_flight=edge.active,
            refused_while_draining=edge.refused_draining,
        )
        if result.drained:
            log.info("drained in %.0f ms", result.waited_ms)
        else:
            log.warning("drain timed out after %.1fs with %d requests still in flight", timeout_s, result.in_flight)
        return result


def timeout_from_query(target: bytes) -> float | None:
    """`timeout_s` from the request target's query; ValueError naming the parameter if malformed."""
    _, _, query = target.partition(b"?")
    values = parse_qs(query[:1024].decode("latin-1"), keep_blank_values=True).get("timeout_s")
    if not values:
        return None
    try:
        timeout_s = float(values[0])
    except ValueError:
        raise ValueError(f"timeout_s: expected seconds (0-{MAX_TIMEOUT_S:g}), got {values[0][:40]!r}") from None
    if not 0.0 <= timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout_s: expected seconds (0-{MAX_TIMEOUT_S:g}), got {values[0][:40]!r}")
    return timeout_s
