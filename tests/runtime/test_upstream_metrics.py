"""Reading vLLM-style saturation gauges from the model server's /metrics."""

from __future__ import annotations

import logging
import math

import httpx
import msgspec
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.metrics import Metrics
from proxy.policy.schema import Policy, Upstream
from proxy.policy.warmup import Gpu
from proxy.runtime.upstream_metrics import (
    KV_CACHE,
    RUNNING,
    WAITING,
    UpstreamMetricsReader,
    UpstreamSaturation,
    parse_saturation,
)
from tests.runtime.raw_servers import RawH1Server

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


# --- the hand scan (branch realcal5) against prometheus_client's parser, and the own connection ---


def library_parse(text: str) -> UpstreamSaturation:
    """What parse_saturation answered before the hand scan: prometheus_client's parser on every line."""
    from prometheus_client.parser import text_string_to_metric_families

    waiting = running = kv = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in WAITING:
                waiting = (waiting or 0.0) + sample.value
            elif sample.name in RUNNING:
                running = (running or 0.0) + sample.value
            elif sample.name in KV_CACHE:
                kv = sample.value if kv is None else max(kv, sample.value)
    return UpstreamSaturation(waiting, kv, running)


# Label values with what a hand scan could trip on: braces, quotes, backslashes, spaces, commas (escaped as
# the exposition format escapes them).
LABEL_VALUES = st.text(alphabet='ab }{",= \\', max_size=8).map(lambda v: v.replace("\\", "\\\\").replace('"', '\\"'))


@st.composite
def expositions(draw) -> str:
    names = [*WAITING, *RUNNING, *KV_CACHE, "vllm:num_requests_waiting_by_reason", "vllm:e2e_request_latency_seconds"]
    lines = []
    for name in draw(st.lists(st.sampled_from(names), max_size=8)):
        labels = draw(st.dictionaries(st.sampled_from(["model_name", "engine", "reason"]), LABEL_VALUES, max_size=3))
        label_text = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
        value = draw(st.floats(min_value=0, max_value=1e6, allow_nan=False) | st.sampled_from([0.0, 1.0, 12.0]))
        stamp = draw(st.sampled_from(["", " 1700000000000"]))
        if draw(st.booleans()):
            lines.append(f"# HELP {name} {draw(st.sampled_from(['help', name + ' 3']))}")
        lines.append(f"{name}{label_text} {value!r}{stamp}")
    return "\n".join(lines) + "\n"


@settings(max_examples=300, deadline=None)
@given(expositions())
def test_the_hand_scan_reads_what_prometheus_clients_parser_reads(text):
    ours, theirs = parse_saturation(text), library_parse(text)
    # Sums in another order: the library groups samples by family, the scan adds them in line order,
    # and float addition is not associative (524288.5991456716 vs ...717 seen). Equal but for that.
    for field in ("waiting", "kv_cache_usage", "running"):
        a, b = getattr(ours, field), getattr(theirs, field)
        assert (a is None) == (b is None), (field, a, b)
        assert a is None or math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9), (field, a, b)


def test_the_vllm_cpu_page_reads_its_gauges_and_not_the_longer_names():
    # The families of vLLM 0.32's CPU build's page around the gauges, a waiting_by_reason among them.
    page = (
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_running{engine="0",model_name="tiny"} 8.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny",reason="capacity"} 3.0\r\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="a } b \\" c"} 0.25 1700000000000\n'
    )
    assert parse_saturation(page) == library_parse(page) == UpstreamSaturation(3.0, 0.25, 8.0)


def test_a_wanted_line_without_a_number_is_a_value_error():
    for bad in ('vllm:num_requests_waiting{model_name="m"}\n', "vllm:num_requests_running \n"):
        with pytest.raises(ValueError):
            parse_saturation(bad)


async def test_a_plain_http_url_is_read_on_one_kept_alive_connection_of_the_sidecars_own_client():
    closing = []

    async def handler(exchange) -> None:
        if exchange.request.target != b"/metrics":
            await exchange.respond(404, b"")
        elif closing:
            exchange.close_after = True  # the server closes after this answer, without saying so
            await exchange.respond(200, VLLM_V0.encode())
        else:
            await exchange.respond(200, VLLM_V0.encode())

    server = RawH1Server(handler)
    async with server.running():
        pol = Policy(
            upstreams=[Upstream(url=f"http://127.0.0.1:{server.port}")],
            gpu=Gpu(upstream_metrics_path="/metrics", upstream_metrics_interval_s=1.0),
        )
        reader = UpstreamMetricsReader(pol)
        for _ in range(3):
            assert await reader.read_once(None, 0) == UpstreamSaturation(9.0, 0.83, 12.0)
        assert server.connections == 1 and len(server.requests) == 3  # one connection, kept alive
        assert dict(server.requests[0].headers)[b"host"] == f"127.0.0.1:{server.port}".encode()
        closing.append(True)
        await reader.read_once(None, 0)
        await trio.testing.wait_all_tasks_blocked()
        assert await reader.read_once(None, 0) == UpstreamSaturation(9.0, 0.83, 12.0)  # a new connection
        assert server.connections == 2
    assert await reader.read_once(None, 0) is None  # the server is gone: a failed read, logged
    assert reader.latest[0] is None and reader.statistics().failures == 1


async def test_the_run_loop_reads_plain_http_on_the_own_connection(autojump_clock):
    async def handler(exchange) -> None:
        await exchange.respond(200, VLLM_V1.encode())

    server = RawH1Server(handler)
    async with server.running():
        pol = Policy(
            upstreams=[Upstream(url=f"http://127.0.0.1:{server.port}")],
            gpu=Gpu(upstream_metrics_path="/metrics", upstream_metrics_interval_s=1.0),
        )
        reader = UpstreamMetricsReader(pol)
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            await trio.sleep(3.5)
            nursery.cancel_scope.cancel()
    assert len(server.requests) == 4 and server.connections == 1
    assert reader.latest[0] == UpstreamSaturation(0.0, 0.5)
