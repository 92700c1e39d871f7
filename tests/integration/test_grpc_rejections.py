"""What a grpcio client sees of each sidecar rejection (issue 17): the right StatusCode, the reason,
and grpc-retry-pushback-ms honoured by a gRPC retry policy.

Sidecars in front of real grpcio servers on 127.0.0.1:
- `tight`: one upstream slot, a queue of one, a tenant quota of one call, and a
  5 s service-time prior on /test.Echo/Big (so a 1 s deadline is unmeetable);
- `cold`: its upstream's gRPC health says NOT_SERVING, so it is not ready;
- `gone`: ready by an HTTP health URL on another port, but nothing listens on
  the gRPC port (502 upstream_unavailable);
- one whose upstream timeout_s is 0.5 s (504 upstream_timeout);
- two overloaded ones (a slot and a queue held), whose pushbacks a 10 ms-backoff retry
  policy must wait: the class queue's bound and the shedder's queue_length rule.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest

from proxy.testing import grpc_servicer as gs
from proxy.testing.stack import sidecar
from tests.conftest import free_port

TIGHT = """
[warmup]
health_check = "grpc"
health_interval_s = 0.2

[slow_start]
window_s = 0

[limits]
kind = "fixed"
initial_limit = 1
min_limit = 1
max_limit = 1

[classes.interactive]
max_queue_length = 1

[shedding]
rules = []  # the queue's own bound only: what one test queues must not shed the next test's call

[tenants]
enabled = true
trust_x_tenant = true
rate_per_s = 0.01
burst = 1

[[routes]]
path_prefix = "/test.Echo/Big"
kind = "fixed"
base_ms = 5000.0

[[routes]]
path_prefix = "/"
kind = "fixed"
"""


def write(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


def address(car) -> str:
    return car.url("data").removeprefix("http://")


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    tmp = Path(tmp_path_factory.mktemp("tight"))
    with gs.serve() as echo, sidecar(echo.url, policy=write(tmp, "p.toml", TIGHT), protocol="h2c") as car:
        ch = gs.channel(address(car))
        yield echo, car, ch
        ch.close()


def failure(fn, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, **kwargs)
    return info.value


def trailing(err: grpc.RpcError) -> dict[str, str]:
    return {m.key: m.value for m in err.trailing_metadata() or ()}


def tenant(name: str) -> tuple[tuple[str, str], ...]:
    return (("x-tenant", name),)


def test_overload_is_unavailable_with_a_pushback(tight) -> None:
    echo, car, ch = tight
    sleep = gs.method(ch, "Sleep")
    results: list = []

    def hold(i: int) -> None:  # one call holds the slot, the next one waits in the queue of one
        results.append(sleep(b"800", timeout=10, metadata=tenant(f"hold-{i}")))

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(2)]
    before = echo.servicer.calls
    threads[0].start()
    assert _eventually(lambda: echo.servicer.calls > before), "the first call holds the slot"
    threads[1].start()
    assert _eventually(lambda: queued(car) >= 1), "the second call waits in the queue"
    err = failure(sleep, b"800", timeout=10, metadata=tenant("third"))
    for t in threads:
        t.join()
    assert err.code() is grpc.StatusCode.UNAVAILABLE
    md = trailing(err)
    assert md["x-rampmeter-reason"] == "class_queue_full"  # the class's max_queue_length (rules = [])
    assert int(md["grpc-retry-pushback-ms"]) >= 100  # shedding.retry_after_min_ms
    assert err.details().startswith("rampmeter " + md["x-rampmeter-reason"])
    assert results == [b"slept", b"slept"]


def test_a_tenant_over_its_quota_is_resource_exhausted(tight) -> None:
    _, _, ch = tight
    unary = gs.method(ch, "Unary")
    assert unary(b"first", timeout=10, metadata=tenant("quota")) == b"first"
    err = failure(unary, b"second", timeout=10, metadata=tenant("quota"))
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    md = trailing(err)
    # the bucket refills in 100 s (rate_per_s 0.01), after this call's 10 s deadline: do not retry
    assert md["x-rampmeter-reason"] == "tenant_quota" and md["grpc-retry-pushback-ms"] == "-1"
    err = failure(unary, b"third", metadata=tenant("quota"))  # no deadline: the refill time is the pushback
    md = trailing(err)
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and int(md["grpc-retry-pushback-ms"]) > 10_000


def test_an_unmeetable_deadline_is_deadline_exceeded_at_once(tight) -> None:
    echo, _, ch = tight
    calls = echo.servicer.calls
    started = time.monotonic()
    err = failure(gs.method(ch, "Big"), b"10", timeout=1.0, metadata=tenant("deadline"))
    assert time.monotonic() - started < 0.9, "answered before the client's own deadline"
    assert err.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert trailing(err)["x-rampmeter-reason"] == "deadline_unmeetable"
    assert echo.servicer.calls == calls, "never sent upstream"


def test_a_malformed_header_is_invalid_argument(tight) -> None:
    _, _, ch = tight
    err = failure(gs.method(ch, "Unary"), b"x", timeout=10, metadata=(("x-cost-hint", "lots"),))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert trailing(err)["x-rampmeter-reason"] == "bad_request" and "x-cost-hint" in err.details()


COLD = """
[warmup]
health_check = "grpc"
health_interval_s = 0.2

