"""The engine_queue limit on a server that holds requests outside its batch (vLLM's HTTP front end on CPU).

Pure, readings by hand: a toy engine of `seqs` sequences behind a front end that
always holds `transit` of the requests in flight (parsing, tokenizing, writing
answers). What waits inside the engine is taken off the limit; what is in the
front end is not, and two requests are kept waiting in the engine
(engine_target_waiting: they take the next free sequences at once), so the limit
settles at seqs + transit + 2 and the engine runs full. (Dropping to what the engine runs, as before, swung the limit
between seqs and seqs + transit + 1 and left the engine running 3.5-5.7 of
vLLM's 8 while requests queued in the sidecar: bench/real_servers, 2026-12-01.)
The front end's share varies from moment to moment on a real server; the last
test draws it at random per reading.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.limits import EngineQueueLimit


def gauges(inflight: int, seqs: int, transit: int) -> tuple[float, float]:
    inside = max(0, inflight - transit)
    return float(min(inside, seqs)), float(max(0, inside - seqs))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 32), st.integers(0, 8), st.integers(1, 48))
def test_the_limit_keeps_what_is_in_transit_and_the_engine_full(seqs, transit, initial):
    limit = EngineQueueLimit(initial, 1, 256)
    seen = []
    for i in range(400):  # a saturating load: the sidecar always uses its whole limit
        inflight = limit.value
        running, waiting = gauges(inflight, seqs, transit)
        limit.on_engine(running, waiting, inflight, float(i))
        if i >= 300:
            seen.append((limit.value, running))
    assert all(value == seqs + transit + 2 for value, _ in seen), seen[-5:]
    assert all(running == seqs for _, running in seen)  # never an idle sequence once settled


def test_a_drop_takes_off_only_what_waits_inside_the_engine():
    limit = EngineQueueLimit(14, 1, 256)
    for _ in range(10):  # 14 in flight: 8 running, 3 waiting inside vLLM, 3 in its front end
        limit.on_engine(8.0, 3.0, 14, 0.0)
    assert limit.value == 13 and limit.last_reason == "engine_queue"  # not 8: 8 + 3 + the two kept waiting
    for _ in range(20):  # at 13: the engine full, the kept two waiting: no more drops, no growth
        limit.on_engine(8.0, 2.0, 13, 1.0)
    assert limit.value == 13


@settings(max_examples=50, deadline=None)
@given(st.integers(4, 32), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_a_front_end_that_holds_a_varying_share_does_not_leave_the_batch_part_empty(seqs, transit, seed):
    """Each reading the front end holds 0 .. 2 x transit (vLLM's CPU build: 3-4 on average, more or fewer
    at the moment of a reading). The rule before this one cut the limit to what was in flight less what
    waited at every reading that caught the front end holding few: with seqs 8 and transit 3 the
    engine ran 6.6 of its 8 on average. Cutting by the mean of what waited beyond the one kept there
    (realcal2) kept it at 7.3; following the engine with two kept waiting (realcal4 and after) keeps it
    above 7.5, with a queue of two inside the engine (realcal4: 2.1-2.5, its gains asymmetric)."""
    rng = random.Random(seed)
    limit = EngineQueueLimit(seqs, 1, 256)
    running_seen, waiting_seen = [], []
    for i in range(1500):
        inflight = limit.value
        running, waiting = gauges(inflight, seqs, rng.randint(0, 2 * transit))
        limit.on_engine(running, waiting, inflight, float(i))
        if i >= 300:
            running_seen.append(running)
            waiting_seen.append(waiting)
    # Idle sequences at most 0.3 x the front end's mean share (the rule before: 0.33-0.52 in every case of
    # seqs 4-32, transit 1-4, 5 seeds; realcal2's: at most 0.27; realcal4's: at most 0.13, waiting 2.10-2.53;
    # this one, half the gap each way: at most 0.17, waiting 1.99-2.00).
    assert sum(running_seen) / len(running_seen) >= seqs - 0.3 * transit
    assert sum(waiting_seen) / len(waiting_seen) <= 3.0  # the rest waits in the sidecar, where it is ordered
