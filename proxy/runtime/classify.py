"""Classify a request at the edge: class, cost, tenant and one absolute deadline.

Theory of operation: everything the rest of the path needs to know about a request
is decided here, once, from its header fields (read once, at the edge: proxy/runtime/fields.py) and body: the class from `x-priority`
(unknown values fall back to the policy default and are counted), the cost from
the body (or `x-cost-hint`), the budget from `x-request-timeout-ms` / `grpc-timeout`
(else the class default, capped at the class maximum) turned into an absolute
deadline, and the tenant key for quotas. Malformed headers raise
`proxy.core.wire.HeaderError`, naming the header, which the request path answers
with 400 before any work is done; so does a JSON body nested past what the cost
decoder will recurse into (`BodyError`, a HeaderError naming the body: issue 13
defect 8, formerly a 500 from a RecursionError).
"""

from __future__ import annotations

from proxy.core import deadline as dl
from proxy.core import wire
from proxy.core.cost import CostSource
from proxy.core.decisions import Ticket
from proxy.core.token_bucket import tenant_key
from proxy.policy.schema import Policy
from proxy.runtime.fields import Fields
from proxy.runtime.scheduler import Scheduler


class BodyError(wire.HeaderError):
    """The request body cannot be costed safely (answered 400, like a malformed header)."""

    def __init__(self, problem: str) -> None:
        super().__init__("request body", problem)


def classify(path: bytes, fields: Fields, body: bytes, now: float, scheduler: Scheduler, policy: Policy) -> Ticket:
    """The admission ticket for a request to `path` (its target without the query), from the header
    `fields` the edge read in its one pass (proxy/runtime/fields.py) and its `body`; raises
    wire.HeaderError on a malformed header."""
    priority, timeout, grpc_timeout, cost_hint = fields.priority, fields.timeout, fields.grpc_timeout, fields.cost_hint
    klass = policy.scheduling.default_class if priority is None else scheduler.resolve_class(priority)
    limits = policy.classes[klass]
    budget = dl.budget_ms(timeout, grpc_timeout, default_ms=limits.default_timeout_ms, max_ms=limits.max_timeout_ms)
    hint = None if cost_hint is None else wire.parse_cost_hint(cost_hint)
    # The controller's estimator and ticket directly (scheduler.estimate and .ticket pass them through):
    # two Python calls fewer per request.
    ctl = scheduler.controller
    cost = ctl.estimator.estimate(path.decode("latin-1"), body, hint)
    if cost.source is CostSource.TOO_DEEP:
        raise BodyError("JSON nested too deeply (the sidecar parses bodies to estimate their cost)")
    tenant = b""
    if policy.tenants.enabled:
        tenant = tenant_key(fields.tenant, fields.authorization, trust_x_tenant=policy.tenants.trust_x_tenant)
    return ctl.ticket(klass, cost, dl.deadline_at(now, budget), budget, tenant, now)
