"""/metrics as a scraper sees it from a real sidecar: names, labels operators can read, OpenMetrics.

- `upstream` labels are the upstream's address, not its index in the policy;
- `rampmeter_requests_total` and `rampmeter_rejections_total` carry `class`, and the
  one rejection counter counts each answer once (no second admission counter);
- `rampmeter_build_info{version, python}` is 1;
- the per-pod quantile gauge is named for what it is, and the histograms are there;
- `Accept: application/openmetrics-text` gets OpenMetrics (the format with exemplars).
"""

from __future__ import annotations

import platform

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from proxy import build
from proxy.metrics import Metrics, upstream_labels
from proxy.testing.stack import sidecar, sim_pod

pytestmark = pytest.mark.integration


def samples(text: str) -> list:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


@pytest.fixture(scope="module")
def stack():
    with sim_pod(speed=20) as pod, sidecar(pod.url()) as car:
        address = pod.url().removeprefix("http://")
        with httpx.Client(base_url=car.url(), timeout=30) as client:
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            assert client.post("/v1/chat/completions", json=chat, headers={"x-priority": "batch"}).status_code == 200
            # A 1 ms budget cannot be met: a rejection of class realtime, counted once.
            late = client.post(
                "/v1/chat/completions",
                json=chat,
                headers={"x-priority": "realtime", "x-request-timeout-ms": "1"},
            )
            assert late.status_code in (503, 504)
            bad = client.post("/v1/chat/completions", json=chat, headers={"x-request-timeout-ms": "soon"})
            assert bad.status_code == 400
        yield car, address, late.headers["x-rampmeter-reason"]


def scrape(car, accept: str | None = None) -> httpx.Response:
    headers = {"accept": accept} if accept else {}
    return httpx.get(car.url("admin") + "/metrics", headers=headers, timeout=10)


def test_upstream_labels_are_addresses(stack):
    car, address, _ = stack
    found = samples(scrape(car).text)
    upstreams = {s.labels["upstream"] for s in found if "upstream" in s.labels}
    assert upstreams == {address}
    assert any(s.name == "rampmeter_upstream_requests_total" and s.labels["upstream"] == address for s in found)


def test_requests_and_rejections_carry_the_class(stack):
    car, _, reason = stack
    found = samples(scrape(car).text)
    requests = {(s.labels["class"], s.labels["code"]) for s in found if s.name == "rampmeter_requests_total"}
    assert ("batch", "200") in requests and ("", "400") in requests
    rejections = {
        (s.labels["class"], s.labels["reason"]): s.value for s in found if s.name == "rampmeter_rejections_total"
    }
    assert rejections == {("realtime", reason): 1.0, ("", "bad_request"): 1.0}
    assert not any(s.name.startswith("rampmeter_admission_rejected") for s in found)
    durations = {s.labels["class"] for s in found if s.name == "rampmeter_request_duration_seconds_count"}
    assert "batch" in durations


def test_build_info_and_the_renamed_quantile_gauge(stack):
    car, _, _ = stack
    found = samples(scrape(car).text)
    (info,) = [s for s in found if s.name == "rampmeter_build_info"]
    assert info.value == 1 and info.labels == {"version": build.version(), "python": platform.python_version()}
    quantiles = [s for s in found if s.name == "rampmeter_pod_latency_quantile_seconds"]
    assert quantiles and {"kind", "route", "cost_bucket", "quantile"} == set(quantiles[0].labels)
    assert not any(s.name.startswith("rampmeter_latency_quantile") for s in found)
    assert any(s.name == "rampmeter_upstream_duration_seconds_bucket" for s in found)


def test_openmetrics_is_served_when_asked_for(stack):
    car, _, _ = stack
    plain = scrape(car)
    assert plain.headers["content-type"].startswith("text/plain")
    om = scrape(car, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.endswith("# EOF\n")
    names = {f.name for f in openmetrics_families(om.text)}
    assert {"rampmeter_requests", "rampmeter_build_info"} <= names  # counters lose _total in OpenMetrics names


def test_upstream_label_values():
    assert upstream_labels(["http://10.0.0.1:8000", "http://[::1]:8001/v1/"]) == ["10.0.0.1:8000", "[::1]:8001/v1"]
    assert upstream_labels(["http://a:1", "http://a:1"]) == ["a:1#0", "a:1#1"]
    assert Metrics().upstream(0) == "0"  # no list (tests of one part): the index
    assert Metrics(upstreams=["http://a:1"]).upstream(0) == "a:1"
