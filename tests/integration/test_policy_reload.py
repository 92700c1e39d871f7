"""Live policy reload through a real `rampmeter serve`: file change, SIGHUP, broken files,
a Kubernetes ConfigMap symlink swap, and requests queued across a reload.

The reloader polls the file every second (stat through the links, then a content
hash) and re-reads it at once on SIGHUP. What took effect is read back from
/admin/policy (version, sha256, the policy itself) and /metrics
(rampmeter_policy_version, rampmeter_policy_reloads_total).
"""

from __future__ import annotations

import os
import signal
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from proxy.testing.procs import Proc, wait_for

pytestmark = pytest.mark.integration


def policy(limit: int = 4, order: str = "sjf") -> str:
    return f"""
[warmup]
health_interval_s = 0.2
[slow_start]
window_s = 0.0
[gpu]
enabled = false
[shedding]
rules = []
[scheduling]
order = "{order}"
[limits]
kind = "fixed"
initial_limit = {limit}
min_limit = 1
"""


@pytest.fixture(scope="module")
def pod():
    with Proc(["sim-pod", "--listen", "127.0.0.1:0", "--profile", "llm", "--speed", "2"], name="sim-pod") as proc:
        yield proc


@pytest.fixture
def serve(pod):
    started: list[Proc] = []

    def start(path: Path) -> Proc:
        argv = [
            "serve",
            "--policy",
            str(path),
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--upstream",
            pod.url(),
            "--log-level",
            "info",
        ]
        proc = Proc(argv, name="sidecar")
        started.append(proc)
        wait_for(lambda: _get(proc, "/readyz") is not None, timeout_s=20)
        return proc

    yield start
    for proc in started:
        proc.stop()


def _get(proc: Proc, path: str) -> httpx.Response | None:
    try:
        resp = httpx.get(proc.url("admin") + path, timeout=2)
    except httpx.HTTPError:
        return None
    return resp if resp.is_success else None


def admin_policy(proc: Proc) -> dict:
    return httpx.get(proc.url("admin") + "/admin/policy", timeout=5).json()


def metric(proc: Proc, line_prefix: str) -> float:
    text = httpx.get(proc.url("admin") + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_prefix))


def replace_file(path: Path, text: str) -> None:
    """Write atomically, as editors and config tools do (a new inode)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def wait_version(proc: Proc, version: int) -> dict:
    return wait_for(lambda: (doc := admin_policy(proc))["version"] == version and doc, timeout_s=15)


def test_file_change_is_picked_up_live(tmp_path, serve):
    path = tmp_path / "policy.toml"
    path.write_text(policy(limit=4))
    proc = serve(path)
    assert admin_policy(proc)["policy"]["limits"]["initial_limit"] == 4
    replace_file(path, policy(limit=7))
    doc = wait_version(proc, 2)
    assert doc["policy"]["limits"]["initial_limit"] == 7
    assert metric(proc, "rampmeter_policy_version") == 2
    assert metric(proc, 'rampmeter_policy_reloads_total{result="ok"}') == 1
    stats = httpx.get(proc.url("admin") + "/admin/stats", timeout=5).json()
    assert stats["admission"]["limit_total"] == 7  # in force, not just displayed


def test_sighup_rereads_a_change_the_poller_cannot_see(tmp_path, serve):
    path = tmp_path / "policy.toml"
    path.write_text(policy(limit=4))
    proc = serve(path)
    before = os.stat(path)
    new = policy(limit=5)
    assert len(new) == len(policy(limit=4))
    with open(path, "r+") as f:  # same inode, same size ...
        f.write(new)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # ... same mtime: the stat poll sees nothing
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    proc.signal(signal.SIGHUP)
    doc = wait_version(proc, 2)
    assert doc["policy"]["limits"]["initial_limit"] == 5
    assert metric(proc, "rampmeter_policy_version") == 2


def test_a_broken_file_keeps_the_old_policy_logged_and_counted(tmp_path, serve, pod):
    path = tmp_path / "policy.toml"
    path.write_text(policy(limit=4))
    proc = serve(path)
    sha = admin_policy(proc)["sha256"]
    replace_file(path, policy(limit=4).replace("initial_limit = 4", "initial_limit = -3"))
    wait_for(lambda: metric(proc, 'rampmeter_policy_reloads_total{result="error"}') >= 1, timeout_s=15)
    doc = admin_policy(proc)
    assert doc["version"] == 1 and doc["sha256"] == sha
    assert doc["policy"]["limits"]["initial_limit"] == 4
    assert metric(proc, "rampmeter_policy_version") == 1
    log = wait_for(lambda: "policy reload rejected" in (text := proc.log()) and text, timeout_s=5)
    assert "initial_limit" in log and "keeping version 1" in log
    body = {"model": "sim-llm", "messages": [{"role": "user", "content": "still serving?"}], "max_tokens": 2}
    assert httpx.post(proc.url() + "/v1/chat/completions", json=body, timeout=30).status_code == 200
    replace_file(path, "[limits\nkind = ")  # not even TOML
    wait_for(lambda: metric(proc, 'rampmeter_policy_reloads_total{result="error"}') >= 2, timeout_s=15)
    assert admin_policy(proc)["version"] == 1
    replace_file(path, policy(limit=6))  # fixed: the next good version takes effect
    assert wait_version(proc, 2)["policy"]["limits"]["initial_limit"] == 6


def test_configmap_style_symlink_swap_is_picked_up(tmp_path, serve):
    """kubelet's layout: policy.toml -> ..data/policy.toml, ..data -> ..<timestamp>/; updates swap ..data."""
    cm = tmp_path / "config"
    first = cm / "..2024_05_01_10_00_00.000000001"
    first.mkdir(parents=True)
    (first / "policy.toml").write_text(policy(limit=4))
    (cm / "..data").symlink_to(first.name)
    (cm / "policy.toml").symlink_to("..data/policy.toml")
    proc = serve(cm / "policy.toml")
    assert admin_policy(proc)["policy"]["limits"]["initial_limit"] == 4
    second = cm / "..2024_05_01_10_05_00.000000002"
    second.mkdir()
    (second / "policy.toml").write_text(policy(limit=9))
    (cm / "..data_tmp").symlink_to(second.name)
    os.replace(cm / "..data_tmp", cm / "..data")  # atomic rename over the old link, as kubelet does
    doc = wait_version(proc, 2)
    assert doc["policy"]["limits"]["initial_limit"] == 9
    assert doc["source"] == str(cm / "policy.toml")


