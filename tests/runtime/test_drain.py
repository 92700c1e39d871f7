"""POST /admin/drain in virtual time: stop admitting, let queued and in-flight requests finish, say so.

The real App in front of the simulated pod, as in test_request_path_deadlines; the admin
handler is called with the same in-process pipes.
"""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from proxy.http.messages import Request
from tests.runtime.test_accesslog_edge import call
from tests.runtime.test_request_path_deadlines import Pipe, _Body, chat, policy, service_s, stack


def admin(s, method: bytes, target: bytes) -> Pipe:
    request = Request(method, target, [], _Body(b""), received_at=trio.current_time())
    pipe = Pipe(request)
    s.nursery.start_soon(pipe._serve, s.app.admin_server._ctx.handler)
    return pipe


async def test_drain_refuses_newcomers_lets_queued_and_in_flight_finish_and_returns_when_they_have(autojump_clock):
    long, short = chat(40), chat(4)
    async with stack(policy(limit=1)) as s:
        first = call(s, long)  # in flight
        await trio.testing.wait_all_tasks_blocked()
        queued = call(s, short)
        await trio.testing.wait_all_tasks_blocked()
        assert s.admission()["queued"] == 1
        t0 = trio.current_time()
        drain = admin(s, b"POST", b"/admin/drain?timeout_s=30")
        await trio.testing.wait_all_tasks_blocked()
        assert s.app.readiness() == (False, "draining")  # /readyz 503: the endpoint leaves the Service
        late = call(s, short, ("x-request-id", "late-1"))
        status, body = await late.answer()
        assert (status, late.header("x-rampmeter-reason")) == (503, "draining")
        assert int(late.header("retry-after")) >= 1 and json.loads(body)["error"]["request_id"] == "late-1"
        assert drain.status == 0  # still waiting
        assert (await first.answer())[0] == 200 and (await queued.answer())[0] == 200  # nothing lost
        status, body = await drain.answer()
        result = json.loads(body)
        assert status == 200 and result["drained"] is True
        assert (result["in_flight_at_start"], result["in_flight"], result["refused_while_draining"]) == (2, 0, 1)
        # It returned as the last one ended: both had to run, one after the other.
        assert result["waited_ms"] == pytest.approx((trio.current_time() - t0) * 1000, abs=1)
        assert result["waited_ms"] / 1000 < service_s(long) + service_s(short) + 0.1
        assert s.pod_stats().requests_submitted == 2  # the late one never reached the pod


async def test_drain_answers_504_at_its_timeout_with_what_is_left(autojump_clock):
    async with stack(policy(limit=1)) as s:
        first = call(s, chat(100))  # ~2.5 s
        await trio.testing.wait_all_tasks_blocked()
        drain = admin(s, b"POST", b"/admin/drain?timeout_s=0.5")
        status, body = await drain.answer()
        result = json.loads(body)
        assert status == 504 and (result["drained"], result["in_flight"]) == (False, 1)
        assert result["waited_ms"] == pytest.approx(500, abs=1)
        assert (await first.answer())[0] == 200  # not cut: the drain only stopped waiting
        again = admin(s, b"POST", b"/admin/drain")  # a second call, now nothing is left
        status, body = await again.answer()
        assert status == 200 and json.loads(body)["in_flight_at_start"] == 0


@pytest.mark.parametrize(
    ("method", "target", "status"),
    [
        (b"GET", b"/admin/drain", 405),  # it changes state: never on a GET
        (b"POST", b"/admin/drain?timeout_s=soon", 400),
        (b"POST", b"/admin/drain?timeout_s=-1", 400),
        (b"POST", b"/admin/drain?timeout_s=nan", 400),
        (b"POST", b"/admin/drain?timeout_s=99999", 400),
    ],
)
async def test_drain_refuses_what_it_cannot_do(autojump_clock, method, target, status):
    async with stack(policy()) as s:
        pipe = admin(s, method, target)
        assert (await pipe.answer())[0] == status
        assert not s.app.edge.draining and not s.app.draining
