"""The arrival gate: shedding, tenant quota and the deadline check, as one admission check.

Theory of operation: `AdmissionController.arrive` runs its `checks` before a ticket
may queue. `ArrivalGate` is that check. Per arrival it reads a `LoadSnapshot` of
the controller (queue depth per class rank, head wait, in-flight against the limit,
queue growth and drain rate, GPU memory pressure), estimates whether the ticket's
deadline can be met (expected queue wait ahead of it + observed p99 service time of
its (route, cost bucket), or the model's estimate while samples are few), and hands
both to `proxy.core.shedding.arrival_verdict`, which applies, in order: tenant quota
(429), the load rules lowest class first (503 queue_full / gpu_pressure /
overloaded), then the deadline (503 deadline_unmeetable unless the class says try).

Class rank (0 = most important) follows the scheduling mode: strict by `priority`,
weighted by descending `weight`; ties by name, so ranks are stable across reloads.
The gate is rebuilt whole on a policy reload (`proxy.runtime` does that).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from proxy.core import deadline as dl
from proxy.core.decisions import Reject, Ticket
from proxy.core.quantiles import LatencyFamily, cost_bucket
from proxy.core.service_model import ServiceModels
from proxy.core.shedding import Shedder, arrival_verdict
from proxy.core.token_bucket import TenantQuota

if TYPE_CHECKING:
    from proxy.core.admission import AdmissionController
    from proxy.policy.schema import Policy

_NO_DEADLINE = dl.Meetable(float("inf"), float("inf"))


def ranked_classes(policy: Policy) -> tuple[str, ...]:
    """Class names, most important first, as the shedding rules rank them."""
    classes = policy.classes
    if policy.scheduling.class_mode == "weighted":
        return tuple(sorted(classes, key=lambda n: (-classes[n].weight, classes[n].priority, n)))
    return tuple(sorted(classes, key=lambda n: (classes[n].priority, -classes[n].weight, n)))


def service_key(ticket: Ticket) -> tuple[str, int]:
    """How service-time samples are keyed: (route, power-of-two cost bucket)."""
    return ticket.cost.route, cost_bucket(ticket.cost.units)


class ArrivalGate:
    """`(controller, ticket, now) -> Reject | None`, for `AdmissionController.checks`."""

    def __init__(
        self,
        policy: Policy,
        shedder: Shedder,
        tenants: TenantQuota | None,
        service_ms: LatencyFamily,
        models: ServiceModels | None = None,
    ) -> None:
        self.ranked = ranked_classes(policy)
        self._rank = {name: i for i, name in enumerate(self.ranked)}
        self._on_unmeetable = {name: c.on_unmeetable for name, c in policy.classes.items()}
        self.shedder, self.tenants, self._service_ms = shedder, tenants, service_ms
        self.models = models  # the controller's, for censored floors raised since a ticket arrived
        self.gpu_memory_fraction = 0.0  # fed by the GPU sampler / upstream metrics, in [0, 1]

    def __call__(self, ctl: AdmissionController, ticket: Ticket, now: float) -> Reject | None:
        snap = ctl.load_snapshot(now, self.ranked, self.gpu_memory_fraction)
        return arrival_verdict(
            self.shedder,
            snap,
            self._rank[ticket.klass],
            now,
            self.deadline_verdict(ctl, ticket, now),
            self._on_unmeetable[ticket.klass],
            self.tenants,
            ticket.tenant,
        )

    def rank(self, klass: str) -> int:
        """The class's rank (0 = most important); the lowest for a class a reload removed."""
        return self._rank.get(klass, len(self.ranked) - 1)

    def service_ms(self, ticket: Ticket, now: float) -> float:
        """Observed p99 service time for the ticket's cost bucket, else the model's estimate;
        never below the censored floor of its shape: the p99 of the requests that finished is
        a survivor's figure when most are cut (proxy/core/censored.py)."""
        p99 = self._service_ms.quantile(service_key(ticket), 0.99, now)
        estimate = dl.service_estimate_ms(p99, ticket.expected_ms)
        if self.models is None:
            return estimate
        c = ticket.cost
        return max(estimate, self.models.floor_ms(c.route, c.prompt_tokens, c.output_tokens, now))

    def deadline_verdict(self, ctl: AdmissionController, ticket: Ticket, now: float) -> dl.Meetable | dl.Unmeetable:
        if ticket.deadline == math.inf:
            return _NO_DEADLINE
        wait_ms = ctl.expected_wait_ms(ticket.klass, ticket.expected_ms, now)
        return dl.check(now, ticket.deadline, wait_ms, self.service_ms(ticket, now), ticket.budget_ms)

    def __repr__(self) -> str:
        return f"<ArrivalGate ranks={self.ranked} gpu={self.gpu_memory_fraction:.2f} {self.shedder!r}>"