[readiness]
retry_after_ms = 400
"""

RETRYING = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": gs.SERVICE}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.01s",
                    "maxBackoff": "0.01s",
                    "backoffMultiplier": 1,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


def summed(car, name: str, label: str = "") -> float:
    """`name`'s samples on the sidecar's /metrics, summed over those whose labels include `label`."""
    text = httpx.get(car.url("admin") + "/metrics", timeout=5).text
    return sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*{label}[^}}]*}} (\S+)$", text, re.M))


def rejections(car, reason: str) -> float:
    return summed(car, "rampmeter_rejections_total", f'reason="{reason}"')


def queued(car) -> float:
    """Requests waiting for admission, all classes (rampmeter_queue_depth, read at scrape)."""
    return summed(car, "rampmeter_queue_depth")


def test_not_ready_is_unavailable_and_a_retry_policy_waits_the_pushback(tmp_path) -> None:
    with (
        gs.serve(serving=False) as echo,
        sidecar(echo.url, policy=write(tmp_path, "p.toml", COLD), protocol="h2c", ready=False) as car,
    ):
        plain = gs.channel(address(car))
        err = failure(gs.method(plain, "Unary"), b"x", timeout=10)
        assert err.code() is grpc.StatusCode.UNAVAILABLE
        assert trailing(err)["x-rampmeter-reason"] == "not_ready"
        assert trailing(err)["grpc-retry-pushback-ms"] == "400"
        plain.close()

        before = rejections(car, "not_ready")
        retrying = grpc.insecure_channel(
            address(car), options=[("grpc.enable_retries", 1), ("grpc.service_config", RETRYING)]
        )
        started = time.monotonic()
        err = failure(gs.method(retrying, "Unary"), b"x", timeout=10)
        elapsed = time.monotonic() - started
        retrying.close()
        assert err.code() is grpc.StatusCode.UNAVAILABLE
        assert rejections(car, "not_ready") - before == 3, "three attempts reached the sidecar"
        # two waits of the 400 ms pushback, not of the policy's own 10 ms backoff
        assert elapsed >= 0.75, f"the retries came after {elapsed:.3f}s: the pushback was not honoured"


class _Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_an_upstream_that_is_gone_is_unavailable(tmp_path) -> None:
    health = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=health.serve_forever, daemon=True).start()
    text = f'[warmup]\nhealth_path = "/ready"\nhealth_port = {health.server_address[1]}\nhealth_interval_s = 0.2\n'
    try:
        with sidecar(f"http://127.0.0.1:{free_port()}", policy=write(tmp_path, "p.toml", text), protocol="h2c") as car:
            ch = gs.channel(address(car))
            err = failure(gs.method(ch, "Unary"), b"x", timeout=10)
            ch.close()
        assert err.code() is grpc.StatusCode.UNAVAILABLE
        assert trailing(err)["x-rampmeter-reason"] == "upstream_unavailable"
        assert "grpc-retry-pushback-ms" not in trailing(err), "whether to retry is the client's policy"
    finally:
        health.shutdown()
        health.server_close()


def test_a_draining_replica_is_unavailable_with_a_pushback(tmp_path) -> None:
    """POST /admin/drain refuses new calls before the request path: gRPC callers still get a gRPC status."""
    with gs.serve() as echo, sidecar(echo.url, policy=write(tmp_path, "p.toml", TIGHT), protocol="h2c") as car:
        ch = gs.channel(address(car))
        assert gs.method(ch, "Unary")(b"x", timeout=10)  # served before the drain
        drained = httpx.post(car.url("admin") + "/admin/drain?timeout_s=5", timeout=10)
        assert drained.status_code == 200, drained.text
        err = failure(gs.method(ch, "Unary"), b"x", timeout=10)
        ch.close()
    assert err.code() is grpc.StatusCode.UNAVAILABLE
    assert trailing(err)["x-rampmeter-reason"] == "draining"
    assert int(trailing(err)["grpc-retry-pushback-ms"]) > 0


def test_a_deadline_that_passes_in_the_queue_is_deadline_exceeded(tight) -> None:
    """deadline_expired: admitted to the queue (meetable when it came), its budget ran out while the slot
    was held. The budget is x-request-timeout-ms metadata, shorter than the client's own 10 s deadline, so
    it is the sidecar's answer the client reads, not its own timer's."""
    echo, _, ch = tight
    sleep, unary = gs.method(ch, "Sleep"), gs.method(ch, "Unary")
    holder = threading.Thread(target=lambda: sleep(b"1500", timeout=10, metadata=tenant("expiry-hold")))
    before = echo.servicer.calls
    holder.start()
    assert _eventually(lambda: echo.servicer.calls > before), "the holder has the one slot"
    calls = echo.servicer.calls
    started = time.monotonic()
    err = failure(unary, b"x", timeout=10, metadata=(*tenant("expiry"), ("x-request-timeout-ms", "500")))
    waited = time.monotonic() - started
    holder.join()
    assert err.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert trailing(err)["x-rampmeter-reason"] == "deadline_expired"
    assert trailing(err)["grpc-retry-pushback-ms"] == "-1"
    assert waited >= 0.4, waited  # it waited in the queue for its 500 ms budget
    assert echo.servicer.calls == calls, "the expired call never reached the servicer"


def test_an_upstream_past_its_timeout_s_is_deadline_exceeded_and_cancelled(tmp_path) -> None:
    """upstream_timeout (504 for HTTP): the upstream's timeout_s passed; the upstream call is reset."""
    with gs.serve() as echo:
        text = f'{TIGHT}\n[[upstreams]]\nurl = "{echo.url}"\nprotocol = "h2c"\ntimeout_s = 0.5\n'
        with sidecar(echo.url, policy=write(tmp_path, "p.toml", text), protocol="h2c") as car:
            ch = gs.channel(address(car))
            before = echo.servicer.cancelled
            started = time.monotonic()
            err = failure(gs.method(ch, "Sleep"), b"3000", timeout=10, metadata=tenant("slow"))
            waited = time.monotonic() - started
            ch.close()
            assert _eventually(lambda: echo.servicer.cancelled > before), "the upstream call was cancelled"
    assert err.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert trailing(err)["x-rampmeter-reason"] == "upstream_timeout"
    assert "grpc-retry-pushback-ms" not in trailing(err), "whether to retry is the client's policy"
    assert 0.4 <= waited < 2.5, waited


