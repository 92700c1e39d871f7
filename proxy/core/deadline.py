"""Deadlines: the client's budget made absolute, whether it can be met, when to give up.

Theory of operation: at arrival the request's budget comes from `x-request-timeout-ms`
or `grpc-timeout` (the smaller when both are sent: the caller waits for neither
longer), else its class's default, and is capped at the class's maximum. It becomes
one absolute deadline, `now + budget`, that flows down unchanged.

The admission estimate is `completion = now + queue_wait + service`, where
`queue_wait` is what the admission controller expects the request to wait (work queued
ahead / observed drain rate, e.g. `proxy.core.retry_after.drain_ms`) and `service` is
the observed p99 service time of the request's cost bucket, or the model's expected
time while too few samples exist (`service_estimate_ms`). All durations are in ms,
times (`now`, deadlines) in seconds.
Rule: meetable exactly when `queue_wait_ms + service_ms <= remaining_ms`, with
`remaining_ms = (deadline - now) * 1000`.

When it is not, when could it be? A client that retries after r ms with the same budget
B finds the queue ahead drained by r (new arrivals ignored: optimistic, which is why
Retry-After also gets jitter and a floor). It then meets B iff
max(0, queue_wait - r) + service <= B, i.e. never when service > B (only a larger
budget helps), else for r >= queue_wait + service - B.

In-queue expiry: a queued request whose remaining budget is below its expected service
time is dropped (504 deadline_expired), never forwarded: nobody would wait for the
answer. A deadline already passed always expires, even with zero service time.

Timeout hint: the client timeout the sidecar recommends, p99 end-to-end x factor,
clamped to [min, max]; no hint without samples.
"""

from __future__ import annotations

import math

from proxy.core.values import Value
from proxy.core.wire import parse_grpc_timeout_ms, parse_timeout_ms


def budget_ms(request_timeout: bytes | None, grpc_timeout: bytes | None, *, default_ms: int, max_ms: int) -> int:
    """The request's budget in ms. Malformed headers raise `wire.HeaderError` (-> 400)."""
    budget = None
    if request_timeout is not None:
        budget = parse_timeout_ms(request_timeout)
    if grpc_timeout is not None:
        grpc = parse_grpc_timeout_ms(grpc_timeout)
        budget = grpc if budget is None else min(budget, grpc)
    if budget is None:
        budget = default_ms
    return min(budget, max_ms)


def deadline_at(now: float, budget: float) -> float:
    """The absolute deadline (seconds, same clock as `now`) for a budget in ms."""
    return now + budget / 1000


def service_estimate_ms(observed_p99_ms: float | None, model_expected_ms: float) -> float:
    """Observed p99 for the cost bucket when there are enough samples, else the model's guess."""
    return model_expected_ms if observed_p99_ms is None else observed_p99_ms


class Meetable(Value):
    __slots__ = _FIELDS = ("completion", "slack_ms")

    def __init__(self, completion: float, slack_ms: float) -> None:
        self.completion = completion  # estimated completion time, seconds
        self.slack_ms = slack_ms  # remaining budget left over at completion (>= 0)


class Unmeetable(Value):
    __slots__ = _FIELDS = ("completion", "miss_ms", "retry_after_ms")

    def __init__(self, completion: float, miss_ms: float, retry_after_ms: float | None) -> None:
        self.completion = completion
        self.miss_ms = miss_ms  # by how much the estimate overshoots the deadline (> 0)
        # ms after which a retry with the same budget could make it; None: never with this budget.
        self.retry_after_ms = retry_after_ms


def check(
    now: float, deadline: float, queue_wait: float, service: float, budget: float | None = None
) -> Meetable | Unmeetable:
    """Can a request arriving at `now` with `deadline` finish in time? (times in ms but `now`)

    `budget` is the client's whole budget in ms (for the retry estimate); default: what
    remains of it now.
    """
    remaining = (deadline - now) * 1000
    needed = queue_wait + service
    completion = now + needed / 1000
    if needed <= remaining:
        return Meetable(completion, remaining - needed)
    full = remaining if budget is None else budget
    retry = None if service > full else max(0.0, needed - full)
    return Unmeetable(completion, needed - remaining, retry)


def should_expire(now: float, deadline: float, service: float) -> bool:
    """True when a queued request can no longer finish in time: drop it, do not forward it."""
    remaining = (deadline - now) * 1000
    return remaining <= 0 or remaining < service


def timeout_hint_ms(p99_end_to_end_ms: float, factor: float, min_ms: int, max_ms: int) -> int:
    """The client timeout to recommend (x-rampmeter-timeout-hint-ms) for an end-to-end p99."""
    return max(min_ms, min(max_ms, math.ceil(p99_end_to_end_ms * factor)))
