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

What a read costs, on the event loop that also serves requests (vLLM's CPU build's page:
50 KB, 604 lines; the branch realcal5 measured on 2 cores): the GET went through
httpx (~1.7 ms of CPU per read, most of the reader's) and the parse through
prometheus_client's text parser on the lines of the wanted families (~0.2 ms with
the filter that found them). A plain `http://` URL is now read on one kept-alive
connection of the sidecar's own HTTP/1.1 client (`H1UpstreamConnection`, the data
path's wire without its pool or limits; ~0.33 ms), and the page scanned by hand
for the few wanted lines (`parse_saturation`, ~0.04 ms): about 2.0 ms a read down
to 0.4, at one read a second. httpx stays for `https://` URLs and where a client
is handed in (tests' mock transports). Values are summed over label sets for the
waiting count and maxed for cache usage. A failed read clears that upstream's
values (stale saturation is worse than none) and is logged once per distinct
problem.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import trio

from proxy.errors import UpstreamError
from proxy.http.upstream_h1 import H1UpstreamConnection
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
    """The wanted gauges from a Prometheus text exposition; None for each one absent.

    Scanned by hand rather than with prometheus_client's parser: the page is large (vLLM's
    histograms), read every second on the event loop, and five of its ~600 lines matter. Each
    wanted name is found with str.find (C) where it starts a line and is followed by its labels
    or its value (not a longer name: `vllm:num_requests_waiting_by_reason`); a sample line is
    `name[{labels}] value [timestamp]`. Raises ValueError on a wanted line without a number.
    """
    waiting: float | None = None
    running: float | None = None
    kv: float | None = None
    for name in _WANTED:
        for value in _samples(text, name):
            if name in WAITING:
                waiting = (waiting or 0.0) + value
            elif name in RUNNING:
                running = (running or 0.0) + value
            else:
                kv = value if kv is None else max(kv, value)
    return UpstreamSaturation(waiting, kv, running)


def _samples(text: str, name: str) -> list[float]:
    """The values of the sample lines of exactly `name`."""
    out = []
    at = text.find(name)
    while at >= 0:
        end = at + len(name)
        if (at == 0 or text[at - 1] == "\n") and text[end : end + 1] in ("{", " "):
            line_end = text.find("\n", end)
            out.append(_value(text[end : line_end if line_end >= 0 else len(text)]))
        at = text.find(name, end)
    return out


def _value(rest: str) -> float:
    """The value in what follows a sample's name: `{labels} value [ts]` or ` value [ts]`."""
    i = 0
    if rest.startswith("{"):  # skip the labels: a quoted value may hold `}` and `\"`
        quoted = False
        i = 1
        while i < len(rest):
            ch = rest[i]
            if quoted and ch == "\\":
                i += 1
            elif ch == '"':
                quoted = not quoted
            elif ch == "}" and not quoted:
                break
            i += 1
        i += 1
    fields = rest[i:].split()
    if not fields:
        raise ValueError(f"no value in {rest!r}")
    return float(fields[0])  # ValueError on anything but a number (NaN and +Inf are numbers)


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
        self._conns: list[H1UpstreamConnection | None] = [None] * len(self.urls)  # kept alive between reads
        self._parsed = [httpx.URL(u) if u.startswith("http://") else None for u in self.urls]  # once, not per read
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
        try:
            async with new_client(len(self.urls) + 1, self._transport) as client:
                while True:
                    for i, url in enumerate(self.urls):
                        if url:
                            # httpx for https and a handed-in transport; the own connection otherwise
                            plain = self._transport is None and url.startswith("http://")
                            await self.read_once(None if plain else client, i)
                    await trio.sleep(self.policy.gpu.upstream_metrics_interval_s)
        finally:
            for conn in self._conns:
                if conn is not None:
                    conn.close()

    async def read_once(self, client: httpx.AsyncClient | None, index: int) -> UpstreamSaturation | None:
        """One read of upstream `index`: through `client` (httpx), or None: the own kept-alive connection."""
        gpu = self.policy.gpu
        problem = ""
        with trio.move_on_after(gpu.upstream_metrics_timeout_ms / 1000):
            try:
                if client is None:
                    status, text = await self._get(index)
                else:
                    response = await client.get(self.urls[index])
                    status, text = response.status_code, response.text
                if status == 200:
                    self._store(index, parse_saturation(text))
                    return self.latest[index]
                problem = f"HTTP {status}"
            except (httpx.HTTPError, UpstreamError, OSError) as exc:
                problem = type(exc).__name__
            except ValueError as exc:  # the exposition did not parse
                problem = f"unparsable metrics: {exc}"
        self._fail(index, problem or "timeout")
        return None

    async def _get(self, index: int) -> tuple[int, str]:
        """GET an http:// metrics URL on the kept-alive connection (reopened when stale or not reusable)."""
        url = self._parsed[index]
        assert url is not None  # run() sends only http:// URLs here
        conn = self._conns[index]
        if conn is None or conn.is_stale():
            if conn is not None:
                conn.close()
            conn = self._conns[index] = await H1UpstreamConnection.open(url.host, url.port or 80, label=str(url))
        try:
            response = await conn.send_request(
                b"GET", url.raw_path, [(b"host", url.netloc), (b"accept", b"text/plain")]
            )
            body = await response.read()
        except BaseException:  # an error, or the timeout's cancellation mid-exchange: never reuse it
            conn.close()
            self._conns[index] = None
            raise
        if not response.reusable():
            conn.close()
            self._conns[index] = None
        return response.status, body.decode("utf-8", "replace")

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
