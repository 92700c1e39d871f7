"""The shedder's queue_full / overloaded pushback is scheduled like the class queue's (issue 17).

Before, each load-rule rejection was told the plain drain time of the queue ahead, and every
call rejected in the same moment was told the same: their retries came back together into a
queue new arrivals had refilled. Now (`Shedder._reject` -> `RetryAfter.schedule`) each is
promised the slot after the last promise, one slot (1 / drain rate) each, in the one line of
promises the class queue uses too, and no promise past the caller's deadline (None: gRPC -1).
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from proxy.core import deadline as dl
from proxy.core.retry_after import RetryAfter
from proxy.core.shedding import LoadSnapshot, ShedConfig, Shedder, arrival_verdict, class_weights
from proxy.core.wire import Reason

ONLY_QUEUE = {"gpu_memory_high_water": None, "saturation_growth_ratio": None, "codel_target_ms": None}


class FixedRandom:
    def __init__(self, u: float = 0.0) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


def make(u: float = 0.0, **overrides) -> Shedder:
    config = ShedConfig(weights=class_weights(1, 0.0), **{"max_queued": 10, **ONLY_QUEUE, **overrides})
    return Shedder(config, RetryAfter(100, 30_000, 0.0, FixedRandom(u)))


FULL = LoadSnapshot(queued_by_class=(10,), drain_rate_per_s=10.0)  # 10 ahead at 10/s: 1.1 s, a slot 100 ms


def test_rejections_in_the_same_moment_are_promised_successive_slots():
    shedder = make()
    retries = [shedder.check(FULL, 0, now=5.0).retry_after_ms for _ in range(4)]
    assert retries == [1_100, 1_200, 1_300, 1_400]
    later = shedder.check(FULL, 0, now=5.25)  # 250 ms on: the line of promises has moved closer by as much
    assert later.reason is Reason.QUEUE_FULL and later.retry_after_ms == 1_250


def test_overloaded_is_scheduled_on_the_same_line():
    shedder = make(saturation_growth_ratio=0.5, max_queued=None)
    growing = LoadSnapshot(queued_by_class=(4,), inflight=8, limit=8, queue_growth_per_s=20.0, drain_rate_per_s=10.0)
    first, second = (shedder.check(growing, 0, now=0.0) for _ in range(2))
    assert (first.reason, second.reason) == (Reason.OVERLOADED, Reason.OVERLOADED)
    assert (first.retry_after_ms, second.retry_after_ms) == (500, 600)


def test_a_promise_past_the_callers_deadline_is_not_made():
    shedder = make()
    assert shedder.check(FULL, 0, now=0.0, remaining_ms=1_150).retry_after_ms == 1_100
    refused = shedder.check(FULL, 0, now=0.0, remaining_ms=1_150)  # its slot would start at 1,200 ms
    assert refused.reason is Reason.QUEUE_FULL and refused.retry_after_ms is None
    assert shedder.check(FULL, 0, now=0.0).retry_after_ms == 1_200  # the refusal did not grow the line


def test_the_class_queue_pushback_follows_the_shedders_promises():
    shedder = make()
    for _ in range(3):
        shedder.check(FULL, 0, now=0.0)
    # what AdmissionController.arrive asks for a full class queue (ArrivalGate.pushback)
    assert shedder.retry_after.schedule(200.0, 0.0, 100.0) == 1_400


def test_arrival_verdict_passes_the_deadline_on():
    shedder = make()
    meetable = dl.Meetable(completion=math.inf, slack_ms=0.0)
    assert arrival_verdict(shedder, FULL, 0, 0.0, meetable, remaining_ms=500.0).retry_after_ms is None
    assert arrival_verdict(shedder, FULL, 0, 0.0, meetable).retry_after_ms == 1_100


def test_nothing_draining_gets_the_max_and_grows_no_line():
    shedder = make()
    stuck = LoadSnapshot(queued_by_class=(10,), drain_rate_per_s=0.0)
    assert [shedder.check(stuck, 0, now=0.0).retry_after_ms for _ in range(3)] == [30_000] * 3
    assert shedder.check(FULL, 0, now=0.0).retry_after_ms == 1_100


@given(st.lists(st.floats(0.0, 0.999), min_size=1, max_size=30), st.floats(0.5, 200.0))
def test_each_promise_lies_in_its_own_slot_within_the_bounds(us, rate):
    rng = FixedRandom()
    shedder = Shedder(ShedConfig(weights=(1.0,), max_queued=1, **ONLY_QUEUE), RetryAfter(100, 30_000, 0.0, rng))
    snap = LoadSnapshot(queued_by_class=(1,), drain_rate_per_s=rate)
    drain, slot = 2 / rate * 1000.0, 1000.0 / rate  # one ahead and itself; a slot per completion
    for i, u in enumerate(us):
        rng.u = u
        retry = shedder.check(snap, 0, now=0.0).retry_after_ms
        start = drain + i * slot
        if start >= 30_000:
            assert retry == 30_000
            break
        assert max(100, start) - 1 <= retry <= min(30_000, max(100, start + slot)) + 1
