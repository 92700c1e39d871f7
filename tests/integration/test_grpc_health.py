"""Readiness for gRPC upstreams (issue 17): grpc.health.v1 SERVING flips /readyz, and an HTTP health
URL on another port of the upstream's host (Triton: /v2/health/ready on 8000, gRPC on 8001)."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

import httpx

from proxy.runtime.probes import health_base
from proxy.testing import grpc_servicer as gs
from proxy.testing.stack import sidecar, wait_ok


def policy(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(text + "\n[slow_start]\nwindow_s = 0\n")
    return str(path)


def readyz(car) -> httpx.Response:
    return httpx.get(car.url("admin") + "/readyz", timeout=5)


def test_grpc_health_serving_flips_readyz(tmp_path) -> None:
    text = '[warmup]\nhealth_check = "grpc"\ngrpc_health_service = "test.Echo"\nhealth_interval_s = 0.1\n'
    with (
        gs.serve(serving=False) as echo,
        sidecar(echo.url, policy=policy(tmp_path, text), protocol="h2c", ready=False) as car,
    ):
        deadline = time.monotonic() + 10
        while "NOT_SERVING" not in readyz(car).text and time.monotonic() < deadline:
            time.sleep(0.05)
        answer = readyz(car)
        assert answer.status_code == 503 and "grpc health test.Echo: NOT_SERVING" in answer.text
        echo.set_serving("test.Echo")
        wait_ok(car.url("admin") + "/readyz", timeout_s=10)
        assert "grpc.health.v1 test.Echo" in readyz(car).text
        echo.set_serving("test.Echo", serving=False)  # and back: the next checks take it out
        deadline = time.monotonic() + 10
        while readyz(car).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert readyz(car).status_code == 503


def test_an_unknown_service_name_is_not_ready_and_says_why(tmp_path) -> None:
    text = '[warmup]\nhealth_check = "grpc"\ngrpc_health_service = "no.Such"\nhealth_interval_s = 0.1\n'
    with gs.serve() as echo, sidecar(echo.url, policy=policy(tmp_path, text), protocol="h2c", ready=False) as car:
        deadline = time.monotonic() + 10
        while "NOT_FOUND" not in readyz(car).text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert readyz(car).status_code == 503 and "grpc-status 5 NOT_FOUND" in readyz(car).text


class _Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path == "/v2/health/ready"
        self.send_response(200 if ok else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_an_http_health_url_on_another_port_makes_a_grpc_upstream_ready(tmp_path) -> None:
    health = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=health.serve_forever, daemon=True).start()
    try:
        port = health.server_address[1]
        text = f'[warmup]\nhealth_path = "/v2/health/ready"\nhealth_port = {port}\nhealth_interval_s = 0.1\n'
        with gs.serve() as echo, sidecar(echo.url, policy=policy(tmp_path, text), protocol="h2c") as car:
            assert readyz(car).status_code == 200
            via = gs.channel(car.url("data").removeprefix("http://"))
            assert gs.method(via, "Unary")(b"ready", timeout=10) == b"ready"
            via.close()
    finally:
        health.shutdown()
        health.server_close()


def test_health_base_swaps_only_the_port() -> None:
    assert health_base("http://10.0.0.5:8001", 8000) == "http://10.0.0.5:8000"
    assert health_base("http://[::1]:8001", 8000) == "http://[::1]:8000"
    assert health_base("http://10.0.0.5:8001", 0) == "http://10.0.0.5:8001"


def test_warm_up_probes_can_be_grpc_calls(tmp_path) -> None:
    text = (
        '[warmup]\nhealth_check = "grpc"\nhealth_interval_s = 0.1\nsuccess = "count"\nmin_successes = 2\n'
        '[[warmup.probes]]\ngrpc = true\npath = "/test.Echo/Unary"\nbody = "warm"\ncount = 2\n'
    )
    with gs.serve() as echo, sidecar(echo.url, policy=policy(tmp_path, text), protocol="h2c") as car:
        assert readyz(car).status_code == 200
        assert echo.servicer.calls == 2, "the two probes were unary gRPC calls, framed by the sidecar"


def test_a_failing_grpc_probe_keeps_the_upstream_out_of_service(tmp_path) -> None:
    text = (
        '[warmup]\nhealth_check = "grpc"\nhealth_interval_s = 0.1\nsuccess = "count"\nretry_interval_s = 60\n'
        '[[warmup.probes]]\ngrpc = true\npath = "/test.Echo/Fail"\nbody = "x"\ncount = 1\n'
    )
    with gs.serve() as echo, sidecar(echo.url, policy=policy(tmp_path, text), protocol="h2c", ready=False) as car:
        deadline = time.monotonic() + 10
        while echo.servicer.calls == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the verdict is in: the one probe answered INVALID_ARGUMENT
        assert echo.servicer.calls == 1
        assert readyz(car).status_code == 503
