"""Warm-up end to end: the sidecar and the simulated pod as real processes on loopback.

The pod starts cold (--cold-start-s: /health 503 while "loading weights") and
then runs its first COLD_REQUESTS requests up to 20x slower (the cold penalty,
decaying per executed request). The sidecar runs policies/warmup-example.toml,
rewritten only where a test says so (`policy_file`). Assertions use the pod's
honest counters (/sim/stats: what it executed, its cold multiplier) and the
sidecar's /readyz, /metrics and /admin/stats, never wall-clock durations; every
wait is bounded (`wait_for`).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import tomllib
from pathlib import Path
from typing import Self

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.testing.procs import Proc, wait_for
from tests.conftest import free_port

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "policies" / "warmup-example.toml"
COLD_REQUESTS = 10
CONCURRENCY = tomllib.loads(EXAMPLE.read_text())["warmup"]["concurrency"]  # probes in flight
POD_FLAGS = [
    "--profile",
    "llm",
    "--speed",
    "4",
    "--cold-start-s",
    "1",
    "--cold-penalty",
    "20",
    "--cold-penalty-requests",
    str(COLD_REQUESTS),
]
CHAT = {"messages": [{"role": "user", "content": "hello " * 60}], "max_tokens": 16}
READY_TIMEOUT_S = 60  # cold start + a 20x-penalised warm-up on a busy shared machine


# --- processes and policies -----------------------------------------------------------


def start_pod(port: int) -> Proc:
    return Proc(["sim-pod", "--listen", f"127.0.0.1:{port}", *POD_FLAGS], name="sim-pod")


def policy_text(pod_url: str, *edits: tuple[str, str]) -> str:
    """The example policy aimed at `pod_url`, listeners on free loopback ports, with `edits`
    (old, new) applied; each `old` must occur exactly once, so a drifted example fails loudly."""
    text = EXAMPLE.read_text()
    for old, new in (('url = "http://127.0.0.1:8000"', f'url = "{pod_url}"'), *edits):
        assert text.count(old) == 1, f"{old!r} is not in {EXAMPLE.name} exactly once"
        text = text.replace(old, new)
    return '[listen]\naddress = "127.0.0.1:0"\n[admin]\naddress = "127.0.0.1:0"\n\n' + text


def policy_file(tmp_path: Path, pod_url: str, *edits: tuple[str, str]) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(policy_text(pod_url, *edits))
    return path


def start_sidecar(policy: Path) -> Proc:
    return Proc(["serve", "--policy", str(policy)], name="sidecar")


# --- observations ------------------------------------------------------------------------


def readyz(car: Proc) -> httpx.Response:
    return httpx.get(car.url("admin") + "/readyz", timeout=5)


def wait_ready(car: Proc) -> None:
    wait_for(lambda: readyz(car).status_code == 200, timeout_s=READY_TIMEOUT_S, interval_s=0.02)


def metric(car: Proc, name: str, **labels: str) -> float:
    text = httpx.get(car.url("admin") + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(f"{name} {labels} not exported")


def metric_total(car: Proc, name: str) -> float:
    """The sum of `name` over all its label values."""
    text = httpx.get(car.url("admin") + "/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def pod_stats(pod: Proc) -> dict:
    return httpx.get(pod.url() + "/sim/stats", timeout=5).json()


def settled_pod_stats(pod: Proc, timeout_s: float = 10.0) -> dict:
    """The pod's stats once nothing runs or waits in it: a warm-up probe sent just before /readyz
    turned 200 may still be running (it ends on its own; a loaded runner shows it)."""
    until = time.monotonic() + timeout_s
    stats = pod_stats(pod)
    while (stats["running"] or stats["waiting"]) and time.monotonic() < until:
        time.sleep(0.05)
        stats = pod_stats(pod)
    return stats


def lifecycle(car: Proc) -> dict:
    return httpx.get(car.url("admin") + "/admin/stats", timeout=5).json()["readiness"]["upstreams"][0]


def chat(car: Proc, **headers: str) -> httpx.Response:
    return httpx.post(car.url() + "/v1/chat/completions", json=CHAT, headers=headers, timeout=60)


def assert_not_ready_rejection(response: httpx.Response, retry_after_ms: int) -> None:
    assert response.status_code == 503
    assert response.headers["x-rampmeter-reason"] == "not_ready"
    assert response.headers["retry-after"] == str(-(-retry_after_ms // 1000))
    assert response.headers["x-rampmeter-retry-after-ms"] == str(retry_after_ms)
    assert response.json()["error"]["code"] == "not_ready"


# --- tests -------------------------------------------------------------------------------


def test_warmup_spends_the_cold_penalty_before_ready_and_rejects_until_then(tmp_path) -> None:
    with start_pod(free_port()) as pod, start_sidecar(policy_file(tmp_path, pod.url())) as car:
        early = readyz(car)
        assert early.status_code == 503 and ("upstream 0 cold" in early.text or "upstream 0 probing" in early.text)
        # before_warm = "reject": answered at once, never sent to the cold pod.
        assert_not_ready_rejection(chat(car), 2000)
        wait_ready(car)
        stats = settled_pod_stats(pod)
        # The probes, not users, paid the whole cold penalty: "stable" latencies only once it was spent.
        assert stats["cold_multiplier"] == 1.0
        assert stats["not_ready"] == 0  # nothing was forwarded while the pod was loading
        # Every probe the pod ran is in the sidecar's metric, but those still in flight when the
        # verdict came: cancelled by the sidecar, finished by the pod (at most concurrency - 1).
        counted = metric_total(car, "rampmeter_warmup_probes_total")  # every outcome
        assert 0 <= stats["requests_executed"] - counted <= CONCURRENCY - 1
        # The penalty, then stable probes: 3 per shape (16 in all) on a quiet machine; the verdict
        # judges measured latencies, which a loaded machine blurs (CI saw it after 15). Asked here:
        # the penalty, and one stable three after it.
        assert metric(car, "rampmeter_warmup_probes_total", outcome="ok") >= COLD_REQUESTS + 3
        info = lifecycle(car)
        assert info["lifecycle"]["state"] in ("ramping", "warm") and info["lifecycle"]["warmups"] == 1
        assert [s["met"] for s in info["probes"]] == [True, True]
        # The slow-start limit is open as soon as /readyz says 200 (not a signal tick later):
        # the first user request is admitted without queueing.
        assert metric(car, "rampmeter_admission_limit") >= 1
        first = chat(car)
        assert first.status_code == 200 and first.headers["x-rampmeter-queue-ms"] == "0"
        assert pod_stats(pod)["requests_completed"] == stats["requests_completed"] + 1


def test_slow_start_ramps_the_admission_limit_after_warm(tmp_path) -> None:
    edits = [("window_s = 10.0", "window_s = 3.0")]
    with start_pod(free_port()) as pod, start_sidecar(policy_file(tmp_path, pod.url(), *edits)) as car:
        wait_ready(car)
        factors: list[float] = []
        limits: list[float] = []

        def sample() -> bool:
            factors.append(metric(car, "rampmeter_slow_start_factor"))
            limits.append(metric(car, "rampmeter_admission_limit"))
            return factors[-1] == 1.0 and metric(car, "rampmeter_upstream_state", state="warm") == 1

        wait_for(sample, timeout_s=30, interval_s=0.1)
        stats = httpx.get(car.url("admin") + "/admin/stats", timeout=5).json()
        full = stats["admission"]["limit_total"]
        assert factors[0] < 1.0 and factors[0] >= 0.25  # min_weight
        assert factors == sorted(factors) and limits == sorted(limits)
        assert len({f for f in factors if 0 < f < 1}) >= 2  # ramped in steps, not switched on
        assert limits[0] < full and limits[-1] == full


def test_before_warm_hold_serves_within_the_deadline(tmp_path) -> None:
    edits = [('before_warm = "reject"', 'before_warm = "hold"')]
    with start_pod(free_port()) as pod, start_sidecar(policy_file(tmp_path, pod.url(), *edits)) as car:
        assert readyz(car).status_code == 503
        held: dict[str, httpx.Response] = {}
        sender = threading.Thread(target=lambda: held.setdefault("r", chat(car, **{"x-request-timeout-ms": "60000"})))
        sender.start()
        # A budget that runs out while the model still warms: rejected when it does.
        short = chat(car, **{"x-request-timeout-ms": "300"})
        sender.join(READY_TIMEOUT_S)
        assert not sender.is_alive()
        assert held["r"].status_code == 200 and held["r"].json()["usage"]["completion_tokens"] == 16
        # Held past its own deadline (before max_hold_ms): the wire contract's 504 deadline_expired.
        assert short.status_code == 504 and short.headers["x-rampmeter-reason"] == "deadline_expired"
        assert "x-rampmeter-queue-ms" in held["r"].headers  # went through admission, once ready
        # The pod saw the probes and the held request, never the rejected one, nothing while loading.
        stats = pod_stats(pod)
        probes_ok = metric(car, "rampmeter_warmup_probes_total", outcome="ok")
        assert stats["not_ready"] == 0 and stats["cold_multiplier"] == 1.0
        assert stats["requests_submitted"] - probes_ok - 1 in (0, 1)  # + a probe cancelled at the verdict


def test_pod_restart_mid_run_goes_back_through_warmup(tmp_path) -> None:
    port = free_port()
    # Thresholds high enough that only the changed instance_id can reveal the restart.
    edits = [("unhealthy_after = 3", "unhealthy_after = 1000"), ("failure_streak = 5", "failure_streak = 100000")]
    pod = start_pod(port)
    try:
        with start_sidecar(policy_file(tmp_path, pod.url(), *edits)) as car:
            wait_ready(car)
            first_id = pod_stats(pod)["instance_id"]
            with Traffic(car) as traffic:
                wait_for(lambda: traffic.count(200) >= 5, timeout_s=30)
                assert pod.stop() == 0
                pod = start_pod(port)
                second_id = pod_stats(pod)["instance_id"]
                assert second_id != first_id
                wait_for(lambda: readyz(car).status_code == 503, timeout_s=30, interval_s=0.02)
                assert_not_ready_rejection(chat(car), 2000)
                wait_ready(car)
                ok_before = traffic.count(200)
                wait_for(lambda: traffic.count(200) >= ok_before + 5, timeout_s=30)
            assert metric(car, "rampmeter_upstream_losses_total", cause="restarted") == 1
            info = lifecycle(car)
            assert f"instance_id={second_id}" in info["lifecycle"]["identity"]
            assert info["lifecycle"]["warmups"] == 2 and info["lifecycle"]["losses"] == 1
            # The new process's penalty went to probes before users returned.
            assert pod_stats(pod)["cold_multiplier"] == 1.0
            # Mid-run answers: served; 502 while nothing listened; the new pod's own 503 while it
            # loaded (its /health says 503 too, so no identity yet, and the thresholds are high);
            # 503 not_ready from the restart's detection until warm again. Nothing else, no hang.
            assert set(traffic.answers) <= {"200", "502 upstream_unavailable", "503", "503 not_ready"}
            assert traffic.count("503 not_ready") >= 1
    finally:
        pod.stop()


def test_pod_down_then_back_with_example_thresholds(tmp_path) -> None:
    port = free_port()
    pod = start_pod(port)
    try:
        with start_sidecar(policy_file(tmp_path, pod.url())) as car:
            wait_ready(car)
            pod.stop()
            # unhealthy_after = 3 failed checks, 0.5 s apart: not ready, requests answered at once.
            wait_for(lambda: readyz(car).status_code == 503, timeout_s=30, interval_s=0.02)
            assert "upstream 0 unhealthy" in readyz(car).text
            assert_not_ready_rejection(chat(car), 2000)
            pod = start_pod(port)
            wait_ready(car)
            assert chat(car).status_code == 200
            assert metric(car, "rampmeter_upstream_losses_total", cause="health_lost") == 1
            info = lifecycle(car)["lifecycle"]
            assert info["warmups"] == 2 and info["losses"] == 1
            assert pod_stats(pod)["cold_multiplier"] == 1.0
    finally:
        pod.stop()


def test_configmap_symlink_swap_changes_the_warmup(tmp_path) -> None:
    """The kubelet's ConfigMap update: new ..<timestamp> dir, atomic rename of ..data, old dir removed."""
    port = free_port()
    pod = start_pod(port)
    v1_dir, v2_dir = tmp_path / "..2025_01_31_10_00_00.1", tmp_path / "..2025_01_31_10_05_00.2"
    v1_dir.mkdir()
    (v1_dir / "policy.toml").write_text(policy_text(pod.url()))
    os.symlink(v1_dir.name, tmp_path / "..data")
    os.symlink("..data/policy.toml", tmp_path / "policy.toml")
    # v2 adds a third shape: a long answer (64 decode steps), slow enough for "stable" to be meaningful.
    long_answer = (
        '\n[[warmup.probes]]\nname = "long-answer"\npath = "/v1/chat/completions"\n'
        'body = \'{"messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": 64}\'\ncount = 40\n'
    )
    try:
        with start_sidecar(tmp_path / "policy.toml") as car:
            wait_ready(car)
            assert len(lifecycle(car)["probes"]) == 2
            v2_dir.mkdir()
            v2 = policy_text(pod.url(), ("retry_after_ms = 2000", "retry_after_ms = 3000")) + long_answer
            (v2_dir / "policy.toml").write_text(v2)
            os.symlink(v2_dir.name, tmp_path / "..data_tmp")
            os.rename(tmp_path / "..data_tmp", tmp_path / "..data")
            shutil.rmtree(v1_dir)
            admin = car.url("admin") + "/admin/policy"
            wait_for(lambda: httpx.get(admin, timeout=5).json()["version"] == 2, timeout_s=20)
            names = [p["name"] for p in httpx.get(admin, timeout=5).json()["policy"]["warmup"]["probes"]]
            assert names == ["short-chat", "long-prompt", "long-answer"]
            assert metric(car, "rampmeter_policy_reloads_total", result="ok") == 1
            # The next warm-up (a restarted pod) runs the new probes; not_ready carries the new Retry-After.
            pod.stop()
            pod = start_pod(port)
            wait_for(lambda: readyz(car).status_code == 503, timeout_s=30, interval_s=0.02)
            assert_not_ready_rejection(chat(car), 3000)
            wait_ready(car)
            probes = lifecycle(car)["probes"]
            assert len(probes) == 3 and all(p["met"] for p in probes)
            assert metric(car, "rampmeter_warmup_probe_duration_seconds_count", shape="2") >= 3
            assert pod_stats(pod)["cold_multiplier"] == 1.0
    finally:
        pod.stop()


