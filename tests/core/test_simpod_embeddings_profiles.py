"""The sim pod's embeddings profiles for micro-batching: an unbatched server and a padding one, in exact figures."""

from __future__ import annotations

import pytest

from proxy.simpod import get_profile
from proxy.simpod.engine import Engine
from proxy.simpod.workload import EMBEDDING, parse_job


def job(profile, *texts: str):
    return parse_job(EMBEDDING, {"input": list(texts)}, profile)


def drain(engine: Engine, now: float = 0.0) -> list[tuple[float, float]]:
    """Run the engine empty; the (start, end) of every step."""
    steps = []
    while engine.has_work:
        duration = engine.begin_step(now)
        engine.end_step(now + duration)
        steps.append((now, now + duration))
        now += duration
    return steps


def test_the_serial_profile_runs_one_call_at_a_time_at_a_cost_per_call_plus_per_token():
    p = get_profile("embeddings-serial")
    e = Engine(p)
    one = e.submit(job(p, "a" * 128), 0.0)  # 32 tokens
    many = e.submit(job(p, *["a" * 128] * 32), 0.0)  # 32 inputs of 32 tokens, one call
    steps = drain(e)
    assert [round(end - start, 6) for start, end in steps] == [0.02064, 0.04048]
    assert one.finished_at <= many.admitted_at  # strictly one call at a time
    assert not p.stops_on_cancel


def test_the_padded_profile_pads_a_batch_to_its_longest_prompt_and_finishes_it_together():
    p = get_profile("embeddings-padded")
    e = Engine(p)
    short = e.submit(job(p, "a" * 64), 0.0)  # 16 tokens
    long = e.submit(job(p, "a" * 1600), 0.0)  # 400 tokens
    (step,) = drain(e)
    assert step[1] - step[0] == pytest.approx((10 + 2 * 0.1 + 2 * 400 * 0.02) / 1000)
    assert short.finished_at == long.finished_at  # the short one waits for the long one
