"""Keyed requests on the real request path, in virtual time (the stack of test_request_path_deadlines).

A client whose attempt times out while the sidecar is still claiming its key in a
shared store must not leave that claim behind with nobody leading it: its retry
would follow the orphan until the lease lapsed (10 s), and the work would never run.
"""

from __future__ import annotations

import trio

from proxy.runtime.dedup import Deduplicator, MemoryStore
from tests.runtime.test_request_path_deadlines import chat, policy, service_s, stack

KEY = ("idempotency-key", "order-7")


class SlowReplyStore(MemoryStore):
    """A shared store (not in process) whose claim lands at once but whose reply takes 50 ms."""

    in_process = False

    async def claim(self, *args):
        record = await super().claim(*args)
        await trio.sleep(0.05)
        return record


async def test_a_client_leaving_mid_claim_leaves_a_leader_not_an_orphaned_claim(autojump_clock):
    body = chat(20)
    async with stack(policy()) as s:
        pol = s.app.policy.dedup
        s.app.dedup = Deduplicator(pol, SlowReplyStore(pol.max_memory_bytes), s.app.metrics)
        s.app.request_path.update(s.app.collaborators())  # the request path's parts, with that store
        first = s.call(body, KEY)
        await trio.sleep(0.01)
        await first.aclose()  # gone while the claim's reply is on its way
        await trio.sleep(0.1)
        t0 = trio.current_time()
        retry = s.call(body, KEY)
        status, _ = await retry.answer()
        assert status == 200 and retry.header("idempotent-replayed") == "true"  # it followed the leader
        assert trio.current_time() - t0 < 2 * service_s(body)  # not the 10 s lease of an orphan
        assert s.pod_stats().requests_submitted == 1
        decisions = s.app.dedup.statistics()["decisions"]
        assert (decisions["lead"], decisions["follow"], decisions["follow_remote"]) == (1, 1, 0)


async def test_on_a_server_that_keeps_computing_an_idempotent_leader_finishes_past_its_deadline(autojump_clock):
    """Cutting it would free nothing (the server goes on); letting it finish serves the retry."""
    import msgspec

    from proxy.simpod import get_profile
    from tests.runtime import test_request_path_deadlines as rpd

    body = chat(40)
    base = policy()
    pol = msgspec.structs.replace(base, upstreams=[msgspec.structs.replace(base.upstreams[0], stops_on_cancel=False)])
    keeps = get_profile("llm", speed=rpd.SPEED, stops_on_cancel=False)
    original, rpd.PROFILE = rpd.PROFILE, keeps
    try:
        async with stack(pol) as s:
            assert s.expected_ms(body) < 600 < service_s(body) * 1000  # meetable by the prior, not in truth
            t0 = trio.current_time()
            first = s.call(body, KEY, ("x-request-timeout-ms", "600"))
            status, _ = await first.answer()
            assert status == 200 and trio.current_time() - t0 >= service_s(body) - 1e-6  # finished, not cut
            retry = s.call(body, KEY, ("x-request-timeout-ms", "600"))
            status, _ = await retry.answer()
            assert status == 200 and retry.header("idempotent-replayed") == "true"
            pod = s.pod_stats()
            assert (pod.requests_submitted, pod.requests_completed, pod.requests_orphaned) == (1, 1, 0)
            model = s.admission()["models"]["/v1/chat/completions"]
            assert model["samples"] == 1 and model["censored"]["cuts"] == 0  # a real sample, not a cut
    finally:
        rpd.PROFILE = original
