"""A sidecar with no [warmup] or [[routes]] in front of servers with no /health and no /v1 (issue 12 items 5, 6).

What a new user sees, end to end over loopback:
- the sim pod with `--health-path "" --api-prefix ""` (serves /models, /embeddings,
  /chat/completions): the health path is discovered (/models, the last candidate),
  /embeddings (no route names it) is costed as an embeddings request by its body,
  and /admin/stats says which paths were unmatched and what they were costed as;
- a server still loading (every path it serves answers 503): a request is rejected
  not_ready with what the sidecar tried and what answered. The sim pod's /models
  answers 200 while it loads, so tests/integration/standin.py stands in here.
"""

from __future__ import annotations

import time

import httpx
import pytest

from proxy.testing.stack import sidecar, sim_pod, wait_ok
from tests.integration.standin import StandIn

pytestmark = pytest.mark.integration


def test_no_health_no_v1_sim_pod_is_found_and_costed_by_shape():
    with sim_pod("--health-path", "", "--api-prefix", "", speed=20.0) as pod, sidecar(pod.url()) as proxy:
        data, admin = proxy.url("data"), proxy.url("admin")
        readyz = httpx.get(admin + "/readyz").text
        assert "health /models (discovered after /health 404, /healthz 404" in readyz, readyz
        for _ in range(3):
            resp = httpx.post(data + "/embeddings", json={"input": "x" * 400}, timeout=5)
            assert resp.status_code == 200, resp.text
        resp = httpx.post(
            data + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        )
        assert resp.status_code == 200
        stats = httpx.get(admin + "/admin/stats").json()
        paths = {p["path"]: p for p in stats["routes"]["paths"]}
        assert paths["/embeddings"]["costed_as"] == "/v1/embeddings" and paths["/embeddings"]["requests"] >= 3
        assert paths["/chat/completions"]["costed_as"] == "/v1/chat/completions"
        assert stats["routes"]["by_source"]["shape"] >= 4
        # The embeddings route's model learned from /embeddings traffic.
        assert stats["admission"]["models"]["/v1/embeddings"]["samples"] >= 3


def test_a_loading_server_is_rejected_not_ready_with_what_was_tried():
    with StandIn(prefix="", health_path=None, loading_s=3600) as server, sidecar(server.url, ready=False) as proxy:
        data, admin = proxy.url("data"), proxy.url("admin")
        deadline = time.monotonic() + 10
        while True:  # the first health round must have run
            resp = httpx.post(data + "/embeddings", json={"input": "hello world"}, timeout=5)
            assert resp.status_code == 503 and resp.headers["x-rampmeter-reason"] == "not_ready"
            message = resp.json()["error"]["message"]
            if "tried" in message or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        tried = "health: tried /health 404, /healthz 404, /v2/health/ready 404, /ping 404, /v1/models 404, /models 503"
        assert tried in message
        assert tried in httpx.get(admin + "/readyz").text
        server.ready_at = time.monotonic()  # loaded
        wait_ok(admin + "/readyz", timeout_s=20)
        assert httpx.post(data + "/embeddings", json={"input": "x"}, timeout=5).status_code == 200
