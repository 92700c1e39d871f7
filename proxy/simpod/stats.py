"""The pod's honest counters, as /sim/stats JSON and vLLM-style Prometheus text.

Theory of operation: nothing here counts; it renders snapshots. The engine's
`statistics()` (work and time accounting), the HTTP layer's `HttpCounters`
(answers the pod gave without executing) and the pod's identity/fault state are
merged into one flat JSON document for tests and benchmarks. `/metrics` exposes
the subset rampmeter reads for saturation under vLLM's own metric names
(`vllm:num_requests_running`, `vllm:num_requests_waiting`,
`vllm:gpu_cache_usage_perc`, a 0-1 fraction as in vLLM), through
prometheus_client with a custom collector that reads the engine at scrape time,
so the hot path updates no metric objects at all.

gpu_cache_usage_perc is KV *reserved* / capacity: this engine admits on
reservations, so that fraction is what says "new requests will queue".
"""

from __future__ import annotations

import dataclasses

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_encode = msgspec.json.Encoder().encode

PROMETHEUS_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


@dataclasses.dataclass
class HttpCounters:
    """Answers given at the HTTP layer (reset with the engine's counters)."""

    http_requests: int = 0
    bad_requests: int = 0  # 400: invalid JSON, missing fields, bad headers
    injected_errors: int = 0  # 500 from a fault's error rate (never executed)
    not_ready: int = 0  # 503 during cold start
    not_found: int = 0  # 404/405

    def reset(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, 0)


def stats_document(pod, http: HttpCounters) -> dict:
    doc = dataclasses.asdict(pod.engine.statistics())
    doc.update(dataclasses.asdict(http))
    doc.update(pod.statistics())
    doc["max_num_seqs"] = pod.profile.max_num_seqs
    doc["speed"] = pod.profile.speed
    return doc


def stats_json(pod, http: HttpCounters) -> bytes:
    return _encode(stats_document(pod, http))


class _PodCollector:
    def __init__(self, pod) -> None:
        self.pod = pod

    def collect(self):
        s = self.pod.engine.statistics()
        model = [self.pod.profile.model]

        def gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, help_text, labels=["model_name"])
            g.add_metric(model, value)
            return g

        def counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, help_text, labels=["model_name"])
            c.add_metric(model, value)
            return c

        yield gauge("vllm:num_requests_running", "Number of requests in the running batch.", s.running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be admitted.", s.waiting)
        yield gauge(
            "vllm:gpu_cache_usage_perc", "KV cache usage (reserved), 0-1.", s.kv_reserved_tokens / s.kv_capacity_tokens
        )
        yield counter("vllm:prompt_tokens", "Prefill tokens processed.", s.prompt_tokens)
        yield counter("vllm:generation_tokens", "Generation tokens processed.", s.output_tokens)
        yield counter("vllm:request_success", "Requests finished by the engine.", s.requests_completed)
        yield counter("simpod:busy_seconds", "Engine busy time.", s.busy_s)
        wasted = CounterMetricFamily(
            "simpod:wasted_seconds", "Engine time spent for nobody, by reason.", labels=["model_name", "reason"]
        )
        wasted.add_metric(model + ["client_gone"], s.wasted_client_gone_s)
        wasted.add_metric(model + ["deadline"], s.wasted_deadline_s)
        yield wasted


def metrics_registry(pod) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_PodCollector(pod))
    return registry


def metrics_text(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
