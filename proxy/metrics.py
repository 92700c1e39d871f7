"""Every Prometheus metric rampmeter exports, declared in one list.

Theory of operation: `SPECS` names each metric once (name, kind, help, labels,
buckets). `Metrics(registry)` builds them all on that registry, reachable as
attributes named after the metric without the `rampmeter_` prefix and the
`_total` suffix (`metrics.requests`). Each app instance has its own registry, so
tests can run many sidecars in one process; `Metrics()` with no registry is the
null default for code under test. Labels are low-cardinality by construction:
protocol, class, reason, status code, upstream; never paths, tenants or keys.
Hot-path children are bound once, not per request. The counters and histograms the
request path feeds per request (`folded=True` in SPECS: admitted, queue wait, goodput,
rejections, cost estimate error; and the wire's requests, request and upstream durations,
upstream outcomes) are plain Python numbers (`Tally`), folded into
Prometheus families by one custom collector at scrape time: a prometheus_client child
takes a lock and a method chain per increment, several microseconds a request.

`upstream` labels carry the upstream's address (`127.0.0.1:8000`, from its URL),
what an operator knows it by: the parts know an upstream by its index in the
policy's list and ask `Metrics.upstream(index)` for the label. Without a list
(`Metrics()` in tests) the label is the index.

Latency for dashboards and alerts comes from the histograms
(`rampmeter_request_duration_seconds`, `_upstream_duration_seconds`,
`_queue_wait_seconds`): their buckets add up across pods, so
`histogram_quantile(0.99, sum by (le) (rate(..._bucket[5m])))` is the fleet's p99.
`rampmeter_pod_latency_quantile_seconds` is a different thing: the quantiles one
pod's admission decisions use (windowed, per route and cost bucket), computed in
the pod; averaging or summing it across pods gives no quantile of anything.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

# *_created series double the scrape for no use on a sidecar.
disable_created_metrics()

PREFIX = "rampmeter_"

# Latency buckets in seconds, from sub-millisecond overhead to multi-second generations.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)


class SCRAPE_TIME:
    """Kind of a metric computed by a custom collector at scrape time (declared here all the same)."""


@dataclass(frozen=True)
class Spec:
    name: str  # without prefix; counters end in _total
    kind: type
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    folded: bool = False  # plain numbers, folded in at scrape time (`Tally`): fed per request

    @property
    def attr(self) -> str:
        return self.name.removesuffix("_total")


SPECS: list[Spec] = [
    # --- the wire (server, upstream pool) ---
    Spec(
        "requests_total",
        Counter,
        "Requests answered, by downstream protocol, class (empty before classification: 400s) and status code.",
        ("protocol", "class", "code"),
        folded=True,
    ),
    Spec(
        "request_duration_seconds",
        Histogram,
        "Time from request head to last response byte, by protocol and class; the source for request latency across pods.",
        ("protocol", "class"),
        LATENCY_BUCKETS,
        folded=True,
    ),
    Spec("requests_in_flight", Gauge, "Requests being handled (queued or upstream)."),
    Spec("connections_open", Gauge, "Open client connections, by protocol.", ("protocol",)),
    Spec("connections_rejected_total", Counter, "Client connections refused at accept (max_connections)."),
    Spec("protocol_errors_total", Counter, "Malformed requests and HTTP/2 protocol errors, by kind.", ("kind",)),
    Spec(
        "h2_floods_total",
        Counter,
        "HTTP/2 connections closed with GOAWAY ENHANCE_YOUR_CALM, by kind (control_frames, header_block, rapid_reset).",
        ("kind",),
    ),
    Spec(
        "h2_timeouts_total",
        Counter,
        "HTTP/2 streams reset or connections closed for stalling, by kind (body: request body; stream_send: window never opened; send: socket not read).",
        ("kind",),
    ),
    Spec(
        "upstream_requests_total",
        Counter,
        "Requests sent upstream, by upstream (address) and outcome.",
        ("upstream", "outcome"),
        folded=True,
    ),
    Spec(
        "upstream_duration_seconds",
        Histogram,
        "Upstream exchange time, first request byte to last response byte; the source for upstream latency across pods.",
        ("upstream",),
        LATENCY_BUCKETS,
        folded=True,
    ),
    Spec("upstream_outstanding", Gauge, "Requests outstanding per upstream.", ("upstream",)),
    Spec("upstream_connections", Gauge, "Open pooled connections per upstream.", ("upstream",)),
    Spec(
        "upstream_cooldowns_total",
        Counter,
        "Times an upstream was set aside after refusing connections.",
        ("upstream",),
    ),
    Spec("client_disconnects_total", Counter, "Requests whose client went away before the response ended."),
    Spec(
        "pod_latency_quantile_seconds",
        SCRAPE_TIME,
        "This pod's windowed latency quantiles (latency.window_s) that its admission decisions use, by kind (service, queue, end_to_end), route and cost bucket; not aggregatable across pods: use the *_duration_seconds / queue_wait_seconds histograms; proxy/runtime/observe.py.",
        ("kind", "route", "cost_bucket", "quantile"),
    ),
    Spec(
        "rejections_total",
        Counter,
        "Answers the sidecar made itself instead of the model's, by class (empty before classification) and reason (x-rampmeter-reason): admission, shedding, readiness, deadlines, upstream errors.",
        ("class", "reason"),
        folded=True,
    ),
    # --- policy ---
    Spec("policy_reloads_total", Counter, "Policy reload attempts, by result (ok, error).", ("result",)),
    Spec("policy_version", Gauge, "Version of the policy in force (1 at start, +1 per successful reload)."),
    Spec(
        "build_info",
        Gauge,
        "Always 1; the labels say which rampmeter and Python this pod runs (set by proxy/app.py).",
        ("version", "python"),
    ),
    # --- cold start, readiness, GPU (runtime/warmup.py, runtime/gpu.py, runtime/upstream_metrics.py) ---
    Spec("upstreams_ready", Gauge, "Upstreams that may take traffic (ramping or warm); 0 means /readyz answers 503."),
    Spec(
        "upstream_state",
        Gauge,
        "1 for the lifecycle state each upstream is in (cold, probing, ramping, warm, unhealthy), else 0.",
        ("upstream", "state"),
    ),
    Spec(
        "upstream_transitions_total",
        Counter,
        "Lifecycle state changes, by upstream and the state entered.",
        ("upstream", "state"),
    ),
    Spec(
        "upstream_losses_total",
        Counter,
        "Probing or ready upstreams lost, by cause (restarted, health_lost, failure_streak).",
        ("upstream", "cause"),
    ),
    Spec(
        "warmup_probes_total",
        Counter,
        "Warm-up probes sent, by upstream and outcome (ok, error, timeout).",
        ("upstream", "outcome"),
    ),
    Spec(
        "warmup_probe_duration_seconds",
        Histogram,
        "Warm-up probe latency, by upstream and probe shape index.",
        ("upstream", "shape"),
        LATENCY_BUCKETS,
    ),
    Spec(
        "warmup_duration_seconds",
        Gauge,
        "How long the last successful warm-up took (probing to ramping).",
        ("upstream",),
    ),
    Spec(
        "slow_start_factor",
        Gauge,
        "Fraction of the admission limit allowed now (slow start ramp; 1 when warm, 0 when not ready).",
        ("upstream",),
    ),
    Spec("gpu_utilization_ratio", Gauge, "GPU busy fraction over the last NVML sample period.", ("gpu",)),
    Spec("gpu_memory_used_bytes", Gauge, "GPU memory in use.", ("gpu",)),
    Spec("gpu_memory_total_bytes", Gauge, "GPU memory installed.", ("gpu",)),
    Spec("gpu_temperature_celsius", Gauge, "GPU core temperature.", ("gpu",)),
    Spec("gpu_power_watts", Gauge, "GPU power draw.", ("gpu",)),
    Spec("gpu_sample_errors_total", Counter, "NVML readings that failed, by GPU and error.", ("gpu", "error")),
    Spec(
        "upstream_waiting_requests",
        Gauge,
        "Requests waiting inside the model server (vllm:num_requests_waiting, nv_inference_pending_request_count).",
        ("upstream",),
    ),
    Spec(
        "upstream_running_requests",
        Gauge,
        "Requests the model server is running (vllm:num_requests_running).",
        ("upstream",),
    ),
    Spec(
        "phantom_leases",
        Gauge,
        "Admission slots held for requests cut upstream that the server keeps computing, by upstream.",
        ("upstream",),
    ),
    Spec(
        "upstream_kv_cache_usage_ratio",
        Gauge,
        "Model server KV-cache usage, 0-1 (vllm:gpu_cache_usage_perc).",
        ("upstream",),
    ),
    Spec(
        "goodput_total",
        Counter,
        "Requests answered 2xx before their deadline (the SLA), by class; the dashboard's goodput.",
        ("class",),
        folded=True,
    ),
    # --- admission (core/admission.py, runtime/scheduler.py) ---
    Spec("queue_depth", Gauge, "Requests waiting for admission, by class.", ("class",)),
    Spec(
        "queue_wait_seconds",
        Histogram,
        "Time from arrival to admission, by class (0 when admitted at once).",
        ("class",),
        LATENCY_BUCKETS,
        folded=True,
    ),
    Spec("admitted_total", Counter, "Requests admitted to an upstream, by class.", ("class",), folded=True),
    Spec(
        "queue_abandoned_total",
        Counter,
        "Queued requests whose client went away before admission, by class.",
        ("class",),
    ),
    Spec(
        "admission_inflight",
        Gauge,
        "Admitted work in flight per upstream, in the limit's unit (requests or tokens).",
        ("upstream",),
    ),
    Spec(
        "admission_limit",
        Gauge,
        "Concurrency limit in force per upstream, in the limit's unit (after slow start).",
        ("upstream",),
    ),
    Spec(
        "limit_changes_total",
        Counter,
        "Changes of an upstream's concurrency limit, by reason (latency, probe, drop, min_limit, max_limit).",
        ("upstream", "reason"),
    ),
    Spec(
        "cost_estimate_error_ratio",
        Histogram,
        "Observed / estimated at arrival, for service_time and output_tokens.",
        ("kind",),
        (0.125, 0.25, 0.5, 0.8, 0.9, 1.0, 1.1, 1.25, 2.0, 4.0, 8.0),
        folded=True,
    ),
    Spec("unknown_priority_total", Counter, "Requests whose x-priority named no class (served as the default class)."),
    # --- micro-batching (core/batching.py, runtime/batcher.py); `route` is a [[batching.routes]] path ---
    Spec(
        "batch_items",
        Histogram,
        "Inputs (rows) per upstream batch call, by route.",
        ("route",),
        (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    ),
    Spec(
        "batch_tokens",
        Histogram,
        "Estimated input tokens per upstream batch call, by route (kserve_v2: tensor elements).",
        ("route",),
        (16, 64, 256, 1024, 4096, 16384, 65536, 262144),
    ),
    Spec(
        "batch_wait_seconds",
        Histogram,
        "Time a request waited in the batcher, from admission to its batch being sent, by route.",
        ("route",),
        LATENCY_BUCKETS,
    ),
    Spec(
        "batches_total",
        Counter,
        "Batches sent, by route and what closed them: size, tokens, time (max_wait_ms or the adaptive window), deadline.",
        ("route", "closed_by"),
    ),
    Spec(
        "batch_padding_tokens_total",
        Counter,
        "Padding left in sent batches: longest input x inputs - tokens, what a padding server computes for nothing.",
        ("route",),
    ),
    Spec(
        "batch_padding_saved_tokens_total",
        Counter,
        "Padding that grouping by length saved: (longest input gathering under the same key in any bucket - the batch's longest) x inputs.",
        ("route",),
    ),
    Spec(
        "batch_unbatched_total",
        Counter,
        "Requests on a batchable route forwarded alone, by reason (not_json_object, no_input, input_shape, too_large, max_open_batches).",
        ("route", "reason"),
    ),
    Spec(
        "batch_members_dropped_total",
        Counter,
        "Batch members whose client left: before the batch was sent (gathering: taken out) or after (sent: its share discarded).",
        ("route", "stage"),
    ),
    Spec(
        "batch_retries_total",
        Counter,
        "Failed batches sent again once: blamed (the answer named one input; the others again) or split (two halves).",
        ("route", "kind"),
    ),
    # --- idempotent dedup (runtime/dedup/) ---
    Spec(
        "dedup_decisions_total",
        Counter,
        "Keyed requests by decision: lead (claimed), follow / follow_remote (coalesced), replay, mismatch, conflict, store_down, fail_open.",
        ("decision",),
    ),
    Spec(
        "dedup_finishes_total",
        Counter,
        "Leaders finished, by verdict: stored, failed, not_storable, too_large, lost (claim lapsed or store write failed).",
        ("verdict",),
    ),
    Spec(
        "dedup_evictions_total",
        Counter,
        "Kept responses dropped by the memory store: lru (max_memory_bytes) or ttl.",
        ("cause",),
    ),
    Spec("dedup_stored_bytes", Gauge, "Bytes of responses kept by the memory store."),
    Spec("dedup_in_flight", Gauge, "Keyed requests this replica is leading now."),
    Spec(
        "dedup_store_errors_total", Counter, "Dedup store operations that failed or timed out, by operation.", ("op",)
    ),
    Spec(
        "dedup_store_duration_seconds",
        Histogram,
        "Dedup store operation latency, by operation.",
        ("op",),
        (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    ),
    Spec(
        "dedup_replay_cache_hits_total",
        Counter,
        "Keyed requests answered from this replica's replay cache (Redis store) without a store call: replays and reused-key 422s, also counted in dedup_decisions_total.",
    ),
    Spec(
        "dedup_replay_cache_evictions_total",
        Counter,
        "Completed responses dropped from this replica's replay cache: lru (max_memory_bytes) or ttl.",
        ("cause",),
    ),
    Spec(
        "dedup_replay_cache_bytes",
        Gauge,
        "Bytes of completed responses held in this replica's replay cache (Redis store).",
    ),
]


def upstream_labels(urls: Sequence[str]) -> list[str]:
    """`upstream` label values for the policy's upstream URLs: the address, unique (`#index` on repeats)."""
    names = [url.removeprefix("http://").rstrip("/") for url in urls]
    return [name if names.count(name) == 1 else f"{name}#{i}" for i, name in enumerate(names)]


