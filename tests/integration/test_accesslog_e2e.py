"""Request ids, x-rampmeter-class and the access line on a real sidecar, over HTTP/1.1 and h2c."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from proxy.testing.stack import sidecar, sim_pod

pytestmark = pytest.mark.integration

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def access_lines(proc) -> list[dict]:
    proc.log()  # flushes
    return [json.loads(line) for line in proc.log_path.read_text().splitlines() if '"rampmeter.access"' in line]


def test_every_answer_names_its_request_and_class_and_gets_one_line_with_the_same_id(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text("[access_log]\nenabled = true\n")
    with sim_pod(speed=20.0) as pod, sidecar(pod.url(), "--log-format", "json", policy=str(path)) as proc:
        url = proc.url() + "/v1/chat/completions"
        h1 = httpx.post(url, json=BODY, headers={"x-request-id": "e2e-h1", "x-priority": "batch"}, timeout=10)
        with httpx.Client(http2=True, http1=False, timeout=10) as client:
            h2 = client.post(url, json=BODY)
            refused = client.post(url, json={**BODY, "max_tokens": 4000}, headers={"x-request-timeout-ms": "20"})
        assert (h1.status_code, h1.headers["x-request-id"], h1.headers["x-rampmeter-class"]) == (200, "e2e-h1", "batch")
        assert h2.http_version == "HTTP/2" and re.fullmatch(r"[0-9a-f]{32}", h2.headers["x-request-id"])
        assert h2.headers["x-rampmeter-class"] == "interactive"
        assert refused.status_code == 503
        assert refused.json()["error"]["request_id"] == refused.headers["x-request-id"]
        lines = {line["request_id"]: line for line in access_lines(proc)}
        assert set(lines) == {"e2e-h1", h2.headers["x-request-id"], refused.headers["x-request-id"]}
        assert (lines["e2e-h1"]["protocol"], lines["e2e-h1"]["status"]) == ("HTTP/1.1", 200)
        assert (lines[h2.headers["x-request-id"]]["protocol"], lines[h2.headers["x-request-id"]]["class"]) == (
            "HTTP/2",
            "interactive",
        )
        assert lines[refused.headers["x-request-id"]]["reason"] == "deadline_unmeetable"
        assert lines["e2e-h1"]["bytes_out"] == len(h1.content) and lines["e2e-h1"]["upstream"] == pod.addresses["data"]
