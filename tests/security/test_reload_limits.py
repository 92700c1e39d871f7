"""Defect 9: reloaded `[listen]` limits are in force, not only displayed; what needs a restart says so.

A real sidecar serves from a policy file that the test rewrites (atomically, as a
ConfigMap update or an editor does); what is in force is checked on the wire: a body
past the new cap gets 413 on a connection opened before the reload, a head past the
new cap gets 431, a new h2c connection is told the new SETTINGS_MAX_CONCURRENT_STREAMS,
and max_connections refuses at the new count. A change only a restart applies (the
dedup store) is logged once as a warning and shown in /admin/policy under
`pending_restart`, while the policy shown stays what actually runs.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from h2.settings import SettingCodes

from proxy.testing.procs import wait_for
from proxy.testing.stack import sim_pod
from tests.security.harness import CHAT, assert_clean_log
from tests.security.reload_helpers import (
    BASE,
    admin_policy,
    h2_settings,
    served_from,
    wait_version,
    write_atomically,
)

pytestmark = pytest.mark.integration

BODY_2K = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}


def listen(**limits) -> str:
    return BASE + "[listen]\n" + "".join(f"{k} = {v}\n" for k, v in limits.items())


@pytest.fixture(scope="module")
def pod():
    with sim_pod(speed=20.0) as proc:
        yield proc


def test_reloaded_listen_limits_apply_to_the_next_request(tmp_path, pod):
    path = tmp_path / "policy.toml"
    path.write_text(listen(max_body_bytes=65_536, max_header_bytes=65_536, max_concurrent_streams=64))
    with served_from(pod, path) as proc, httpx.Client(timeout=10) as before:
        url = proc.url() + "/v1/chat/completions"
        assert before.post(url, json=BODY_2K).status_code == 200  # keep-alive connection opened before the reload
        assert h2_settings(proc)[SettingCodes.MAX_CONCURRENT_STREAMS] == 64

        write_atomically(path, listen(max_body_bytes=1000, max_header_bytes=2048, max_concurrent_streams=8))
        doc = wait_version(proc, 2)
        assert doc["policy"]["listen"]["max_body_bytes"] == 1000

        # In force, on the old connection and on new ones, h1 and h2.
        assert before.post(url, json=BODY_2K).status_code == 413
        assert httpx.post(url, json=BODY_2K, timeout=10).status_code == 413
        with httpx.Client(http2=True, http1=False, timeout=10) as h2c:
            assert h2c.post(url, json=BODY_2K).status_code == 413
        assert before.post(url, json=CHAT, headers={"x-pad": "p" * 3000}).status_code == 431
        assert before.post(url, json=CHAT).status_code == 200  # under the new caps: served
        assert h2_settings(proc)[SettingCodes.MAX_CONCURRENT_STREAMS] == 8
        assert doc["pending_restart"] == {}  # nothing in this change waits for a restart
        assert "next restart" not in proc.log()  # command-line --listen/--upstream are not a "change"
        assert_clean_log(proc)


def test_reloaded_max_connections_refuses_at_the_new_count(tmp_path, pod):
    path = tmp_path / "policy.toml"
    path.write_text(listen(max_connections=100))
    with served_from(pod, path) as proc:
        write_atomically(path, listen(max_connections=3))
        wait_version(proc, 2)
        host, _, port = proc.addresses["data"].rpartition(":")
        held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(3)]
        try:
            # The limit (3) keeps headroom: a fourth is served, and the connection silent
            # longest is closed to make room (at 100, nothing would be).
            time.sleep(0.1)
            assert httpx.post(proc.url() + "/v1/chat/completions", json=CHAT, timeout=5).status_code == 200
            held[0].settimeout(5)
            assert held[0].recv(1) == b""
            stats = httpx.get(proc.url("admin") + "/admin/stats", timeout=5).json()["server"]
            assert stats["connections_evicted"] >= 1
        finally:
            for sock in held:
                sock.close()
        # Slots free again: served.
        wait_for(lambda: httpx.post(proc.url() + "/v1/chat/completions", json=CHAT, timeout=5).status_code == 200)


def test_a_change_that_needs_a_restart_is_warned_and_shown_pending(tmp_path, pod):
    path = tmp_path / "policy.toml"
    path.write_text(listen(max_body_bytes=65_536))
    with served_from(pod, path) as proc:
        text = listen(max_body_bytes=1000) + '[dedup]\nstore = "redis"\nredis_url = "redis://127.0.0.1:1/0"\n'
        write_atomically(path, text)
        doc = wait_version(proc, 2)
        # What runs: the memory store (in the policy shown, too), and the new body cap.
        assert doc["policy"]["dedup"]["store"] == "memory"
        assert doc["policy"]["listen"]["max_body_bytes"] == 1000
        # What waits for a restart, with the value the file asks for.
        assert doc["pending_restart"] == {"dedup.store": ["redis", "redis://127.0.0.1:1/0"]}
        log = wait_for(lambda: "next restart" in (t := proc.log()) and t)
        assert "dedup.store" in log and "pending_restart" in log
        assert httpx.post(proc.url() + "/v1/chat/completions", json=BODY_2K, timeout=10).status_code == 413
        # Back to the running store: nothing pending any more.
        write_atomically(path, listen(max_body_bytes=1000) + "[dedup]\nttl_s = 60\n")
        assert wait_version(proc, 3)["pending_restart"] == {}
        assert admin_policy(proc)["policy"]["dedup"]["ttl_s"] == 60
        assert_clean_log(proc)
