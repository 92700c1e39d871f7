"""The engine_queue limit follows the engine (issue 12, branch realcal4), pure, with a hand-advanced clock.

A toy of vLLM behind a front end: the sidecar admits up to its limit; each admitted request
crosses the server's front end (HTTP, tokenizing: a random transit outside the engine's gauges),
waits in the engine's FCFS queue for one of `seqs` sequences, runs, and crosses the front end
back. The engine's gauges are read every second, as the sidecar does. Events are taken in time
order off a heap: the clock is the events' own, advanced by hand, never the wall's.

What is checked: with the limit following what the engine runs plus a target waiting inside it,
the engine runs (nearly) full while requests queue in the sidecar, and its own queue averages the
target, not more (the same gain up and down), so the rest is ordered by rampmeter; a limit that
starts at the batch reaches what the front end needs within a few readings; the engine's load from another client, while the sidecar holds nothing or
less than the engine does, never cuts the limit below what the sidecar has in flight.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.limits import TARGET_WAITING, EngineQueueLimit


@dataclass
class Toy:
    seqs: int
    transit_s: float  # mean front-end time each way (exponential)
    limit: EngineQueueLimit
    rng: random.Random
    short_s: float = 0.15
    long_s: float = 1.0
    long_share: float = 0.2
    events: list = field(default_factory=list)
    queued: list = field(default_factory=list)  # in the sidecar
    waiting: list = field(default_factory=list)  # inside the engine
    running: int = 0
    inflight: int = 0
    done: int = 0
    readings: list = field(default_factory=list)  # (running, waiting, sidecar queued, limit)

    @property
    def capacity_rps(self) -> float:
        return self.seqs / ((1 - self.long_share) * self.short_s + self.long_share * self.long_s)

    def push(self, at: float, kind: str, req: float = 0.0) -> None:
        heapq.heappush(self.events, (at, kind, req))

    def transit(self) -> float:
        return self.rng.expovariate(1 / self.transit_s) if self.transit_s else 0.0

    def admit(self, now: float) -> None:
        while self.queued and self.inflight < self.limit.value:
            self.inflight += 1
            self.push(now + self.transit(), "engine", self.queued.pop(0))

    def start(self, now: float) -> None:
        while self.waiting and self.running < self.seqs:
            self.running += 1
            self.push(now + self.waiting.pop(0), "finished")

    def run(self, rate_rps: float, seconds: float, warmup_s: float = 30.0) -> Toy:
        t = 0.0
        while t < seconds:
            t += self.rng.expovariate(rate_rps)
            service = self.long_s if self.rng.random() < self.long_share else self.short_s
            self.push(t, "arrive", service)
        self.push(0.0, "reading")
        while self.events:
            now, kind, req = heapq.heappop(self.events)
            if now > seconds:
                break
            if kind == "arrive":
                self.queued.append(req)
            elif kind == "engine":
                self.waiting.append(req)
                self.start(now)
            elif kind == "finished":
                self.running -= 1
                self.start(now)
                self.push(now + self.transit(), "answered")
            elif kind == "answered":
                self.inflight -= 1
                self.done += 1
            else:
                self.limit.on_engine(float(self.running), float(len(self.waiting)), self.inflight, now)
                if now >= warmup_s:
                    self.readings.append((self.running, len(self.waiting), len(self.queued), self.limit.value))
                self.push(now + 1.0, "reading")
            self.admit(now)
        return self

    def running_while_queued(self) -> float:
        at = [r for r, _, q, _ in self.readings if q > 0]
        return sum(at) / len(at)

    def mean(self, i: int) -> float:
        return sum(r[i] for r in self.readings) / len(self.readings)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([0.05, 0.15, 0.3]), st.sampled_from([0.9, 1.1]), st.integers(0, 2**16))
def test_the_engine_runs_nearly_full_while_requests_queue_in_the_sidecar(transit_s, load, seed):
    toy = Toy(8, transit_s, EngineQueueLimit(8, 1, 64), random.Random(seed))
    toy.run(load * toy.capacity_rps, 300.0)
    # realcal2's rule (+1 a reading while nothing waited, cut by the mean beyond one kept waiting) ran
    # 7.27-7.77 of the 8 here at transit 0.1-0.3 s; realcal4's (the whole shortfall up, half the excess
    # down) 7.41-7.91, with 2.5-2.6 waiting in the engine; this one (half each way) 7.25-7.90 with 2.0
    # waiting (means of 6 seeds). Its lowest of 150 seeds at transit 0.3 s ran 7.08, so the bound is a
    # floor against collapse, not the gain.
    assert toy.running_while_queued() >= 7.0, toy.readings[-10:]
    assert toy.mean(1) <= TARGET_WAITING + 1.0  # the engine's own queue: about the target, not the backlog


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([0.05, 0.15, 0.3, 0.6]), st.sampled_from([1.0, 2.0, 3.0]), st.integers(0, 2**16))
def test_the_engines_own_queue_averages_the_target_not_more(transit_s, target, seed):
    """A bias, not noise: realcal4's rule grew the limit by the whole shortfall (target - standing) and
    cut half the excess, so it settled where the mean shortfall is half the mean excess: the engine's
    queue averaged 2.23-2.79 at a target of 2 here (3.46 over 4 sequences in one CI run of
    test_real_habits_e2e), 1.12-1.49 at 1, 3.24-4.06 at 3, the more the front end's transit varied
    (6 seeds each). The same gain both ways puts the mean on the target: 0.94-1.01, 1.95-2.03, 2.94-3.03."""
    toy = Toy(8, transit_s, EngineQueueLimit(8, 1, 64, target_waiting=target), random.Random(seed))
    toy.run(1.5 * toy.capacity_rps, 300.0)  # past capacity: the sidecar always uses its whole limit
    assert abs(toy.mean(1) - target) <= 0.15, (toy.mean(1), toy.readings[-10:])


def test_from_the_batch_the_limit_reaches_what_the_front_end_needs_within_a_few_readings():
    # A saturating load; the front end holds 0.3 s each way of 8 sequences' ~0.33 s mean service, so the
    # engine needs about 8 + 8 x 0.6 / 0.33 ... in flight: far above the batch.
    toy = Toy(8, 0.3, EngineQueueLimit(8, 1, 64), random.Random(1))
    toy.run(2 * toy.capacity_rps, 12.0, warmup_s=0.0)
    limits = [lim for *_, lim in toy.readings]
    # +1 a reading while the engine's queue is empty: half the shortfall of the two kept waiting (realcal4
    # grew by the whole of it, +2 a reading, and so kept more than the target waiting on average)
    assert limits[0] == 8 and max(limits[:10]) >= 16, limits


def test_a_reading_while_the_sidecar_holds_nothing_changes_nothing():
    limit = EngineQueueLimit(14, 1, 64)
    for _ in range(50):  # direct clients fill the engine beside an idle sidecar
        limit.on_engine(8.0, 30.0, 0, 0.0)
    assert limit.value == 14 and limit.statistics()["estimate"] == 14.0


def test_another_clients_queue_never_cuts_below_what_the_sidecar_has_in_flight():
    limit = EngineQueueLimit(14, 1, 64)
    for _ in range(50):  # the engine holds 38, the sidecar 6 of them at most
        limit.on_engine(8.0, 30.0, 6, 0.0)
    assert limit.value == 6  # what the sidecar has upstream: not the batch, not min_limit


def test_our_own_queue_inside_the_engine_is_taken_off_to_the_target():
    limit = EngineQueueLimit(20, 1, 64)
    for _ in range(30):  # 20 in flight: 8 running, 9 waiting, 3 in the front end (the engine holds 17 < 20)
        limit.on_engine(8.0, 9.0, 20, 0.0)
    assert limit.value == 13  # 20 less the 7 waiting beyond the 2 kept there


def test_the_target_is_the_policys():
    limit = EngineQueueLimit(8, 1, 64, target_waiting=0.0)
    for _ in range(5):
        limit.on_engine(8.0, 0.0, 8, 0.0)
    assert limit.value == 8 and limit.statistics()["engine_target_waiting"] == 0.0  # nothing kept: no growth


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 64),
    st.lists(st.tuples(st.integers(0, 64), st.integers(0, 200), st.integers(0, 64)), min_size=1, max_size=40),
)
def test_a_reading_never_cuts_below_the_sidecars_in_flight_when_the_engines_load_is_not_all_ours(initial, readings):
    limit = EngineQueueLimit(initial, 1, 128)
    for running, waiting, inflight in readings:
        before = limit.value
        limit.on_engine(float(running), float(waiting), inflight, 0.0)
        assert 1 <= limit.value <= 128
        if inflight == 0:
            assert limit.value == before
        elif running + waiting > inflight:
            assert limit.value >= min(before, inflight)
