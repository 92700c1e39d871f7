"""Defect 13: while Redis is down (fail_open), retries that reach the same replica replay.

Before the fix, a response completed during the outage was kept nowhere: every retry
of every key ran on the GPU again (149 of 149 in the attack pass). Here a real
redis-server is killed under a real sidecar (store = "redis", fail_open), 30 keyed
requests are each sent and then retried; the sim pod's own count says how many times
each key executed, and the retries must carry `idempotent-replayed: true` with the
first answer's bytes. Once Redis is back, the same holds, and the outage left one
warning line (not one per request) and no traceback.
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from proxy.core import wire
from proxy.testing.procs import wait_for
from proxy.testing.stack import sidecar, sim_pod
from tests.conftest import require_binary
from tests.integration.conftest import RedisServer
from tests.security.harness import CHAT, assert_clean_log
from tests.security.reload_helpers import BASE

pytestmark = pytest.mark.integration

KEYS = 30


@pytest.fixture
def redis_server():
    server = RedisServer(require_binary("redis-server"))
    server.start()
    try:
        yield server
    finally:
        server.kill()


def executions(pod, key: str) -> int:
    return httpx.get(pod.url() + "/sim/stats", timeout=5).json()["executions_by_idempotency_key"].get(key, 0)


def test_retries_on_the_same_replica_replay_while_redis_is_down(tmp_path, redis_server):
    policy = tmp_path / "policy.toml"
    policy.write_text(
        BASE + f'[dedup]\nstore = "redis"\nredis_url = "{redis_server.url}"\non_store_error = "fail_open"\n'
        "store_timeout_ms = 200\nstore_retry_ms = 300\n"
    )
    with sim_pod(speed=20.0) as pod, sidecar(pod.url(), policy=str(policy)) as proc, httpx.Client(timeout=10) as c:
        url = proc.url() + "/v1/chat/completions"

        def send(key: str) -> httpx.Response:
            return c.post(url, json=CHAT, headers={wire.IDEMPOTENCY_KEY: key, "authorization": "Bearer t"})

        assert send(f"warm-{uuid.uuid4().hex}").status_code == 200  # the store is up: connections made
        redis_server.kill()
        keys = [f"outage-{i}-{uuid.uuid4().hex}" for i in range(KEYS)]
        firsts = {key: send(key) for key in keys}
        retries = {key: send(key) for key in keys}
        assert [r.status_code for r in firsts.values()] == [200] * KEYS
        replayed = [key for key, r in retries.items() if r.headers.get(wire.IDEMPOTENT_REPLAYED) == "true"]
        assert len(replayed) == KEYS, f"{KEYS - len(replayed)} of {KEYS} retries ran again"
        assert all(retries[k].content == firsts[k].content for k in keys)
        assert [executions(pod, k) for k in keys] == [1] * KEYS

        redis_server.start()  # same port: the sidecar reconnects on its own
        back = f"back-{uuid.uuid4().hex}"
        wait_for(lambda: send(back).status_code == 200, timeout_s=15)
        assert send(back).headers.get(wire.IDEMPOTENT_REPLAYED) == "true"
        assert send(keys[0]).headers.get(wire.IDEMPOTENT_REPLAYED) == "true"  # still kept after the outage
        assert executions(pod, back) == 1 and executions(pod, keys[0]) == 1
        log = proc.log()
        assert log.count("dedup store unavailable") == 1, log
        assert_clean_log(proc)
