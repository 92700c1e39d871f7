"""The generator against real nginx: keep-alive and GOAWAY churn cost no requests, HTTP/1.1 and h2c."""

from __future__ import annotations

import socket
import subprocess
import time
from collections import Counter

import pytest

from proxy import loadtest as lt
from proxy.loadtest.records import OK, TIMEOUT
from tests.conftest import free_port, require_binary

pytestmark = pytest.mark.integration

CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  keepalive_requests 100;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  server {{ listen 127.0.0.1:{h1}; location / {{ default_type application/json; return 200 '{{"ok":true}}'; }} }}
  server {{ listen 127.0.0.1:{h2} http2; location / {{ default_type application/json; return 200 '{{"ok":true}}'; }} }}
}}
"""


@pytest.fixture(scope="module")
def nginx(tmp_path_factory):
    binary = require_binary("nginx")
    d = tmp_path_factory.mktemp("nginx")
    h1, h2 = free_port(), free_port()
    (d / "nginx.conf").write_text(CONF.format(dir=d, h1=h1, h2=h2))
    proc = subprocess.Popen([binary, "-c", str(d / "nginx.conf"), "-p", str(d)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                for port in (h1, h2):
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield {"http1": f"http://127.0.0.1:{h1}", "h2c": f"http://127.0.0.1:{h2}"}
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("protocol", ["http1", "h2c"])
def test_connection_churn_loses_no_request(nginx, protocol):
    # nginx closes a connection (h1) or sends GOAWAY (h2c) every 100 requests.
    trace = lt.build_trace(lt.Plan.sweep([300], step_s=2, warmup_s=0.5), lt.Mix.parse("tiny"), seed=3)
    result = lt.run_sync(trace, lt.Target(nginx[protocol], protocol=protocol, timeout_s=10))
    rec = result.runs[0].records
    assert len(rec) > 400
    assert set(zip(rec.status, rec.error, strict=True)) == {
        (200, 0)
    }  # (status, error kind) pairs: shows a failure's kind
    assert result.transport["connections_opened"] >= len(rec) // 100


def test_goaway_churn_at_a_thousand_a_second_loses_no_request(nginx):
    # Many streams in flight when a GOAWAY lands: every sender that lost one moves to the same
    # new connection, more than nginx's 100 requests per connection, and the excess is refused
    # again. A single resend lost ~4% of rows here; unprocessed streams are resent until taken.
    trace = lt.build_trace(lt.Plan.sweep([1000], step_s=2, warmup_s=0.5), lt.Mix.parse("tiny"), seed=3)
    result = lt.run_sync(trace, lt.Target(nginx["h2c"], protocol="h2c", timeout_s=10))
    rec = result.runs[0].records
    assert len(rec) > 1800
    # What this checks is GOAWAY handling: no row lost to a refused stream. On a busy CI machine
    # a Python generator at 1,000 req/s can fall behind into its 10 s timeout; that is not this test's
    # subject, so timeouts are tolerated (and shown) as long as they stay rare.
    kinds = Counter(zip(rec.status, rec.error, strict=True))
    assert set(kinds) <= {(200, OK), (0, TIMEOUT)} and kinds[(0, TIMEOUT)] < len(rec) // 20, kinds
    assert result.transport["connections_opened"] >= 18
