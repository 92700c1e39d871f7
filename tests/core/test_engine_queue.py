"""The limit that keeps the engine's own queue empty (issue 12 item 8), pure, readings by hand."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.admission import AdmissionController
from proxy.core.decisions import Admit
from proxy.core.limits import EngineQueueLimit, GradientLimit
from tests.core.test_admission import make_policy, ticket


class Engine:
    """A toy engine that runs `seqs` at once and queues the rest (vLLM with --max-num-seqs)."""

    def __init__(self, seqs: int) -> None:
        self.seqs = seqs

    def gauges(self, inflight: int) -> tuple[float, float]:
        return float(min(inflight, self.seqs)), float(max(0, inflight - self.seqs))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 40), st.integers(1, 64), st.integers(1, 5))
def test_the_limit_settles_at_what_the_engine_runs_without_queueing(seqs, initial, readings_per_step):
    engine, limit = Engine(seqs), EngineQueueLimit(initial, 1, 256)
    for _ in range(300):  # a saturating load: the sidecar always uses its whole limit
        inflight = limit.value
        for _ in range(readings_per_step):
            running, waiting = engine.gauges(inflight)
            limit.on_engine(running, waiting, inflight, 0.0)
    assert limit.value == seqs + 2  # the batch and the two kept waiting (engine_target_waiting), no more


def test_it_does_not_grow_while_the_sidecar_does_not_use_the_limit():
    limit = EngineQueueLimit(8, 1, 256)
    for _ in range(50):
        limit.on_engine(3.0, 0.0, 3, 0.0)  # app-limited: 3 in flight of 8
    assert limit.value == 8 and limit.statistics()["kind"] == "engine_queue"


def test_triton_pending_only_reads_running_as_inflight_less_waiting():
    limit = EngineQueueLimit(16, 1, 256)
    for _ in range(5):
        limit.on_engine(None, 4.0, 16, 0.0)
    assert limit.value == 14 and limit.last_reason == "engine_queue"  # 16 - 4 waiting + the two kept there


def test_an_upstream_drop_backs_off():
    limit = EngineQueueLimit(10, 1, 256)
    assert limit.on_sample(0.0, 100.0, 10, True) == 9 and limit.last_reason == "drop"


def test_the_gradient_never_climbs_above_what_the_engine_runs():
    # issue 12: llm-chat.toml's gradient limit climbed to 21-36 over vLLM's 8 sequences
    g = GradientLimit(16, 4, 64)
    engine = Engine(8)
    for i in range(400):
        inflight = g.value
        g.on_sample(float(i), 100.0, inflight, False)  # latency on target: the gradient probes up
        running, waiting = engine.gauges(inflight)
        g.on_engine(running, waiting, inflight, float(i))
    assert 8 <= g.value <= 10 and g.statistics()["engine_ceiling"] < 11  # the batch and two kept waiting


def test_the_controller_feeds_the_engine_gauges_to_the_limit_and_admits_into_new_room():
    ctl = AdmissionController(make_policy(2, kind="engine_queue"), rng=random.Random(0))
    admitted = [ctl.arrive(ticket(), 0.0) for _ in range(4)]
    assert [isinstance(d, Admit) for d in admitted] == [True, True, False, False]
    woken = ctl.note_engine(0, running=2.0, waiting=0.0, now=1.0)  # nothing waits in it: the two it may keep,
    assert ctl.capacity.limit(0) == 3 and len(woken) == 1  # half of them a reading
    woken = ctl.note_engine(0, running=2.0, waiting=0.0, now=2.0)
    assert ctl.capacity.limit(0) == 4 and len(woken) == 1
    ctl = AdmissionController(make_policy(8, kind="engine_queue"), rng=random.Random(0))
    for _ in range(10):
        ctl.arrive(ticket(), 0.0)
    for t in range(8):  # of the 8 in flight, the engine runs 4 and 4 wait in it: two more than it may keep
        ctl.note_engine(0, running=4.0, waiting=4.0, now=1.0 + t)
    assert ctl.capacity.limit(0) == 6


def test_a_request_waiting_between_two_engine_steps_below_capacity_is_no_queue():
    limit = EngineQueueLimit(16, 1, 256)
    for _ in range(20):
        limit.on_engine(4.0, 8.0, 12, 0.0)  # the engine runs 4 and queues 8: it runs 4 at most
    assert limit.value == 6  # its 4 and the two it may keep waiting, to take the next free sequences
    for _ in range(50):  # below the limit: one finished, the waiting one not yet in the batch
        limit.on_engine(3.0, 1.0, 4, 0.0)
        limit.on_engine(3.0, 1.0, 5, 0.0)
    assert limit.value == 6  # no ratchet down to 5, 4 ..., and no growth: the sidecar does not use it all