def test_reload_keeps_command_line_upstream_and_listeners(tmp_path) -> None:
    """`serve --policy FILE --upstream URL --listen ... --admin ...` (as docs/deployment.md runs the example):
    a reload takes the warm-up change and keeps what needs a restart, even when the file lists
    other (here: more) upstreams. It used to crash the sidecar (IndexError in the signals task)."""
    others = '[[upstreams]]\nurl = "http://127.0.0.1:9"\n[[upstreams]]\nurl = "http://127.0.0.1:10"\n'
    text = EXAMPLE.read_text().replace('[[upstreams]]\nurl = "http://127.0.0.1:8000"\n', others)
    (tmp_path / "v1.toml").write_text(text)
    (tmp_path / "v2.toml").write_text(text.replace("retry_after_ms = 2000", "retry_after_ms = 4000"))
    os.symlink("v1.toml", tmp_path / "policy.toml")
    with start_pod(free_port()) as pod:
        args = [
            "serve",
            "--policy",
            str(tmp_path / "policy.toml"),
            "--upstream",
            pod.url(),
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ]
        with Proc(args, name="sidecar") as car:
            wait_ready(car)
            os.symlink("v2.toml", tmp_path / "policy.tmp")
            os.rename(tmp_path / "policy.tmp", tmp_path / "policy.toml")
            admin = car.url("admin") + "/admin/policy"
            wait_for(lambda: httpx.get(admin, timeout=5).json()["version"] == 2, timeout_s=20)
            wait_for(lambda: metric(car, "rampmeter_policy_reloads_total", result="ok") == 1, timeout_s=5)
            in_force = httpx.get(admin, timeout=5).json()["policy"]
            assert in_force["readiness"]["retry_after_ms"] == 4000
            assert [u["url"] for u in in_force["upstreams"]] == [pod.url()]
            assert in_force["listen"]["address"] == "127.0.0.1:0"
            assert chat(car).status_code == 200 and car.popen.poll() is None


class Traffic:
    """One user sending short chats back to back in a thread, counting answers by "status reason"
    (transport errors by exception name, so a hang shows up as ReadTimeout)."""

    def __init__(self, car: Proc) -> None:
        self.url = car.url() + "/v1/chat/completions"
        self.answers: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive()

    def count(self, key: str | int) -> int:
        return self.answers.get(str(key), 0)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                try:
                    r = client.post(self.url, json=CHAT)
                except httpx.HTTPError as exc:
                    key, ok = type(exc).__name__, False
                else:
                    reason = r.headers.get("x-rampmeter-reason")
                    key, ok = (f"{r.status_code} {reason}" if reason else str(r.status_code)), r.status_code == 200
                self.answers[key] = self.answers.get(key, 0) + 1
                if not ok:
                    self._stop.wait(0.05)
