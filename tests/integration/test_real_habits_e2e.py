"""The sidecar on the sim pod's real-server habits (issue 12), real processes on 127.0.0.1.

Assertions are on answers and counters (the pod's /sim/stats, the sidecar's /admin/stats), never
on how long something took.
"""

from __future__ import annotations

import httpx
import pytest
import trio

from proxy.testing.stack import sidecar, sim_pod

pytestmark = pytest.mark.integration


def chat(max_tokens: int) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": max_tokens}


POLICY = """
[warmup]
health_interval_s = 0.2
[gpu]
enabled = false
[limits]
kind = "fixed"
initial_limit = {limit}
min_limit = 1
"""


def write_policy(tmp_path, limit: int) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY.format(limit=limit))
    return str(path)


def test_on_a_server_that_keeps_computing_a_cut_request_holds_its_slot_and_its_shape_turns_unmeetable(tmp_path):
    # llm profile at speed 0.2, keeping on after a disconnect: an 8-token answer takes ~0.25 s, longer
    # than its 150 ms budget, while the route's prior (20 ms + 10 ms a requested token) calls it meetable
    with (
        sim_pod("--stops-on-cancel", "false", "--max-num-seqs", "1", profile="llm", speed=0.2) as pod,
        sidecar(pod.url(), policy=write_policy(tmp_path, 1)) as proxy,
    ):
        url, admin = proxy.url(), proxy.url("admin")
        headers = {"x-request-timeout-ms": "150"}
        first = httpx.post(url + "/v1/chat/completions", json=chat(8), headers=headers, timeout=10)
        assert first.status_code == 504 and first.headers["x-rampmeter-reason"] == "deadline_expired"
        stats = httpx.get(admin + "/admin/stats", timeout=5).json()["admission"]
        # the cut request's slot was held for its expected remaining time: the pod went on computing it
        assert stats["counts"]["phantoms"] == 1 and stats["stops_on_cancel"] == ["auto"]
        assert stats["models"]["/v1/chat/completions"]["censored"]["informative"] == 1
        second = httpx.post(url + "/v1/chat/completions", json=chat(8), headers=headers, timeout=10)
        assert second.status_code == 503 and second.headers["x-rampmeter-reason"] == "deadline_unmeetable"
        assert "retry-after" not in second.headers  # only a larger budget helps
        ok = httpx.post(url + "/v1/chat/completions", json=chat(8), timeout=30)  # a budget that covers it
        assert ok.status_code == 200
        pod_stats = httpx.get(pod.url() + "/sim/stats", timeout=5).json()
        assert pod_stats["requests_orphaned"] == 1 and pod_stats["requests_executed"] == 2  # the 503 never went


async def test_a_closed_loop_of_four_on_a_serial_server_is_never_shed(tmp_path):
    with (
        sim_pod(profile="serial", speed=50.0) as pod,
        sidecar(pod.url(), policy=write_policy(tmp_path, 1)) as proxy,
    ):
        statuses: list[int] = []
        async with httpx.AsyncClient(timeout=60) as client:

            async def client_loop(i: int) -> None:
                for k in range(12):
                    tokens = 256 if (i + k) % 5 == 0 else 16  # 80/20 short/long, as issue 12 measured
                    resp = await client.post(proxy.url() + "/v1/chat/completions", json=chat(tokens))
                    statuses.append(resp.status_code)

            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(client_loop, i)
            stats = (await client.get(proxy.url("admin") + "/admin/stats")).json()
        assert statuses == [200] * 48
        assert stats["admission"]["counts"]["rejected"] == {} and sum(stats["shedding"]["shed"].values()) == 0
        assert stats["shedding"]["codel_target_ms"] >= 5.0  # scaled to the service time once samples came
