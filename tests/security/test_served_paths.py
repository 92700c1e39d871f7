"""`/metrics` and every other path on the data port go to the model server, unless `listen.served_paths` says.

Decided (issue 13, "also seen"): forwarding every path stays the default, so nothing
changes for existing users; `[listen] served_paths = ["/v1/"]` turns on an allowlist
of path prefixes, and anything else is answered 404 by the sidecar without reaching
the model (the sim pod serves `/metrics` and `/sim/stats`, so a 200 there would mean
it was forwarded). Dot segments and encoded separators are refused too, on the raw
wire (httpx would normalise them away), and the list reloads live.
"""

from __future__ import annotations

import socket

import httpx
import pytest

from proxy.testing.stack import sim_pod
from tests.security.harness import CHAT, assert_clean_log
from tests.security.reload_helpers import BASE, served_from, wait_version, write_atomically

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pod():
    with sim_pod(speed=20.0) as proc:
        yield proc


def raw_get(proc, target: bytes) -> bytes:
    host, _, port = proc.addresses["data"].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"GET " + target + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        got = b""
        while chunk := sock.recv(65_536):
            got += chunk
    return got


def test_by_default_every_path_reaches_the_model_server(tmp_path, pod):
    path = tmp_path / "policy.toml"
    path.write_text(BASE)
    with served_from(pod, path) as proc:
        assert httpx.get(proc.url() + "/metrics", timeout=5).status_code == 200  # the pod's own metrics
        assert httpx.get(proc.url() + "/sim/stats", timeout=5).status_code == 200


def test_served_paths_answers_404_for_the_rest_and_reloads_live(tmp_path, pod):
    path = tmp_path / "policy.toml"
    path.write_text(BASE + '[listen]\nserved_paths = ["/v1/"]\n')
    with served_from(pod, path) as proc:
        url = proc.url()
        assert httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 200
        assert httpx.get(url + "/v1/models", timeout=5).status_code == 200
        for target in ("/metrics", "/sim/stats", "/health", "/v1"):
            resp = httpx.get(url + target, timeout=5)
            assert resp.status_code == 404, target
            assert resp.json()["error"]["code"] == "not_found"
        for target in (b"/v1/../metrics", b"/v1/%2e%2e/metrics", b"/v1/..%2fmetrics", b"/v1/./../sim/stats"):
            assert raw_get(proc, target).startswith(b"HTTP/1.1 404"), target
        with httpx.Client(http2=True, http1=False, timeout=5) as h2c:
            assert h2c.get(url + "/metrics").status_code == 404
            assert h2c.get(url + "/v1/models").status_code == 200
        stats = httpx.get(proc.url("admin") + "/admin/stats", timeout=5).json()
        assert stats["admission"]["counts"]["admitted"] == 3  # the 404s never reached admission

        write_atomically(path, BASE + '[listen]\nserved_paths = ["/v1/", "/metrics"]\n')
        wait_version(proc, 2)
        assert httpx.get(url + "/metrics", timeout=5).status_code == 200
        assert httpx.get(url + "/sim/stats", timeout=5).status_code == 404
        assert_clean_log(proc)
