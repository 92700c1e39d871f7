"""A sidecar with no [warmup] or [[routes]] in front of a server with no /health and no /v1 (issue 12 items 5, 6).

Stands in for the sim pod's no-health / no-prefix profile (admission-real) with
tests/integration/standin.py. What a new user sees, end to end over loopback:
while the server loads, a request is rejected not_ready with what the sidecar
tried and what answered; the health path is discovered (/models, the last
candidate); /embeddings (no route names it) is costed as an embeddings request
by its body, and /admin/stats says which paths were unmatched.
"""

from __future__ import annotations

import time

import httpx
import pytest

from proxy.testing.stack import sidecar, wait_ok
from tests.integration.standin import StandIn

pytestmark = pytest.mark.integration


def test_no_health_no_v1_server_is_found_and_costed_by_shape():
    with StandIn(prefix="", health_path=None, loading_s=3600) as server, sidecar(server.url, ready=False) as proxy:
        data, admin = proxy.url("data"), proxy.url("admin")
        # While it loads: not_ready, and the answer says what was tried (once the first round is done).
        deadline = time.monotonic() + 10
        while True:
            resp = httpx.post(data + "/embeddings", json={"input": "hello world"}, timeout=5)
            assert resp.status_code == 503 and resp.headers["x-rampmeter-reason"] == "not_ready"
            message = resp.json()["error"]["message"]
            if "tried" in message or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        tried = "health: tried /health 404, /healthz 404, /v2/health/ready 404, /ping 404, /v1/models 404, /models 503"
        assert tried in message
        server.ready_at = time.monotonic()

        wait_ok(admin + "/readyz", timeout_s=20)
        readyz = httpx.get(admin + "/readyz").text
        assert "health /models (discovered after /health 404, /healthz 404" in readyz, readyz

        for _ in range(3):
            resp = httpx.post(data + "/embeddings", json={"input": "x" * 400}, timeout=5)
            assert resp.status_code == 200, resp.text
        resp = httpx.post(data + "/chat/completions", json={"messages": [{"content": "hi"}], "max_tokens": 2})
        assert resp.status_code == 200

        stats = httpx.get(admin + "/admin/stats").json()
        paths = {p["path"]: p for p in stats["routes"]["paths"]}
        assert paths["/embeddings"]["costed_as"] == "/v1/embeddings" and paths["/embeddings"]["requests"] >= 3
        assert paths["/chat/completions"]["costed_as"] == "/v1/chat/completions"
        # The embeddings route's model learned from /embeddings traffic.
        assert stats["admission"]["models"]["/v1/embeddings"]["samples"] >= 3
