"""The engine_queue limit on a server that holds requests outside its batch (vLLM's HTTP front end on CPU).

Pure, readings by hand: a toy engine of `seqs` sequences behind a front end that
always holds `transit` of the requests in flight (parsing, tokenizing, writing
answers). What waits inside the engine is taken off the limit; what is in the
front end is not, so the limit settles at seqs + transit and the engine runs
full. (Dropping to what the engine runs, as before, swung the limit between
seqs and seqs + transit + 1 and left the engine running 3.5-5.7 of vLLM's 8
while requests queued in the sidecar: bench/real_servers, 2026-12-01.)
"""

from __future__ import annotations

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
    assert all(seqs + transit <= value <= seqs + transit + 1 for value, _ in seen), seen[-5:]
    assert all(running == seqs for _, running in seen)  # never an idle sequence once settled


def test_a_drop_takes_off_only_what_waits_inside_the_engine():
    limit = EngineQueueLimit(14, 1, 256)
    for _ in range(3):  # 14 in flight: 8 running, 3 waiting inside vLLM, 3 in its front end
        limit.on_engine(8.0, 3.0, 14, 0.0)
    assert limit.value == 11 and limit.last_reason == "engine_queue"  # not 8
    for _ in range(20):  # at 11: the engine full, nothing waiting: no more drops
        limit.on_engine(8.0, 0.0, 11, 1.0)
    assert limit.value >= 11
