"""Leases end exactly once under any interleaving of completion, error, cancellation,
expiry and reload: a Hypothesis state machine over the pure controller. Leases cut upstream
(CANCELLED with a time) on an upstream that keeps computing become phantoms: they hold their
units until they end, exactly once, and in-flight including phantoms stays within the limit."""

from __future__ import annotations

import math
import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from proxy.core.admission import AdmissionController
from proxy.core.decisions import Admit, Enqueue, Expired, LeaseError, Outcome, Reject
from tests.core.test_admission import make_policy, ticket

# Each ticket's life: queued -> leased -> done, or queued -> expired | cancelled, or rejected.
TRANSITIONS = {
    (None, "admit"): "leased",
    (None, "enqueue"): "queued",
    (None, "reject"): "rejected",
    ("queued", "admit"): "leased",
    ("queued", "expire"): "expired",
    ("queued", "cancel"): "cancelled",
    ("leased", "release"): "done",
}


class AdmissionMachine(RuleBasedStateMachine):
    @initialize(
        limit=st.integers(1, 3),
        order=st.sampled_from(["sjf", "fcfs"]),
        reserve=st.booleans(),
        seed=st.integers(0, 99),
    )
    def setup(self, limit, order, reserve, seed):
        self.limit = limit
        self.reserved = {"realtime": 1} if reserve and limit > 1 else {}
        self.ctl = AdmissionController(
            make_policy(limit, order=order, reserved=self.reserved, upstreams=2, stops_on_cancel=(False, "auto")),
            rng=random.Random(seed),
        )
        self.now = 0.0
        self.state: dict[int, str] = {}
        self.tickets: dict[int, object] = {}
        self.leases: dict[int, object] = {}  # ticket id -> live lease
        self.finished: list = []  # released leases

    def move(self, ticket_id: int, event: str) -> None:
        key = (self.state.get(ticket_id), event)
        assert key in TRANSITIONS, f"ticket {ticket_id}: {event} while {key[0]}"
        self.state[ticket_id] = TRANSITIONS[key]

    def absorb(self, decisions) -> None:
        for d in decisions:
            if isinstance(d, Admit):
                self.admitted(d)
            else:
                assert isinstance(d, Expired)
                self.move(d.ticket.id, "expire")

    def admitted(self, d: Admit) -> None:
        self.move(d.ticket.id, "admit")
        t = d.ticket
        if t.deadline != math.inf:  # nothing past its deadline is admitted; from the queue, nothing past its expiry
            assert self.now < t.deadline
            assert d.lease.queue_ms == 0 or self.now < self.ctl.waitline.expires_at(t)
        self.leases[t.id] = d.lease

    @rule(
        klass=st.sampled_from(["realtime", "interactive", "batch"]),
        expected=st.integers(1, 2000),
        budget=st.one_of(st.none(), st.integers(1, 3000)),
    )
    def arrive(self, klass, expected, budget):
        t = ticket(klass, float(expected), deadline=math.inf if budget is None else self.now + budget / 1000.0)
        self.tickets[t.id] = t
        d = self.ctl.arrive(t, self.now)
        if isinstance(d, Admit):
            self.admitted(d)
        else:
            self.move(t.id, "enqueue" if isinstance(d, Enqueue) else "reject")
            assert isinstance(d, (Enqueue, Reject))
        self.absorb(self.ctl.take_woken())

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), outcome=st.sampled_from(list(Outcome)), rtt=st.floats(0.0, 5000.0))
    def finish(self, data, outcome, rtt):
        """Completion, error, upstream failure or client cancellation: all release the lease."""
        ticket_id = data.draw(st.sampled_from(sorted(self.leases)))
        lease = self.leases.pop(ticket_id)
        self.move(ticket_id, "release")
        self.finished.append(lease)
        self.absorb(self.ctl.release(lease, self.now, outcome, rtt))

    @precondition(lambda self: self.finished)
    @rule(data=st.data())
    def release_again(self, data):
        lease = data.draw(st.sampled_from(self.finished))
        used = list(self.ctl.capacity.used)
        try:
            self.ctl.release(lease, self.now, Outcome.SUCCESS, 1.0)
        except LeaseError:
            pass
        else:
            raise AssertionError("a second release must raise")
        assert self.ctl.capacity.used == used

    @precondition(lambda self: any(s == "queued" for s in self.state.values()))
    @rule(data=st.data())
    def client_goes_away_while_queued(self, data):
        ticket_id = data.draw(st.sampled_from(sorted(i for i, s in self.state.items() if s == "queued")))
        assert self.ctl.cancel(ticket_id, self.now)
        self.move(ticket_id, "cancel")
        self.absorb(self.ctl.take_woken())

    @rule(ms=st.integers(0, 1500))
    def time_passes(self, ms):
        self.now += ms / 1000.0
        self.absorb(self.ctl.expire(self.now))
        self.absorb(self.ctl.take_woken())

    @rule(order=st.sampled_from(["sjf", "fcfs"]), limit=st.integers(1, 3))
    def reload(self, order, limit):
        reserved = self.reserved if limit > 1 else {}
        self.reserved = reserved
        self.limit = limit
        policy = make_policy(limit, order=order, reserved=reserved, upstreams=2, stops_on_cancel=(False, "auto"))
        self.absorb(self.ctl.apply_policy(policy, self.now))

    @invariant()
    def books_balance(self):
        if not hasattr(self, "ctl"):
            return
        cap = self.ctl.capacity
        phantoms = len(self.ctl.phantoms)
        assert len(self.leases) == len(self.ctl._leases)
        assert sum(cap.requests) == len(self.leases) + phantoms
        assert sum(cap.used) == len(self.leases) + phantoms  # requests unit
        assert self.ctl.counts["phantoms"] == phantoms + self.ctl.phantoms.ended  # each ends once
        queued = {i for i, s in self.state.items() if s == "queued"}
        assert queued == {e.ticket.id for q in self.ctl.waitline.queues.values() for e in q.entries()}
        for i in range(2):
            assert cap.general[i] >= 0 and cap.used[i] >= 0

    @invariant()
    def never_above_the_limit_unless_it_shrank(self):
        if hasattr(self, "ctl"):
            for i in range(2):
                assert self.ctl.capacity.used[i] <= max(self.ctl.capacity.limit(i), self._limit_at_admission(i))

    def _limit_at_admission(self, i: int) -> int:
        # A reload may lower the limit below what is already in flight; nothing new is admitted then.
        held = sum(1 for lease in self.leases.values() if lease.upstream == i)
        return held + len(self.ctl.phantoms.on(i))

    def teardown(self):
        if hasattr(self, "ctl"):
            for ticket_id in list(self.state):  # the queue leaves first, then every lease ends
                if self.state[ticket_id] == "queued":
                    self.ctl.cancel(ticket_id, self.now)
            assert self.ctl.take_woken() == [] or True
            while self.leases:
                ticket_id, lease = self.leases.popitem()
                self.move(ticket_id, "release")
                self.absorb(self.ctl.release(lease, self.now, Outcome.CANCELLED))
            while (end := self.ctl.next_phantom_end()) is not None:  # time passes: every phantom ends
                self.now = max(self.now, end)
                for d in self.ctl.expire(self.now) + self.ctl.take_woken():
                    if isinstance(d, Admit):  # nothing is queued any more
                        raise AssertionError(d)
            assert self.ctl.phantoms.ended == self.ctl.counts["phantoms"]
            assert sum(self.ctl.capacity.requests) == 0 and sum(self.ctl.capacity.used) == 0


AdmissionMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestAdmissionMachine = AdmissionMachine.TestCase