async def test_requests_queued_at_reload_time_all_complete(tmp_path, serve):
    path = tmp_path / "policy.toml"
    path.write_text(policy(limit=1, order="fcfs"))
    proc = serve(path)
    url = proc.url() + "/v1/chat/completions"
    statuses: list[int] = []

    def body(tokens: int, text: str) -> dict:
        return {"model": "sim-llm", "messages": [{"role": "user", "content": text}], "max_tokens": tokens}

    async with httpx.AsyncClient(timeout=60) as client:

        async def admission() -> dict:
            return (await client.get(proc.url("admin") + "/admin/stats")).json()["admission"]

        async def until(predicate) -> dict:
            with trio.fail_after(20):
                while not predicate(a := await admission()):
                    await trio.sleep(0.02)
                return a

        async def send(tokens: int, text: str) -> None:
            statuses.append((await client.post(url, json=body(tokens, text))).status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, 1000, "blocker")  # ~3 s at speed 2: holds the only slot
            await until(lambda a: a["inflight_requests"] == 1)
            for i in range(3):
                nursery.start_soon(partial(send, 4, f"queued {i}"))
            await until(lambda a: a["queued"] == 3)
            replace_file(path, policy(limit=1, order="sjf"))
            proc.signal(signal.SIGHUP)
            await trio.to_thread.run_sync(wait_version, proc, 2)
            during = await admission()
            assert (during["queued"], during["inflight_requests"], during["order"]) == (3, 1, "sjf")
        final = await until(lambda a: a["queued"] == 0 and a["inflight_requests"] == 0)
    assert statuses == [200] * 4
    assert final["counts"]["admitted"] == 4 and final["counts"]["rejected"] == {} and final["counts"]["expired"] == 0


def test_flags_that_differ_from_the_file_do_not_warn_at_every_reload(tmp_path, serve):
    """--listen/--admin/--upstream override the file: a reload compares file with file, and warns only
    when the file itself changes a key that needs a restart."""
    path = tmp_path / "policy.toml"
    path.write_text(policy(limit=4))
    proc = serve(path)
    running = admin_policy(proc)["policy"]
    replace_file(path, policy(limit=5))
    wait_version(proc, 2)
    assert "next restart" not in proc.log()
    replace_file(path, policy(limit=6) + '[listen]\naddress = "127.0.0.1:1"\n')
    doc = wait_version(proc, 3)
    wait_for(lambda: "next restart" in proc.log(), timeout_s=10)
    (warning,) = [line for line in proc.log().splitlines() if "next restart" in line]
    assert "policy v3 changes ['listen.address']" in warning
    # The flags stay in force: the sidecar keeps the addresses and upstream it was started with.
    assert doc["policy"]["listen"]["address"] == running["listen"]["address"]
    assert doc["policy"]["admin"] == running["admin"] and doc["policy"]["upstreams"] == running["upstreams"]
    assert doc["policy"]["limits"]["initial_limit"] == 6