class _Count:
    """One label set of a folded counter: a plain float."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _Buckets:
    """One label set of a folded histogram: a count per bucket (not cumulative) and the sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1  # le: the first bound >= value
        self.sum += value


class Tally:
    """A counter or histogram family kept as plain numbers per label set (`labels(...)` binds one,
    as prometheus_client's does), folded into its Prometheus family at scrape time (`family`)."""

    __slots__ = ("_bounds", "_children", "spec")

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self._bounds = None if spec.buckets is None else (*spec.buckets, float("inf"))
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.spec.labels):
                raise ValueError(f"{self.spec.name} takes labels {self.spec.labels}, got {values}")
            child = self._children[values] = _Count() if self._bounds is None else _Buckets(self._bounds)
        return child

    def collect(self) -> list[Metric]:
        """As a prometheus_client metric's (tests and tools read one family through it)."""
        return [self.family()]

    def family(self) -> Metric:
        spec, name = self.spec, PREFIX + self.spec.name
        if self._bounds is None:
            counters = CounterMetricFamily(name, spec.help, labels=spec.labels)
            for values, count in self._children.items():
                counters.add_metric(values, count.value)
            return counters
        hist = HistogramMetricFamily(name, spec.help, labels=spec.labels)
        for values, child in self._children.items():
            running, buckets = 0, []
            for bound, n in zip(self._bounds, child.counts, strict=True):
                running += n
                buckets.append((floatToGoString(bound), running))
            hist.add_metric(values, buckets, child.sum)
        return hist


