"""The pod's step loop on trio's autojump clock: wakeups, step boundaries, leases."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from proxy.simpod.driver import Pod
from proxy.simpod.engine import CANCELLED, FINISHED
from proxy.simpod.profiles import Profile
from proxy.simpod.workload import COMPLETION, parse_job

FLAT = Profile(base_ms=10.0, per_seq_ms=0.0, prefill_ms_per_token=0.0, max_num_seqs=8)


def job(tokens: int, stream: bool):
    return parse_job(COMPLETION, {"prompt": "x", "max_tokens": tokens, "stream": stream}, FLAT)


async def running_pod(nursery, profile: Profile = FLAT) -> Pod:
    pod = Pod(profile)
    await nursery.start(pod.run)
    return pod


async def test_non_streaming_waiter_wakes_once_when_done(nursery, autojump_clock) -> None:
    pod = await running_pod(nursery)
    seq = pod.submit(job(5, stream=False))
    t0 = trio.current_time()
    await pod.wait(seq)
    assert seq.state is FINISHED and seq.generated == 5
    assert trio.current_time() - t0 == pytest.approx(0.05)


async def test_streaming_waiter_wakes_every_step_with_one_new_token(nursery, autojump_clock) -> None:
    pod = await running_pod(nursery)
    seq = pod.submit(job(4, stream=True))
    seen = []
    while not seq.done:
        await pod.wait(seq)
        seen.append(seq.generated)
    assert seen == [1, 2, 3, 4]


async def test_arrivals_join_at_the_next_step_boundary(nursery, autojump_clock) -> None:
    pod = await running_pod(nursery)
    t0 = trio.current_time()
    first = pod.submit(job(3, stream=False))
    await trio.sleep(0.015)  # mid second step
    second = pod.submit(job(1, stream=False))
    await pod.wait_done(second)
    # second joins the batch at the start of the third step (20 ms) and ends with it
    assert second.admitted_at - t0 == pytest.approx(0.02)
    assert trio.current_time() - t0 == pytest.approx(0.03)
    await pod.wait_done(first)
    assert first.finished_at - t0 == pytest.approx(0.03)


async def test_release_is_idempotent_and_cancels_only_unfinished(nursery, autojump_clock) -> None:
    pod = await running_pod(nursery)
    done = pod.submit(job(1, stream=False))
    await pod.wait_done(done)
    pod.release(done)
    assert done.state is FINISHED
    live = pod.submit(job(100, stream=False))
    await trio.sleep(0.05)
    pod.release(live)
    pod.release(live)
    assert live.state is CANCELLED
    await trio.testing.wait_all_tasks_blocked()
    assert not pod.engine.has_work and pod.engine.statistics().kv_reserved_tokens == 0


async def test_the_loop_sleeps_when_idle_and_resumes_on_submit(nursery, autojump_clock) -> None:
    pod = await running_pod(nursery)
    await trio.sleep(100)
    assert pod.engine.statistics().steps == 0
    seq = pod.submit(job(2, stream=False))
    await pod.wait_done(seq)
    await trio.sleep(100)
    assert pod.engine.statistics().steps == 2
    assert pod.ready() and pod.elapsed() == pytest.approx(200.02)
    assert "ready=True" in repr(pod)


async def test_a_late_loop_keeps_the_engine_cadence_and_reports_its_lag(nursery, autojump_clock, monkeypatch) -> None:
    from proxy.simpod import driver

    real_sleep_until = trio.sleep_until

    async def oversleep(deadline: float) -> None:  # as if answering each step cost 3 ms of CPU
        await real_sleep_until(deadline + 0.003)

    monkeypatch.setattr(driver.trio, "sleep_until", oversleep)
    pod = await running_pod(nursery)
    t0 = trio.current_time()
    seq = pod.submit(job(10, stream=False))
    await pod.wait_done(seq)
    assert seq.finished_at - t0 == pytest.approx(0.1)  # engine clock: 10 steps of 10 ms
    assert trio.current_time() - t0 == pytest.approx(0.103)  # not 10 * 13 ms
    stats = pod.statistics()
    assert stats["loop_late_steps"] == 9 and stats["loop_lag_s"] == pytest.approx(0.027)


def test_cli_flags_build_the_profile_faults_and_cold_start() -> None:
    import argparse

    from proxy.simpod import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        [
            "--profile",
            "fixed",
            "--speed",
            "10",
            "--max-num-seqs",
            "8",
            "--fixed-steps",
            "3",
            "--cold-start-s",
            "2",
            "--cold-penalty",
            "4",
            "--cold-penalty-requests",
            "50",
            "--fault-slowdown",
            "3",
            "--fault-start-s",
            "10",
            "--fault-duration-s",
            "5",
        ]
    )
    pod = cli.build_pod(args)
    p = pod.profile
    assert (p.name, p.speed, p.max_num_seqs, p.fixed_steps, p.base_ms) == ("fixed", 10.0, 8, 3, 10.0)
    assert p.fixed_capacity_rps() == pytest.approx(8 / (3 * 0.001))
    assert (pod.cold_start_s, pod.engine.cold_penalty, pod.engine.cold_penalty_requests) == (2.0, 4.0, 50)
    assert [pod.faults.at(t).slowdown for t in (9.9, 10.0, 14.9, 15.0)] == [1.0, 3.0, 3.0, 1.0]
    defaults = cli.build_pod(parser.parse_args([]))
    assert defaults.profile.name == "llm" and defaults.faults.at(0.0).slowdown == 1.0
    assert parser.parse_args([]).listen == "127.0.0.1:8000"
    with pytest.raises(ValueError):
        cli.build_pod(parser.parse_args(["--speed", "0"]))


def test_the_front_end_crossing_is_fixed_or_spread_by_a_seeded_draw() -> None:
    fixed = Pod(FLAT.with_overrides(frontend_ms=60.0))
    assert [fixed.frontend_s() for _ in range(20)] == pytest.approx([0.06] * 20)
    spread = FLAT.with_overrides(frontend_ms=60.0, frontend_spread=1.0)
    draws = [Pod(spread, seed=3).frontend_s() for _ in range(2)]
    assert draws[0] == draws[1]  # the same seed, the same crossing
    many = [d for pod in [Pod(spread, seed=3)] for d in (pod.frontend_s() for _ in range(200))]
    assert all(0.0 <= d <= 0.12 for d in many) and max(many) - min(many) > 0.08  # 0-120 ms, varied
    assert Pod(FLAT).frontend_s() == 0.0
    with pytest.raises(ValueError, match="frontend_spread"):
        FLAT.with_overrides(frontend_spread=1.5)
