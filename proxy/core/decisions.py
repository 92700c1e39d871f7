"""The values admission trades in: tickets in, decisions and leases out.

Theory of operation: a `Ticket` describes one request at arrival (class, cost,
expected service time, absolute deadline). The controller answers with a
decision value, never an exception: `Admit(lease)`, `Enqueue(...)`,
`Reject(reason, retry_after_ms, message)`, and later, for a queued ticket,
`Admit` or `Expired`. A `Lease` is the right to have one request upstream; it is
released exactly once with an `Outcome` (a second release is a bug and raises
`LeaseError`).

`Reject` is the one refusal value: the arrival gate's rules (proxy/core/shedding.py),
the controller and the request path all return it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from proxy.core.cost import Cost
from proxy.core.quantiles import cost_bucket
from proxy.core.values import Value
from proxy.core.wire import Reason, rejection


class Outcome(enum.Enum):
    """How an admitted request ended; decides what the limit and service model learn."""

    SUCCESS = "success"  # latency sample for the limit, sample for the service model
    DROPPED = "dropped"  # the upstream signalled overload (503/429, timeout): the limit backs off
    ERROR = "error"  # failed for other reasons: no sample
    REFUSED = "refused"  # connection refused: the upstream cools down, no sample
    CANCELLED = "cancelled"  # client gone / cancelled: no sample


class Ticket(Value):
    """One request at arrival: class, cost, expected service time, absolute deadline."""

    _FIELDS = ("id", "klass", "cost", "expected_ms", "deadline", "budget_ms", "tenant")
    # key: how its service-time samples are keyed, (route, cost bucket): derived from cost, made once here
    # (the arrival's p99, the timeout hint and the latency windows each read it).
    __slots__ = (*_FIELDS, "key")

    def __init__(
        self,
        id: int,
        klass: str,
        cost: Cost,
        expected_ms: float,
        deadline: float,  # absolute, seconds on the controller's clock; math.inf: none (probes, tests)
        budget_ms: int | None = None,  # the client's whole budget, for Retry-After on an unmeetable deadline
        tenant: bytes = b"",  # for per-tenant quotas (proxy.core.token_bucket.tenant_key)
    ) -> None:
        self.id = id
        self.klass = klass
        self.cost = cost
        self.expected_ms = expected_ms
        self.deadline = deadline
        self.budget_ms = budget_ms
        self.tenant = tenant
        self.key = (cost.route, cost_bucket(cost.units))

    def with_class(self, klass: str) -> Ticket:
        """The same ticket in another class (a reload removed its own)."""
        return Ticket(self.id, klass, self.cost, self.expected_ms, self.deadline, self.budget_ms, self.tenant)


class Lease(Value):
    """The right to have one request upstream, released exactly once."""

    __slots__ = _FIELDS = ("id", "ticket", "upstream", "units", "admitted_at", "queue_ms", "service_ms")

    def __init__(
        self,
        id: int,
        ticket: Ticket,
        upstream: int,
        units: int,  # charged against the upstream's limit at admission (the limit's unit)
        admitted_at: float,
        queue_ms: float,
        # The service time the deadline rules planned with (AdmissionController.service_ms), computed
        # once: the request path's timeout hint reads it rather than asking again.
        service_ms: float = 0.0,
    ) -> None:
        self.id = id
        self.ticket = ticket
        self.upstream = upstream
        self.units = units
        self.admitted_at = admitted_at
        self.queue_ms = queue_ms
        self.service_ms = service_ms


class Admit(Value):
    __slots__ = _FIELDS = ("lease",)

    def __init__(self, lease: Lease) -> None:
        self.lease = lease

    @property
    def ticket(self) -> Ticket:
        return self.lease.ticket


@dataclass(frozen=True, slots=True)
class Enqueue:
    ticket: Ticket
    depth: int  # live entries in the ticket's class, itself included
    expected_wait_ms: float
    expires_at: float | None  # when the controller will expire it (None: no deadline)


@dataclass(frozen=True, slots=True)
class Reject:
    reason: Reason
    retry_after_ms: int | None = None
    message: str = ""

    def response(self) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Status, headers and JSON body per the wire contract."""
        return rejection(self.reason, self.message or self.reason.value, self.retry_after_ms)


@dataclass(frozen=True, slots=True)
class Expired:
    """A queued ticket whose deadline can no longer be met: answer 504 deadline_expired."""

    ticket: Ticket
    queue_ms: float
    reason: Reason = Reason.DEADLINE_EXPIRED


class ExpiredAt(enum.Enum):
    """Where a request's deadline was found passed: the one rule of 504 deadline_expired, at three stages."""

    ARRIVAL = "the deadline passed before admission"  # core/admission.py arrive
    QUEUED = "the deadline passed while queued"  # runtime/scheduler.py, from the controller's Expired
    UPSTREAM = "the request's deadline passed"  # runtime/relay.py (the pool ended it), request_path.py (the scope)


_EXPIRED = {stage: Reject(Reason.DEADLINE_EXPIRED, None, stage.value) for stage in ExpiredAt}


def deadline_expired(stage: ExpiredAt) -> Reject:
    """The producer of Reason.DEADLINE_EXPIRED (504, no Retry-After: the same request cannot succeed)."""
    return _EXPIRED[stage]


@dataclass(frozen=True, slots=True)
class Observed:
    """What the upstream reported it used (OpenAI `usage`), when it did."""

    prompt_tokens: int | None = None
    output_tokens: int | None = None


class LeaseError(RuntimeError):
    """A lease was released twice or was never granted: a bug in the caller."""