class _Folded:
    """The custom collector that turns every `Tally` into its family at scrape time."""

    def __init__(self, tallies: list[Tally]) -> None:
        self._tallies = tallies

    def collect(self) -> Iterator[Metric]:
        for tally in self._tallies:
            yield tally.family()

    def describe(self) -> Iterator[Metric]:
        return self.collect()


class Metrics:
    """All metrics of one sidecar instance, built from `SPECS` on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None, *, upstreams: Sequence[str] = ()) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._upstream_labels = upstream_labels(upstreams)
        tallies: list[Tally] = []
        for spec in SPECS:
            kwargs: dict[str, Any] = {"registry": self.registry}
            if spec.buckets is not None:
                kwargs["buckets"] = spec.buckets
            if spec.kind is SCRAPE_TIME:
                continue  # its owner registers a collector that computes it at scrape time
            if spec.folded:
                tally = Tally(spec)
                tallies.append(tally)
                setattr(self, spec.attr, tally)
                continue
            metric = spec.kind(PREFIX + spec.name, spec.help, spec.labels, **kwargs)
            setattr(self, spec.attr, metric)
        self.registry.register(_Folded(tallies))

    def upstream(self, index: int) -> str:
        """The `upstream` label of the policy's upstream number `index`."""
        labels = self._upstream_labels
        return labels[index] if index < len(labels) else str(index)

    def __getattr__(self, name: str) -> Any:  # only reached for undeclared names
        raise AttributeError(f"metric {name!r} is not declared in proxy.metrics.SPECS")
