"""The arrival gate: shedding, tenant quota and the deadline check, as one admission check.

Theory of operation: `AdmissionController.arrive` calls its `gate` (given at
construction, rebuilt whole on a policy reload) before a ticket may queue, with
the ticket's expected service time (computed once by the controller) and the
load estimator (proxy/core/load.py); the gate never calls back into the
controller. Per arrival it reads a `LoadSnapshot` (queue depth per class rank,
head wait, in-flight against the limit, queue growth and drain rate, GPU memory
pressure), estimates whether the ticket's deadline can be met (expected queue
wait ahead of it + that service time), and hands both to
`proxy.core.shedding.arrival_verdict`, which applies, in order: tenant quota
(429), the load rules lowest class first (503 queue_full / gpu_pressure /
overloaded), then the deadline (503 deadline_unmeetable unless the class says try).

The controller also tells the gate of each dequeue (`dequeued`: the class's CoDel
sees the wait where it ends) and asks it for a full queue's Retry-After, so the
jitter and bounds are the shedding rules' everywhere.

Class rank (0 = most important) follows the scheduling mode: strict by `priority`,
weighted by descending `weight`; ties by name, so ranks are stable across reloads.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from proxy.core import deadline as dl
from proxy.core.decisions import Reject, Ticket
from proxy.core.shedding import Shedder, arrival_verdict
from proxy.core.token_bucket import TenantQuota

if TYPE_CHECKING:
    from proxy.core.load import LoadEstimator
    from proxy.policy.schema import Policy

_NO_DEADLINE = dl.Meetable(float("inf"), float("inf"))


def ranked_classes(policy: Policy) -> tuple[str, ...]:
    """Class names, most important first, as the shedding rules rank them."""
    classes = policy.classes
    if policy.scheduling.class_mode == "weighted":
        return tuple(sorted(classes, key=lambda n: (-classes[n].weight, classes[n].priority, n)))
    return tuple(sorted(classes, key=lambda n: (classes[n].priority, -classes[n].weight, n)))


def service_key(ticket: Ticket) -> tuple[str, int]:
    """How service-time samples are keyed: (route, power-of-two cost bucket), made with the ticket."""
    return ticket.key


class ArrivalGate:
    """The controller's `gate` (proxy.core.admission.Gate)."""

    def __init__(self, policy: Policy, shedder: Shedder, tenants: TenantQuota | None) -> None:
        self.ranked = ranked_classes(policy)
        self._rank = {name: i for i, name in enumerate(self.ranked)}
        self._on_unmeetable = {name: c.on_unmeetable for name, c in policy.classes.items()}
        self.shedder, self.tenants = shedder, tenants
        self.gpu_memory_fraction = 0.0  # fed by the GPU sampler / upstream metrics, in [0, 1]

    def __call__(self, ticket: Ticket, now: float, load: LoadEstimator, service_ms: float) -> Reject | None:
        rank = self._rank[ticket.klass]
        gpu = self.gpu_memory_fraction
        # Fast path: nothing queued and room under the limit, the usual case: no snapshot unless a
        # rule might shed (Shedder.passes_quiet), only the quota and the deadline left to judge.
        if load.quiet() and self.shedder.passes_quiet(rank, now, gpu, *load.service_quantiles(now)):
            snap = None
        else:
            snap = load.snapshot(now, self.ranked, gpu)
        deadline = self.deadline_verdict(ticket, now, load, service_ms)
        if snap is None and self.tenants is None and deadline.__class__ is dl.Meetable:
            return None  # what arrival_verdict answers here (no quota, no load rule, the deadline holds), one call less
        return arrival_verdict(
            self.shedder,
            snap,
            rank,
            now,
            deadline,
            self._on_unmeetable[ticket.klass],
            self.tenants,
            ticket.tenant,
            remaining_ms=(ticket.deadline - now) * 1000.0,  # no pushback past the deadline (Shedder._reject)
        )

    def passes_at_once(self, ticket: Ticket, now: float, load: LoadEstimator, service_ms: float) -> bool:
        """True where `__call__` answers None for an arrival that finds the load quiet (`load.quiet()`)
        and a slot free for it at once, so its expected wait is 0 (AdmissionController.admit_at_once);
        False: ask `__call__`. That answer, spelled out: no tenant quota, the shedding rules' quiet pass
        (Shedder.passes_quiet: no snapshot) and the deadline covering the service time (dl.check with a
        zero wait: Meetable iff 0 + service_ms <= the remaining ms)."""
        if self.tenants is not None:
            return False
        rank = self._rank[ticket.klass]
        if not self.shedder.passes_quiet(rank, now, self.gpu_memory_fraction, *load.service_quantiles(now)):
            return False
        return ticket.deadline == math.inf or service_ms <= (ticket.deadline - now) * 1000

    def rank(self, klass: str) -> int:
        """The class's rank (0 = most important); the lowest for a class a reload removed."""
        return self._rank.get(klass, len(self.ranked) - 1)

    def dequeued(self, klass: str, wait_ms: float, now: float) -> None:
        rank = self._rank.get(klass)  # self.rank(klass), inline: once per admission
        self.shedder.on_dequeue(wait_ms, len(self.ranked) - 1 if rank is None else rank, now)

    def retry_after(self, wait_ms: float) -> int:
        return self.shedder.retry_after(wait_ms)

    def pushback(self, wait_ms: float, now: float, slot_ms: float, remaining_ms: float) -> int | None:
        return self.shedder.retry_after.schedule(wait_ms, now, slot_ms, remaining_ms)

    def deadline_verdict(
        self, ticket: Ticket, now: float, load: LoadEstimator, service_ms: float
    ) -> dl.Meetable | dl.Unmeetable:
        if ticket.deadline == math.inf:
            return _NO_DEADLINE
        wait_ms = load.expected_wait_ms(ticket.klass, ticket.expected_ms, now)
        verdict = dl.check(now, ticket.deadline, wait_ms, service_ms, ticket.budget_ms)
        if type(verdict) is dl.Unmeetable:
            # The starvation bound's promise (proxy/core/sjf.py): a request FCFS would finish in time falls
            # due early enough to be served in time, however much shorter work overtakes it meanwhile.
            promised = load.promised_wait_ms(ticket.klass, now)
            if promised is not None and promised < wait_ms:
                kept = dl.check(now, ticket.deadline, promised, service_ms, ticket.budget_ms)
                if type(kept) is dl.Meetable:
                    return kept
        return verdict

    def __repr__(self) -> str:
        return f"<ArrivalGate ranks={self.ranked} gpu={self.gpu_memory_fraction:.2f} {self.shedder!r}>"
