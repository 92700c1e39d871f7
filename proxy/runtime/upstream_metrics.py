"""Optional read of the model server's own saturation gauges (vLLM- and Triton-style /metrics).

Theory of operation: NVML says how full the GPU's memory is, but vLLM
pre-allocates most of it at start (gpu_memory_utilization, 0.9 by default), so
"memory used" is flat and high whatever the load. What vLLM knows and exports
is better: `vllm:num_requests_waiting` (requests queued inside the engine) and
`vllm:gpu_cache_usage_perc` (KV-cache blocks in use, 0-1; vLLM V1 calls it
`vllm:kv_cache_usage_perc`), and `vllm:num_requests_running`; Triton exports
`nv_inference_pending_request_count` (requests queued, per model), read as
waiting. When `gpu.upstream_metrics_path` is set (or an upstream's own
`metrics_url`: Triton serves them on another port), one task GETs them from
every such upstream each `gpu.upstream_metrics_interval_s` and keeps the latest
`UpstreamSaturation` per upstream, exported as
`rampmeter_upstream_waiting_requests`, `rampmeter_upstream_running_requests` and
`rampmeter_upstream_kv_cache_usage_ratio`, and shown in /admin/stats.
`kv_cache_fraction()` (max over upstreams) is a drop-in pressure input for
shedding in place of NVML memory on vLLM pods; `on_reading(i, saturation)`,
when set, hears each fresh reading (the app feeds admission: the engine_queue
limit, the gradient's ceiling, and whether cut requests stay in the engine).

Parsing uses prometheus_client's own text parser (no hand-written exposition
parser), on only the lines of the wanted families: a vLLM /metrics page is
large (histograms per model) and this runs on the event loop. Values are
summed over label sets for the waiting count and maxed for cache usage.
A failed read clears that upstream's values (stale saturation is worse than
none) and is logged once per distinct problem.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from proxy.metrics import Metrics
from proxy.policy.schema import Policy
from proxy.runtime.probes import new_client

log = logging.getLogger("rampmeter.upstream_metrics")

WAITING = ("vllm:num_requests_waiting", "nv_inference_pending_request_count")
RUNNING = ("vllm:num_requests_running",)
KV_CACHE = ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc")
_WANTED = WAITING + RUNNING + KV_CACHE


@dataclass(frozen=True)
class ReaderStatistics:
    enabled: bool
    reads: int
    failures: int
    latest: tuple[UpstreamSaturation | None, ...]


@dataclass(frozen=True)
class UpstreamSaturation:
    waiting: float | None
    kv_cache_usage: float | None  # 0-1
    running: float | None = None


def parse_saturation(text: str) -> UpstreamSaturation:
    """The wanted gauges from a Prometheus text exposition; None for each one absent."""
    lines = "\n".join(line for line in text.splitlines() if line.startswith(_WANTED))
    waiting: float | None = None
    running: float | None = None
    kv: float | None = None
    for family in text_string_to_metric_families(lines + "\n"):
        for sample in family.samples:
            if sample.name in WAITING:
                waiting = (waiting or 0.0) + sample.value
            elif sample.name in RUNNING:
                running = (running or 0.0) + sample.value
            elif sample.name in KV_CACHE:
                kv = sample.value if kv is None else max(kv, sample.value)
    return UpstreamSaturation(waiting, kv, running)


class UpstreamMetricsReader:
    def __init__(
        self, policy: Policy, *, metrics: Metrics | None = None, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.policy = policy
        self.metrics = metrics if metrics is not None else Metrics()
        self._transport = transport
        path = policy.gpu.upstream_metrics_path
        self.urls = [u.metrics_url or (u.url.rstrip("/") + path if path else "") for u in policy.upstreams]
        self.on_reading: Callable[[int, UpstreamSaturation], None] | None = None
        self.latest: list[UpstreamSaturation | None] = [None] * len(self.urls)
        self._said: list[str] = [""] * len(self.urls)
        self.reads = self.failures = 0

    def __repr__(self) -> str:
        return f"<UpstreamMetricsReader path={self.policy.gpu.upstream_metrics_path!r} latest={self.latest}>"

    @property
    def enabled(self) -> bool:
        return any(self.urls)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Read every upstream's metrics until cancelled (returns at once when the path is unset)."""
        task_status.started()
        if not self.enabled:
            return
        async with new_client(len(self.urls) + 1, self._transport) as client:
            while True:
                for i, url in enumerate(self.urls):
                    if url:
                        await self.read_once(client, i)
                await trio.sleep(self.policy.gpu.upstream_metrics_interval_s)

    async def read_once(self, client: httpx.AsyncClient, index: int) -> UpstreamSaturation | None:
        gpu = self.policy.gpu
        problem = ""
        with trio.move_on_after(gpu.upstream_metrics_timeout_ms / 1000):
            try:
                response = await client.get(self.urls[index])
                if response.status_code == 200:
                    self._store(index, parse_saturation(response.text))
                    return self.latest[index]
                problem = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                problem = type(exc).__name__
            except ValueError as exc:  # the exposition did not parse
                problem = f"unparsable metrics: {exc}"
        self._fail(index, problem or "timeout")
        return None

    def _store(self, index: int, saturation: UpstreamSaturation) -> None:
        self.reads += 1
        self.latest[index] = saturation
        self._said[index] = ""
        label = self.metrics.upstream(index)
        for gauge, value in (
            (self.metrics.upstream_waiting_requests, saturation.waiting),
            (self.metrics.upstream_running_requests, saturation.running),
            (self.metrics.upstream_kv_cache_usage_ratio, saturation.kv_cache_usage),
        ):
            if value is None:
                _remove(gauge, label)
            else:
                gauge.labels(label).set(value)
        if self.on_reading is not None:
            self.on_reading(index, saturation)

    def _fail(self, index: int, problem: str) -> None:
        self.failures += 1
        self.latest[index] = None
        label = self.metrics.upstream(index)
        _remove(self.metrics.upstream_waiting_requests, label)
        _remove(self.metrics.upstream_running_requests, label)
        _remove(self.metrics.upstream_kv_cache_usage_ratio, label)
        if self._said[index] != problem:
            self._said[index] = problem
            log.warning("upstream %d: cannot read %s: %s", index, self.urls[index], problem)

    def kv_cache_fraction(self) -> float | None:
        """Highest KV-cache usage over the upstreams; None when unknown."""
        values = [s.kv_cache_usage for s in self.latest if s is not None and s.kv_cache_usage is not None]
        return max(values) if values else None

    def statistics(self) -> ReaderStatistics:
        return ReaderStatistics(self.enabled, self.reads, self.failures, tuple(self.latest))

    def waiting(self) -> float | None:
        values = [s.waiting for s in self.latest if s is not None and s.waiting is not None]
        return sum(values) if values else None


def _remove(gauge, label: str) -> None:
    try:
        gauge.remove(label)
    except KeyError:
        pass
