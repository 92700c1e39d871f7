"""Observed latency: what the sidecar has seen, for decisions, headers and dashboards.

Theory of operation: three windowed quantile families (proxy/core/quantiles.py),
keyed by (route, cost bucket): service time (first request byte upstream to the
response's last byte: some model servers send 200 before any work and stream for
long after), queue wait, and end to end. The arrival gate reads service p99 from
here; every proxied response carries `x-rampmeter-timeout-hint-ms`, the client
timeout the sidecar recommends (end-to-end p99 x latency.timeout_hint_factor,
falling back to the expected service time until there are samples).

The quantiles are exported at scrape time by a custom collector
(`rampmeter_pod_latency_quantile_seconds{kind, route, cost_bucket, quantile}`), so
recording costs a histogram increment and nothing else. Cardinality is bounded
by latency.max_keys per family.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import trio
from prometheus_client.core import GaugeMetricFamily

from proxy.core import deadline as dl
from proxy.core import wire
from proxy.core.arrival import service_key
from proxy.core.decisions import Ticket
from proxy.metrics import PREFIX, SPECS
from proxy.policy import shedding as shedding_policy

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from proxy.policy.shedding import Latency

QUANTILES = (0.5, 0.9, 0.99)
_SPEC = next(spec for spec in SPECS if spec.name == "pod_latency_quantile_seconds")
KINDS = ("service", "queue", "end_to_end")
_HINT_MS = wire.TIMEOUT_HINT_MS.encode()
_HINT_KEY = wire.TIMEOUT_HINT_KEY.encode()
_Field = tuple[bytes, bytes]


class Observatory:
    def __init__(self, latency_policy: Latency, registry: CollectorRegistry | None = None) -> None:
        self.configure(latency_policy)
        if registry is not None:
            registry.register(_QuantileCollector(self))

    def configure(self, latency_policy: Latency) -> None:
        """(Re)build the windows from `[latency]`; samples start over."""
        self.policy = latency_policy
        self.families = {kind: shedding_policy.latency_family(latency_policy) for kind in KINDS}
        self.service = self.families["service"]
        self._queue, self._end_to_end = self.families["queue"], self.families["end_to_end"]
        # key -> (reuse until, the hint's two response fields): a p99's answer is reused for
        # quantile_refresh_ms anyway (proxy/core/quantiles.py), and so is what is made of it.
        self._hints: dict[tuple[str, int], tuple[float, tuple[_Field, _Field]]] = {}
        self._hint_refresh_s = latency_policy.quantile_refresh_ms / 1000.0

    def record(self, ticket: Ticket, queue_ms: float, service_ms: float | None, now: float, key: object = None) -> None:
        """One request's waits; `key`: its service_key when the caller has it already."""
        key = service_key(ticket) if key is None else key
        self._queue.record(key, queue_ms, now)
        if service_ms is not None:
            self.service.record(key, service_ms, now)
            self._end_to_end.record(key, queue_ms + service_ms, now)

    def hint_fields(self, key: tuple[str, int], now: float, fallback_ms: float) -> tuple[_Field, _Field]:
        """`x-rampmeter-timeout-hint-ms` and `-key` for a request of latency key `key` (its end-to-end
        p99 x timeout_hint_factor; `fallback_ms`, the request's own expected time, while the key has
        too few samples). Made once per key and refresh: per request it is a dictionary lookup."""
        cached = self._hints.get(key)
        if cached is not None and now < cached[0]:
            return cached[1]
        p99 = self._end_to_end.quantile(key, 0.99, now)
        p = self.policy
        ms = dl.timeout_hint_ms(
            fallback_ms if p99 is None else p99, p.timeout_hint_factor, p.timeout_hint_min_ms, p.timeout_hint_max_ms
        )
        fields = ((_HINT_MS, b"%d" % ms), (_HINT_KEY, wire.hint_key(*key)))
        if p99 is not None and self._hint_refresh_s > 0:  # a fallback is the request's own: not kept
            if len(self._hints) >= p.max_keys:  # bounded as the families are (latency.max_keys)
                self._hints.clear()
            self._hints[key] = (now + self._hint_refresh_s, fields)
        return fields

    def statistics(self, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind, family in self.families.items():
            rows = []
            for key in family.keys():  # noqa: SIM118 - a Family, not a dict
                tracker = family.tracker(key)
                if tracker is None:
                    continue
                route, bucket = cast("tuple[str, int]", key)  # service_key(): (route, cost bucket)
                rows.append(
                    {
                        "route": route,
                        "cost_bucket": bucket,
                        "count": tracker.count(now),
                        **{f"p{int(q * 100)}_ms": tracker.quantile(q, now) for q in QUANTILES},
                    }
                )
            out[kind] = rows
        return out


class _QuantileCollector:
    """Prometheus collector: windowed p50/p90/p99 per kind and key, computed at scrape time."""

    def __init__(self, observatory: Observatory) -> None:
        self._obs = observatory

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            now = trio.current_time()
        except RuntimeError:  # scraped from outside trio (tests): nothing to report
            return
        gauge = GaugeMetricFamily(PREFIX + _SPEC.name, _SPEC.help, labels=list(_SPEC.labels))
        for kind, family in self._obs.families.items():
            for key in family.keys():  # noqa: SIM118 - a Family, not a dict
                tracker = family.tracker(key)
                if tracker is None or not tracker.count(now):
                    continue
                route, bucket = cast("tuple[str, int]", key)  # service_key(): (route, cost bucket)
                for q in QUANTILES:
                    value = tracker.quantile(q, now)
                    if value is not None:
                        gauge.add_metric([kind, route, str(bucket), str(q)], value / 1000.0)
        yield gauge
