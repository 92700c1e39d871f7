"""Reading vLLM-style saturation gauges from the model server's /metrics."""

from __future__ import annotations

import logging

import httpx
import msgspec
import pytest
import trio

from proxy.metrics import Metrics
from proxy.policy.schema import Policy, Upstream
from proxy.policy.warmup import Gpu
from proxy.runtime.upstream_metrics import (
    UpstreamMetricsReader,
    UpstreamSaturation,
    parse_saturation,
)

# Shaped like vLLM 0.6 output: HELP/TYPE lines, several label sets, histograms in between.
VLLM_V0 = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
vllm:num_requests_waiting{model_name="lora-adapter"} 2.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.83
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 42.0
vllm:time_to_first_token_seconds_count{model_name="m"} 42.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 3.5
"""

# vLLM V1 renamed the cache gauge.
VLLM_V1 = """\
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
"""


def test_parse_vllm_v0():
    assert parse_saturation(VLLM_V0) == UpstreamSaturation(waiting=9.0, kv_cache_usage=0.83, running=12.0)


def test_parse_vllm_v1_names_and_max_over_engines():
    assert parse_saturation(VLLM_V1) == UpstreamSaturation(waiting=0.0, kv_cache_usage=0.5)


def test_parse_absent_gauges_are_none():
    assert parse_saturation("# nothing here\nprocess_cpu_seconds_total 3.0\n") == UpstreamSaturation(None, None)
    assert parse_saturation("") == UpstreamSaturation(None, None)


def test_parse_garbage_raises_value_error():
    with pytest.raises(ValueError):
        parse_saturation('vllm:num_requests_waiting{model_name="m"} not-a-number\n')


def policy(path="/metrics", upstreams=1) -> Policy:
    return Policy(
        upstreams=[Upstream(url=f"http://model{i}.test:8000") for i in range(upstreams)],
        gpu=Gpu(upstream_metrics_path=path, upstream_metrics_interval_s=1.0),
    )


class MetricsServer:
    def __init__(self, text: str) -> None:
        self.text, self.status, self.hits = text, 200, 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        self.hits += 1
        return httpx.Response(self.status, text=self.text)


async def test_reader_publishes_and_clears_on_failure(caplog):
    server, metrics = MetricsServer(VLLM_V0), Metrics()
    reader = UpstreamMetricsReader(policy(upstreams=2), metrics=metrics)
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        await reader.read_once(client, 0)
        await reader.read_once(client, 1)
        assert reader.kv_cache_fraction() == 0.83 and reader.waiting() == 18.0
        get = metrics.registry.get_sample_value
        assert get("rampmeter_upstream_waiting_requests", {"upstream": "0"}) == 9.0
        assert get("rampmeter_upstream_kv_cache_usage_ratio", {"upstream": "1"}) == 0.83
        server.status = 500
        with caplog.at_level(logging.WARNING, logger="rampmeter.upstream_metrics"):
            for _ in range(3):
                assert await reader.read_once(client, 0) is None
        assert reader.latest[0] is None and get("rampmeter_upstream_kv_cache_usage_ratio", {"upstream": "0"}) is None
        assert reader.kv_cache_fraction() == 0.83  # upstream 1 still known
        assert len(caplog.records) == 1 and "HTTP 500" in caplog.records[0].getMessage()
        server.text = 'vllm:num_requests_waiting{model_name="m"} not-a-number\n'
        server.status = 200
        with caplog.at_level(logging.WARNING, logger="rampmeter.upstream_metrics"):
            assert await reader.read_once(client, 0) is None
        assert "unparsable metrics" in caplog.records[-1].getMessage()
    stats = reader.statistics()
    assert stats.enabled and stats.reads == 2 and stats.failures == 4


async def test_reader_runs_on_its_interval(autojump_clock):
    server = MetricsServer(VLLM_V1)
    reader = UpstreamMetricsReader(policy(), transport=httpx.MockTransport(server))
    async with trio.open_nursery() as nursery:
        await nursery.start(reader.run)
        await trio.sleep(3.5)
        nursery.cancel_scope.cancel()
    assert server.hits == 4  # at 0, 1, 2, 3 s
    assert reader.latest[0] == UpstreamSaturation(0.0, 0.5)


async def test_reader_is_off_without_a_path(autojump_clock):
    reader = UpstreamMetricsReader(msgspec.structs.replace(policy(), gpu=Gpu()))
    async with trio.open_nursery() as nursery:
        await nursery.start(reader.run)
    assert not reader.enabled and reader.kv_cache_fraction() is None and reader.waiting() is None


# Triton's metrics port (8002): the pending count per model, no running gauge.
TRITON = """\
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="tiny",version="1"} 3
nv_inference_pending_request_count{model="other",version="1"} 1
nv_inference_request_success{model="tiny",version="1"} 120
"""


def test_parse_triton_pending_as_waiting():
    assert parse_saturation(TRITON) == UpstreamSaturation(waiting=4.0, kv_cache_usage=None, running=None)


async def test_an_upstream_metrics_url_reads_another_port_and_each_reading_is_heard():
    seen: list = []
    hits: list[str] = []

    def triton(request: httpx.Request) -> httpx.Response:
        hits.append(str(request.url))
        return httpx.Response(200, text=TRITON)

    pol = Policy(upstreams=[Upstream(url="http://triton.test:8000", metrics_url="http://triton.test:8002/metrics")])
    metrics = Metrics()
    reader = UpstreamMetricsReader(pol, metrics=metrics)
    reader.on_reading = lambda i, sat: seen.append((i, sat.waiting, sat.running))
    assert reader.enabled  # no gpu.upstream_metrics_path needed
    async with httpx.AsyncClient(transport=httpx.MockTransport(triton)) as client:
        await reader.read_once(client, 0)
    assert hits == ["http://triton.test:8002/metrics"] and seen == [(0, 4.0, None)]
    assert metrics.registry.get_sample_value("rampmeter_upstream_waiting_requests", {"upstream": "0"}) == 4.0


async def test_the_running_gauge_is_exported():
    server, metrics = MetricsServer(VLLM_V0), Metrics()
    reader = UpstreamMetricsReader(policy(), metrics=metrics)
    async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
        await reader.read_once(client, 0)
    assert metrics.registry.get_sample_value("rampmeter_upstream_running_requests", {"upstream": "0"}) == 12.0
