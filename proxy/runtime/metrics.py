"""Every Prometheus metric rampmeter exports, declared in one list.

Theory of operation: `SPECS` names each metric once (name, kind, help, labels,
buckets). `Metrics(registry)` builds them all on that registry, reachable as
attributes named after the metric without the `rampmeter_` prefix and the
`_total` suffix (`metrics.requests`). Each app instance has its own registry, so
tests can run many sidecars in one process; `Metrics()` with no registry is the
null default for code under test. Labels are low-cardinality by construction:
protocol, class, reason, status code class, upstream index; never paths, tenants
or keys. Hot-path children are bound once with `child()`, not per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

# *_created series double the scrape for no use on a sidecar.
disable_created_metrics()

PREFIX = "rampmeter_"

# Latency buckets in seconds, from sub-millisecond overhead to multi-second generations.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)


@dataclass(frozen=True)
class Spec:
    name: str  # without prefix; counters end in _total
    kind: type
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    @property
    def attr(self) -> str:
        return self.name.removesuffix("_total")


SPECS: list[Spec] = [
    # --- the wire (server, upstream pool) ---
    Spec("requests_total", Counter, "Requests answered, by downstream protocol and status code.", ("protocol", "code")),
    Spec("request_duration_seconds", Histogram, "Time from request head to last response byte.", ("protocol",), LATENCY_BUCKETS),
    Spec("requests_in_flight", Gauge, "Requests being handled (queued or upstream)."),
    Spec("connections_open", Gauge, "Open client connections, by protocol.", ("protocol",)),
    Spec("connections_rejected_total", Counter, "Client connections refused at accept (max_connections)."),
    Spec("protocol_errors_total", Counter, "Malformed requests and HTTP/2 protocol errors, by kind.", ("kind",)),
    Spec("upstream_requests_total", Counter, "Requests sent upstream, by upstream index and outcome.", ("upstream", "outcome")),
    Spec("upstream_duration_seconds", Histogram, "Upstream exchange time, first request byte to last response byte.", ("upstream",), LATENCY_BUCKETS),
    Spec("upstream_outstanding", Gauge, "Requests outstanding per upstream.", ("upstream",)),
    Spec("upstream_connections", Gauge, "Open pooled connections per upstream.", ("upstream",)),
    Spec("upstream_cooldowns_total", Counter, "Times an upstream was set aside after refusing connections.", ("upstream",)),
    Spec("client_disconnects_total", Counter, "Requests whose client went away before the response ended."),
]


class Metrics:
    """All metrics of one sidecar instance, built from `SPECS` on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        for spec in SPECS:
            kwargs: dict[str, Any] = {"registry": self.registry}
            if spec.buckets is not None:
                kwargs["buckets"] = spec.buckets
            metric = spec.kind(PREFIX + spec.name, spec.help, spec.labels, **kwargs)
            setattr(self, spec.attr, metric)

    def __getattr__(self, name: str) -> Any:  # only reached for undeclared names
        raise AttributeError(f"metric {name!r} is not declared in proxy.runtime.metrics.SPECS")