# Overload with every pushback in [500, 600] ms: a retry policy whose own backoff is 10 ms that still takes
# 1 s or more for three attempts waited the sidecar's pushback. Two overload answers: the class queue's
# bound (class_queue_full) and the shedder's queue_length rule (queue_full), each with its policy.
OVERLOADED = """
[warmup]
health_check = "grpc"
health_interval_s = 0.2

[slow_start]
window_s = 0

[limits]
kind = "fixed"
initial_limit = 1
min_limit = 1
max_limit = 1

[tenants]
enabled = false

[classes.interactive]
max_queue_length = {queue}

[shedding]
rules = {rules}
max_queued_requests = 1
retry_after_min_ms = 500
retry_after_max_ms = 600
"""


@pytest.mark.parametrize(
    ("reason", "queue", "rules"), [("class_queue_full", 1, "[]"), ("queue_full", 64, '["queue_length"]')]
)
def test_an_overload_pushback_is_honoured_by_a_retry_policy(tmp_path, reason, queue, rules) -> None:
    text = OVERLOADED.format(queue=queue, rules=rules)
    with gs.serve() as echo, sidecar(echo.url, policy=write(tmp_path, "p.toml", text), protocol="h2c") as car:
        plain = gs.channel(address(car))
        sleep = gs.method(plain, "Sleep")
        holders = [threading.Thread(target=lambda: sleep(b"5000", timeout=15)) for _ in range(2)]
        holders[0].start()  # one holds the slot, one waits in the queue: the next call is refused
        assert _eventually(lambda: echo.servicer.calls >= 1), "the first holder reached the servicer"
        holders[1].start()
        assert _eventually(lambda: queued(car) >= 1), "the second holder waits in the queue"
        before = rejections(car, reason)
        retrying = grpc.insecure_channel(
            address(car), options=[("grpc.enable_retries", 1), ("grpc.service_config", RETRYING)]
        )
        started = time.monotonic()
        err = failure(gs.method(retrying, "Unary"), b"x", timeout=20)
        elapsed = time.monotonic() - started
        retrying.close()
        attempts = rejections(car, reason) - before
        for t in holders:
            t.join()
        plain.close()
    assert err.code() is grpc.StatusCode.UNAVAILABLE
    assert trailing(err)["x-rampmeter-reason"] == reason
    assert 500 <= int(trailing(err)["grpc-retry-pushback-ms"]) <= 600
    assert attempts == 3, "three attempts reached the sidecar"
    # two waits of at least 500 ms, not of the policy's own 10 ms backoff
    assert elapsed >= 0.95, f"the retries came after {elapsed:.3f}s: the pushback was not honoured"


def _eventually(check, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()
