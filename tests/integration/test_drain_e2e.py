"""The pod's termination sequence under load, on real processes: how many requests are lost.

Kubernetes stops the pod of examples/kubernetes in this order: the model container's
preStop hook (POST /admin/drain), then SIGTERM to the model server, and only once it
has exited SIGTERM to the sidecar (a native sidecar). Here the sim pod is the model
server and 16 clients keep a queue standing in the sidecar (a fixed limit of 4). A
request is lost when it was taken in and not served: any answer but a 200, except a
503 `draining` (never run, retryable: the SDK sends it to another replica), or an
error on a connection that had been accepted. With the drain: none. Without it (the
sequence as it was), the requests queued in the sidecar when the model stops get 502.

The clients stop before the sidecar's SIGTERM: by then the endpoint has long left the
Service (the drain made /readyz 503 and closed every connection it answered). A client
still connecting to a process as it exits sees a reset from the kernel, whatever the
server; that is not what this counts.
"""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from proxy.testing.stack import sidecar, sim_pod

pytestmark = pytest.mark.integration

CLIENTS = 16
POLICY = """
[limits]
kind = "fixed"
initial_limit = 4
min_limit = 1
max_limit = 4

[slow_start]
window_s = 0.0

[gpu]
enabled = false

[access_log]
enabled = true
"""
BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12}


class Load:
    """CLIENTS threads posting back to back until stopped; every outcome counted."""

    def __init__(self, url: str) -> None:
        self.url = url + "/v1/chat/completions"
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.outcomes: dict[str, int] = {}
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _count(self, what: str) -> None:
        with self.lock:
            self.outcomes[what] = self.outcomes.get(what, 0) + 1

    def _client(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                try:
                    resp = client.post(self.url, json=BODY)
                except httpx.ConnectError:
                    self._count("connect_refused")  # never taken in
                    time.sleep(0.01)
                    continue
                except httpx.HTTPError as exc:
                    self._count(f"lost:{type(exc).__name__}")
                    continue
                if resp.status_code == 200:
                    self._count("served")
                elif resp.status_code == 503 and resp.headers.get("x-rampmeter-reason") == "draining":
                    self._count("draining")  # an endpoint that left the Service: the client goes elsewhere
                    time.sleep(0.01)
                else:
                    self._count(f"lost:{resp.status_code}:{resp.headers.get('x-rampmeter-reason')}")

    def lost(self) -> dict[str, int]:
        return {k: v for k, v in self.outcomes.items() if k.startswith("lost")}


def queue_standing(admin: str) -> bool:
    return httpx.get(admin + "/admin/stats", timeout=5).json()["admission"]["queued"] >= 4


def wait_until(predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_the_termination_sequence_with_the_drain_loses_nothing(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    with sim_pod(speed=2.0) as pod, sidecar(pod.url(), policy=str(path)) as proc:
        admin = proc.url("admin")
        with Load(proc.url()) as load:
            wait_until(lambda: queue_standing(admin))
            # 1. preStop: the drain call, while the clients keep sending.
            answers: list[httpx.Response] = []
            caller = threading.Thread(
                target=lambda: answers.append(httpx.post(admin + "/admin/drain?timeout_s=30", timeout=40))
            )
            caller.start()
            wait_until(lambda: httpx.get(admin + "/readyz", timeout=5).status_code == 503)
            assert httpx.get(admin + "/readyz", timeout=5).text.strip() == "draining"
            caller.join(40)
            (drained,) = answers
            result = drained.json()
            assert drained.status_code == 200 and result["drained"] is True, result
            assert result["in_flight_at_start"] >= 8  # the queue was standing: there was something to lose
            # 2. The kubelet stops the model server, while clients still send (and meet a draining sidecar).
            assert pod.stop() == 0
            time.sleep(0.3)
        # 3. By the time the model has exited the endpoint has left the Service: the clients' retries go
        # to other replicas (here: they stop). Then the kubelet SIGTERMs the sidecar.
        start = time.monotonic()
        proc.signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert time.monotonic() - start < 3  # nothing left to wait for
        assert load.lost() == {}, load.outcomes
        assert load.outcomes["served"] >= result["in_flight_at_start"] and load.outcomes["draining"] > 0
        assert result["refused_while_draining"] > 0
        assert "Traceback" not in proc.log()
        # One access line per answer: every 200 and every draining refusal the clients counted.
        lines = [line for line in proc.log_path.read_text().splitlines() if "rampmeter.access:" in line]
        assert sum(" status=200 " in line for line in lines) == load.outcomes["served"]
        assert sum(" reason=draining " in line for line in lines) == load.outcomes["draining"]


def test_without_the_drain_the_queued_requests_are_lost(tmp_path):
    """The sequence as it was (what the test above guards against): model first, then the sidecar."""
    path = tmp_path / "policy.toml"
    path.write_text(POLICY + "[listen]\ndrain_timeout_s = 2.0\n")  # what is still held is cut sooner
    with sim_pod(speed=2.0) as pod, sidecar(pod.url(), policy=str(path)) as proc:
        with Load(proc.url()) as load:
            wait_until(lambda: queue_standing(proc.url("admin")))
            pod.stop()
            time.sleep(0.5)
            proc.signal(signal.SIGTERM)
            proc.wait(20)
        assert sum(load.lost().values()) >= 4, load.outcomes
