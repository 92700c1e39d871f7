"""The runner on trio's autojump clock, through the in-process transport: exact virtual time."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from proxy.loadtest import Mix, Plan, Step, Target, build_trace, run, run_interleaved
from proxy.loadtest.inproc import HandlerTransport
from proxy.loadtest.records import NON_JSON, OK, TIMEOUT
from proxy.loadtest.verdict import SLA
from proxy.simpod.api import PodAPI
from proxy.simpod.driver import Pod
from proxy.simpod.profiles import get_profile

TARGET = Target("http://inproc:80", timeout_s=5.0)
JSON = [(b"content-type", b"application/json")]


def delayed(delay_s: float, status: int = 200, headers=JSON, body: bytes = b'{"ok":true}'):
    async def handler(request, sink) -> None:
        await trio.sleep(delay_s)
        await sink.respond(status, headers, body)

    return handler


async def drive(nursery, handler, trace, target=TARGET, **kw):
    transport = HandlerTransport(handler, trace.mix.shapes, nursery)
    return await run(trace, target, transport=transport, **kw)


async def test_open_loop_latency_counts_from_the_intended_time(nursery, autojump_clock):
    trace = build_trace(Plan.sweep([50], step_s=4, warmup_s=1), Mix.parse("short_chat"), 3)
    result = await drive(nursery, delayed(0.020), trace)
    rec = result.runs[0].records
    assert len(rec) == len(trace.steps[0]) > 100
    assert all(rec.error[i] == OK and rec.status[i] == 200 for i in range(len(rec)))
    assert all(rec.latency(i) == pytest.approx(0.020, abs=1e-6) for i in range(len(rec)))
    analysis = result.analyze(SLA.parse("p99=25ms"))
    step = analysis.steps[0]
    assert step.valid and step.lateness.max_ms == pytest.approx(0.0, abs=1e-6)
    assert step.overall.good == step.overall.requests and step.verdict.within_sla


async def test_sweep_against_the_simulated_pod_finds_the_computed_capacity(nursery, autojump_clock):
    # fixed profile at quarter speed: 32 slots x (10 steps of 40 ms) -> capacity 80 req/s, alone 400 ms.
    profile = get_profile("fixed", speed=0.25)
    capacity = profile.fixed_capacity_rps()
    pod = Pod(profile)
    await nursery.start(pod.run)
    loads = [capacity * f for f in (0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2)]
    trace = build_trace(Plan.sweep(loads, step_s=20, warmup_s=4), Mix.parse("short_chat"), 1)
    result = await drive(nursery, PodAPI(pod), trace, target=Target("http://pod:80", timeout_s=60))
    analysis = result.analyze(SLA.parse("p99=1s"))
    knee = analysis.knee
    assert capacity == 80.0 and analysis.valid and knee.step is not None and not knee.lower_bound
    assert 0.9 * capacity < knee.load <= capacity, knee.summary
    top = analysis.steps[-1].overall
    assert top.achieved_rps == pytest.approx(capacity, rel=0.05)  # saturated: the pod's true throughput
    assert top.goodput_rps < 0.5 * capacity


async def test_a_deliberately_slow_sender_marks_its_step_invalid(nursery, autojump_clock):
    class SlowSender(HandlerTransport):
        async def send(self, shape, key):
            autojump_clock.jump(0.03)  # 30 ms of "CPU" per request: the event loop falls behind
            return await super().send(shape, key)

    plan = Plan.sweep([10, 100], step_s=3, warmup_s=0.5, arrival="constant")
    trace = build_trace(plan, Mix.parse("tiny"), 2)
    result = await run(trace, TARGET, transport=SlowSender(delayed(0.001), trace.mix.shapes, nursery))
    analysis = result.analyze(SLA.parse("p99=1s"), max_lateness_ms=10)
    slow_ok, fast = analysis.steps
    assert slow_ok.valid  # 10 req/s: 30 ms of work every 100 ms keeps up
    assert not fast.valid and "behind schedule" in fast.invalid_reasons[0]
    assert not analysis.valid and analysis.knee.step == 0 and "invalid" in analysis.knee.summary


async def test_in_flight_cap_makes_requests_wait_and_the_step_invalid(nursery, autojump_clock):
    trace = build_trace(Plan.sweep([100], step_s=2, warmup_s=0.5), Mix.parse("tiny"), 4)
    capped = Target("http://inproc:80", max_in_flight=2, timeout_s=60)
    result = await drive(nursery, delayed(0.1), trace, target=capped)
    step = result.analyze(SLA()).steps[0]
    assert not step.valid and step.backlogged > 0
    assert step.overall.latency.max_ms > 1000  # the wait inside the generator is counted, not hidden


async def test_client_timeouts_are_counted_and_cancel_the_handler(nursery, autojump_clock):
    gone = []

    async def stuck(request, sink) -> None:
        try:
            await trio.sleep_forever()
        finally:
            gone.append(request.client_gone)

    trace = build_trace(Plan.sweep([20], step_s=1), Mix.parse("tiny"), 5)
    result = await drive(nursery, stuck, trace, target=Target("http://inproc:80", timeout_s=0.25))
    rec = result.runs[0].records
    assert all(rec.error[i] == TIMEOUT for i in range(len(rec)))
    assert all(rec.latency(i) == pytest.approx(0.25) for i in range(len(rec)))
    await trio.testing.wait_all_tasks_blocked()
    assert gone == [True] * len(rec)
    fig = result.analyze(SLA()).steps[0].overall
    assert fig.errors == {"timeout": len(rec)} and fig.latency.p50_ms == pytest.approx(250)


async def test_rejections_by_reason_and_non_json_bodies(nursery, autojump_clock):
    calls = []

    async def mixed(request, sink) -> None:
        calls.append(1)
        n = len(calls)
        if n % 3 == 0:
            await sink.respond(503, [(b"x-rampmeter-reason", b"queue_full"), *JSON], b"{}")
        elif n % 3 == 1:
            await sink.respond(200, [(b"content-type", b"text/html")], b"<html>hi</html>")
        else:
            await sink.respond(200, JSON, b'{"ok": 1}')

    trace = build_trace(Plan.sweep([30], step_s=1), Mix.parse("tiny"), 6)
    result = await drive(nursery, mixed, trace)
    fig = result.analyze(SLA()).steps[0].overall
    n = fig.requests
    assert fig.status == {"200": n - n // 3, "503": n // 3}
    assert fig.reasons == {"queue_full": n // 3}
    assert fig.errors == {"non_json": (n + 2) // 3}
    assert fig.ok == fig.good == n // 3 + (1 if n % 3 == 2 else 0)
    rec = result.runs[0].records
    assert rec.error[0] == NON_JSON


async def test_streams_record_time_to_first_token_and_time_per_token(nursery, autojump_clock):
    async def tokens(request, sink) -> None:
        await trio.sleep(0.050)  # prefill
        await sink.start(200, [(b"content-type", b"text/event-stream")])
        for i in range(5):
            if i:
                await trio.sleep(0.010)
            await sink.send(b'data: {"choices":[{"delta":{"content":"w"}}]}\n\n')
        await sink.send(b"data: [DONE]\n\n")
        await sink.end()

    trace = build_trace(Plan.sweep([10], step_s=1), Mix.parse("short_chat_stream"), 7)
    result = await drive(nursery, tokens, trace)
    fig = result.analyze(SLA()).steps[0].overall
    assert fig.ttft.p50_ms == pytest.approx(50.0) and fig.ttft.max_ms == pytest.approx(50.0)
    assert fig.tpot.p50_ms == pytest.approx(10.0)
    assert set(result.runs[0].records.tokens) == {5}


async def test_closed_loop_users_think_and_steps_change_the_user_count(nursery, autojump_clock):
    plan = Plan(
        steps=(Step(2, 5.0, 1.0), Step(6, 5.0, 1.0), Step(3, 5.0, 1.0)), mode="closed", think_ms=30, think="constant"
    )
    trace = build_trace(plan, Mix.parse("tiny"), 8)
    result = await drive(nursery, delayed(0.020), trace)
    analysis = result.analyze(SLA.parse("p99=30ms"))
    rates = [s.overall.offered_rps for s in analysis.steps]
    # Each user: 20 ms service + 30 ms think -> 20 req/s per user.
    assert rates == [pytest.approx(40, rel=0.03), pytest.approx(120, rel=0.03), pytest.approx(60, rel=0.03)]
    assert analysis.valid and analysis.knee.load == 6 and analysis.knee.lower_bound  # by load, not run order


async def test_interleaved_targets_replay_the_same_trace(nursery, autojump_clock):
    trace = build_trace(Plan.sweep([20, 40], step_s=2, warmup_s=0.5), Mix.parse("short_chat=1,long_chat=1"), 9)
    fast = HandlerTransport(delayed(0.010), trace.mix.shapes, nursery)
    slow = HandlerTransport(delayed(0.030), trace.mix.shapes, nursery)
    a, b = await run_interleaved(
        trace, [Target("http://a:1", name="A"), Target("http://b:1", name="B")], transports=[fast, slow]
    )
    assert [r.index for r in a.runs] == [r.index for r in b.runs] == [0, 1]
    for ra, rb in zip(a.runs, b.runs, strict=False):
        assert ra.records.shape == rb.records.shape
        gaps_a = [t - ra.start_s for t in ra.records.intended]
        gaps_b = [t - rb.start_s for t in rb.records.intended]
        assert gaps_a == pytest.approx(gaps_b)
    assert b.runs[1].start_s > b.runs[0].start_s + 2  # one timeline: the later step is later
    pa, pb = (r.analyze(SLA()).overall.latency.p50_ms for r in (a, b))
    assert (pa, pb) == (pytest.approx(10.0), pytest.approx(30.0))


async def test_stop_returns_what_was_measured(nursery, autojump_clock):
    from proxy.loadtest.runner import Runner

    trace = build_trace(Plan.sweep([50], step_s=10), Mix.parse("tiny"), 10)
    transport = HandlerTransport(delayed(0.005), trace.mix.shapes, nursery)
    runner = Runner(trace, TARGET, transport=transport)

    async def stop_later() -> None:
        await trio.sleep(2.0)
        runner.stop()

    nursery.start_soon(stop_later)
    result = await runner.run()
    assert result.interrupted
    step = result.analyze(SLA()).steps[0]
    assert not step.valid and any("never sent" in r for r in step.invalid_reasons)
    assert 0 < step.overall.ok < step.overall.requests
    assert json.dumps(runner.statistics())
