"""Hypothesis over event orders: requests, finishes, lapses and expiries on a few keys,
driven only through proxy.core.dedup (decide -> advance -> settle), must keep:

- exactly one leader per key while its claim lives, and a Lead only on an absent record;
- every follower receives exactly one outcome;
- no failure is ever stored, and a replay is always the same request's success.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from proxy.core import dedup as d

KEYS = ("k0", "k1")
FPS = ("f0", "f1")
STATUSES = (200, 201, 400, 404, 408, 429, 500, 503)
MAX_ENTRY = 100


class Flight:
    def __init__(self, owner: int, fp: str) -> None:
        self.owner, self.fp, self.followers = owner, fp, []


class DedupModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, d.Record | None] = dict.fromkeys(KEYS)
        self.flights: dict[str, Flight] = {}  # the live leader of each key
        self.outcomes: dict[int, list[str]] = {}  # follower id -> outcomes received
        self.stored_by: dict[str, tuple[str, int]] = {}  # key -> (fp, status) of the stored success
        self.next_id = 0

    def _step(self, key: str, step: d.Step, record: d.Record | None) -> None:
        state = self.records[key].state if self.records[key] else d.State.ABSENT
        d.advance(state, step)  # raises on a transition the table forbids
        self.records[key] = record

    @rule(key=st.sampled_from(KEYS), fp=st.sampled_from(FPS), mode=st.sampled_from(["coalesce", "conflict"]))
    def arrive(self, key, fp, mode):
        self.next_id += 1
        decision = d.decide(self.records[key], fp, mode)
        if isinstance(decision, d.Lead):
            assert key not in self.flights, "a second leader while the first still holds the claim"
            self._step(key, d.Step.CLAIM, d.Record(d.State.IN_FLIGHT, fp, str(self.next_id)))
            self.flights[key] = Flight(self.next_id, fp)
        elif isinstance(decision, d.Follow):
            flight = self.flights[key]
            assert decision.owner == str(flight.owner) and flight.fp == fp
            flight.followers.append(self.next_id)
            self.outcomes[self.next_id] = []
        elif isinstance(decision, d.Replay):
            assert self.stored_by[key] == (fp, decision.stored.status)
            assert d.is_storable(decision.stored.status)
        elif isinstance(decision, d.Mismatch):
            assert self.records[key] is not None and self.records[key].fingerprint != fp
        else:
            assert isinstance(decision, d.InFlightConflict) and mode == "conflict" and key in self.flights

    @precondition(lambda self: self.flights)
    @rule(data=st.data(), ok=st.booleans(), status=st.sampled_from(STATUSES), size=st.integers(0, 2 * MAX_ENTRY))
    def finish(self, data, ok, status, size):
        key = data.draw(st.sampled_from(sorted(self.flights)))
        flight = self.flights.pop(key)
        verdict = d.settle(ok, status, size, MAX_ENTRY, overflowed=False)
        if verdict is d.Verdict.STORED:
            stored = d.Stored(flight.fp, status, [], [b"x" * size])
            self._step(key, d.Step.STORE, d.Record(d.State.COMPLETE, flight.fp, "", stored))
            self.stored_by[key] = (flight.fp, status)
        else:
            self._step(key, d.Step.RELEASE, None)
        for follower in flight.followers:
            self.outcomes[follower].append("failed" if verdict is d.Verdict.FAILED else "response")

    @precondition(lambda self: self.flights)
    @rule(data=st.data())
    def lease_lapses(self, data):
        """The leader's replica died: the claim lapses, its followers are told on re-check."""
        key = data.draw(st.sampled_from(sorted(self.flights)))
        flight = self.flights.pop(key)
        self._step(key, d.Step.LAPSE, None)
        for follower in flight.followers:
            self.outcomes[follower].append("failed")

    @rule(key=st.sampled_from(KEYS), evict=st.booleans())
    def expire(self, key, evict):
        record = self.records[key]
        if record is not None and record.state is d.State.COMPLETE:
            self._step(key, d.Step.EVICT if evict else d.Step.EXPIRE, None)
            del self.stored_by[key]

    @invariant()
    def one_leader_per_live_claim(self):
        for key in KEYS:
            record = self.records[key]
            in_flight = record is not None and record.state is d.State.IN_FLIGHT
            assert in_flight == (key in self.flights)
            if in_flight:
                assert record.owner == str(self.flights[key].owner)

    @invariant()
    def followers_get_at_most_one_outcome(self):
        assert all(len(got) <= 1 for got in self.outcomes.values())

    @invariant()
    def no_failure_is_stored(self):
        for record in self.records.values():
            if record is not None and record.state is d.State.COMPLETE:
                assert d.is_storable(record.stored.status)

    def teardown(self):
        for key in list(self.flights):
            self.finish_all(key)
        assert all(len(got) == 1 for got in self.outcomes.values()), "a follower was left without an outcome"

    def finish_all(self, key):
        flight = self.flights.pop(key)
        self._step(key, d.Step.RELEASE, None)
        for follower in flight.followers:
            self.outcomes[follower].append("failed")


TestDedupModel = DedupModel.TestCase
TestDedupModel.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
