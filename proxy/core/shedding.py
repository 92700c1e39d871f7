"""Load shedding at arrival: say no fast, usefully, lowest class first.

Theory of operation: before a request is enqueued, `Shedder.check(snapshot, rank, now)`
decides from a `LoadSnapshot` (the admission controller's statistics, mapped by the
caller) whether to shed it. Classes are ranked 0 (most important) .. n-1. Every
threshold in the policy is the *top* class's; class r gets `weights[r]` of it, with
weights[0] == 1 and non-increasing (see `class_weights`). The rules, in order:

1. queue_length: with ahead_r = requests queued in classes 0..r (what a class-r request
   waits behind), shed if ahead_r >= max(1, floor(max_queued * w_r)) -> 503 queue_full
2. gpu_memory: shed if gpu_memory_fraction >= 1 - (1 - high_water) / w_r (lower classes
   need proportionally more free memory)                            -> 503 gpu_pressure
3. saturation: in-flight at the limit and the queue growing, by at least
   growth_ratio * w_r times the drain rate (any growth when nothing drains)
                                                                    -> 503 overloaded
4. codel: one CoDel per class (as fq_codel keeps one per queue; see `proxy.core.codel`),
   fed that class's own waits: each dequeued request's, and at every arrival the age
   of the class's oldest queued request. While a class's own queue stands, its arrivals
   are shed by CoDel's control law (one at once, then one per interval/sqrt(n)); every
   arrival of a class below a standing one is shed (it waits behind it)
                                                                    -> 503 overloaded
   One CoDel over all classes could not see a standing batch queue under strict
   priority: the short waits of the interactive requests being served kept its minimum
   low, so batch waited out its deadline in the queue (bench/overload at 2x: 97 batch
   requests answered 504 after ~9 s instead of 503 with Retry-After at arrival).
   In the backend's own time scale (issue 12: a 500 ms target is meaningless when one
   request takes seconds, and CoDel shed a quarter of a 4-client closed loop): target
   = max(codel_target_ms, target_p50_ratio x observed p50 service time), interval =
   max(codel_interval_ms, interval_p99_ratio x observed p99), the policy's values
   being floors. And CoDel never sheds a request whose deadline the queue ahead of it
   would drain within (`in_time`: the deadline check found it meetable): such a queue
   is doing its job, so a closed loop of N clients that the queue can hold within
   their deadlines is never shed. Requests without a deadline have nothing to drain
   within, and CoDel judges them as before.
Class order holds by construction: ahead_r grows with r while every threshold shrinks
(and a class is CoDel-shed whenever one above it is), so under one snapshot, if class r
is shed, every class below it is too. Each rule is O(1) or O(classes), allocation-free
but for the Reject value.

`arrival_verdict` composes the whole arrival gate, in this order: tenant quota (429, so
the over-quota tenant hears the precise reason), load rules, then the deadline check
(503 deadline_unmeetable when the class's on_unmeetable is "reject"). Tokens taken by a
request that a later rule rejects are refunded.

Retry-After: the time for the queue ahead and one more request (ahead_r + 1) to drain
at the observed rate (the max when nothing drains), scheduled behind the retries already
promised, one slot (1 / drain rate) each, none past the caller's deadline (`RetryAfter.schedule`,
as for a full class queue: a retry told the plain drain time found the queue refilled);
for tenant quota, the exact refill time;
for an unmeetable deadline, the deadline module's estimate (no header when only a larger
budget would help).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Literal

from proxy.core import deadline as dl
from proxy.core.codel import CoDel, CoDelStatistics, Mode
from proxy.core.decisions import Reject
from proxy.core.retry_after import RetryAfter, drain_ms
from proxy.core.token_bucket import TenantQuota
from proxy.core.wire import Reason

DROPPING = Mode.DROPPING  # a module constant: passes_quiet compares to it per arrival


def class_weights(n_classes: int, step: float) -> tuple[float, ...]:
    """Share of each threshold per class rank: (1 - step) ** rank, so 1.0 for the top class."""
    if not (n_classes >= 1 and 0 <= step < 1):
        raise ValueError("need n_classes >= 1 and 0 <= step < 1")
    return tuple((1 - step) ** r for r in range(n_classes))


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """What the shedding rules read; the caller maps the admission controller's statistics."""

    queued_by_class: tuple[int, ...]  # requests queued now, per class rank (0 = most important)
    head_wait_ms: float = 0.0  # age of the oldest queued request; 0 when the queue is empty
    inflight: int = 0  # requests upstream now
    limit: int = 0  # the concurrency limit in force (0: unknown, saturation rule off)
    queue_growth_per_s: float = 0.0  # d(queue length)/dt, requests/s, smoothed by the caller
    drain_rate_per_s: float = 0.0  # completions/s, smoothed by the caller
    gpu_memory_fraction: float = 0.0  # in [0, 1], from the GPU sampler; 0 when unknown
    # head_wait_ms per class rank; () when the caller does not say (then head_wait_ms for each)
    head_wait_by_class: tuple[float, ...] = ()
    service_p50_ms: float = 0.0  # observed service time of completed requests; 0 when unknown
    service_p99_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class ShedConfig:
    """The core's view of `[shedding]`; None turns a rule off. Built by proxy.policy.shedding."""

    weights: tuple[float, ...]
    max_queued: int | None = 1024
    gpu_memory_high_water: float | None = 0.95
    saturation_growth_ratio: float | None = 0.5
    codel_target_ms: float | None = 50.0  # a floor once the service time is known
    codel_interval_ms: float = 500.0  # a floor, as the target
    codel_target_p50_ratio: float = 0.0  # target >= this x observed p50 service time (0: fixed)
    codel_interval_p99_ratio: float = 0.0  # interval >= this x observed p99 service time (0: fixed)


@dataclass(frozen=True, slots=True)
class ShedStatistics:
    shed: dict[str, int] = field(default_factory=dict)  # by reason
    codel: tuple[CoDelStatistics, ...] | None = None  # per class rank
    codel_target_ms: float | None = None  # in force now (scaled to the service time)
    codel_interval_ms: float | None = None
    codel_spared: int = 0  # arrivals a dropping CoDel let through: their deadline held


class Shedder:
    def __init__(self, config: ShedConfig, retry_after: RetryAfter) -> None:
        w = config.weights
        if not w or w[0] != 1.0 or any(a < b or b <= 0 for a, b in itertools.pairwise(w)) or w[-1] <= 0:
            raise ValueError("weights must start at 1.0 and be positive and non-increasing")
        self.config, self.retry_after = config, retry_after
        self.n_classes = len(w)
        # Per-class thresholds, precomputed: every check is then a compare.
        mq, hw, gr = config.max_queued, config.gpu_memory_high_water, config.saturation_growth_ratio
        self._queue_cap = None if mq is None else tuple(max(1, math.floor(mq * x)) for x in w)
        self._gpu_cap = None if hw is None else tuple(1 - (1 - hw) / x for x in w)
        self._growth_cap = None if gr is None else tuple(gr * x for x in w)
        target = config.codel_target_ms
        self.codels = (
            None if target is None else tuple(CoDel(target, config.codel_interval_ms) for _ in range(self.n_classes))
        )
        self._shed = {reason: 0 for reason in (Reason.QUEUE_FULL, Reason.GPU_PRESSURE, Reason.OVERLOADED)}
        self._scale = (0.0, 0.0)  # the (p50, p99) the CoDels were last tuned to
        # Until then every CoDel's running interval holds a 0 wait already (the minimum any wait can
        # reach): observing another changes nothing, so the quiet path and on_dequeue skip it.
        self._zeros_until = -math.inf
        self.spared = 0  # arrivals CoDel would have shed, spared because their deadline holds

    def on_dequeue(self, wait_ms: float, rank: int, now: float) -> None:
        """Feed the class's CoDel the wait of each of its requests that leaves the queue."""
        if self.codels is not None and not now < self._zeros_until:
            self.codels[rank].observe(wait_ms, now)

    def codel_scale(self, p50_ms: float, p99_ms: float) -> tuple[float, float]:
        """(target_ms, interval_ms) for an observed service time (the policy's values as floors)."""
        c = self.config
        target = max(c.codel_target_ms or 0.0, c.codel_target_p50_ratio * p50_ms)
        interval = max(c.codel_interval_ms, c.codel_interval_p99_ratio * p99_ms, target)
        return target, interval

    def _retune(self, snap: LoadSnapshot, now: float) -> None:
        scale = (snap.service_p50_ms, snap.service_p99_ms)
        if scale == self._scale or self.codels is None:
            return
        self._scale = scale
        self._zeros_until = -math.inf  # a retune may move the intervals' ends
        target, interval = self.codel_scale(*scale)
        for codel in self.codels:
            codel.retune(target, interval, now)

    def check(
        self, snap: LoadSnapshot, rank: int, now: float, in_time: bool = False, remaining_ms: float = math.inf
    ) -> Reject | None:
        """None to go on, or why this class-`rank` arrival is shed. `in_time`: its deadline
        holds with the queue ahead of it (CoDel spares it); `remaining_ms`: to its deadline."""
        codels = self.codels
        if codels is not None:
            self._retune(snap, now)
            waits = snap.head_wait_by_class or (snap.head_wait_ms,) * len(codels)
            for codel, wait_ms in zip(codels, waits, strict=False):
                codel.observe(wait_ms, now)
        ahead = sum(snap.queued_by_class[: rank + 1])
        if self._queue_cap is not None and ahead >= self._queue_cap[rank]:
            return self._reject(
                Reason.QUEUE_FULL, "the queue for this priority is full", ahead, snap, now, remaining_ms
            )
        if self._gpu_cap is not None and snap.gpu_memory_fraction >= self._gpu_cap[rank]:
            return self._reject(Reason.GPU_PRESSURE, "GPU memory is under pressure", ahead, snap, now, remaining_ms)
        if self._growth_cap is not None and self._saturated(snap, self._growth_cap[rank]):
            return self._reject(Reason.OVERLOADED, "the model server is saturated", ahead, snap, now, remaining_ms)
        if codels is not None and (any(codels[k].dropping for k in range(rank)) or codels[rank].dropping):
            if in_time:
                self.spared += 1
            elif any(codels[k].dropping for k in range(rank)) or codels[rank].take_drop(now):
                return self._reject(Reason.OVERLOADED, "requests are queueing too long", ahead, snap, now, remaining_ms)
        return None

    def passes_quiet(self, rank: int, now: float, gpu_memory_fraction: float, p50_ms: float, p99_ms: float) -> bool:
        """`check` for an arrival that finds nothing queued and room under the limit (the caller
        knows: LoadEstimator.quiet), without a snapshot: True when no rule sheds it, False when
        one might (the caller then runs `check` on a full snapshot, which gives the same verdict:
        what this did to the CoDels, retune and a zero wait observed, `check` repeats idempotently).
        With nothing queued the queue_length rule needs ahead >= 1 and saturation in-flight at the
        limit, so neither can fire; the GPU rule and a dropping CoDel can."""
        codels = self.codels
        if codels is not None:
            if (p50_ms, p99_ms) != self._scale:
                self._retune(LoadSnapshot((), service_p50_ms=p50_ms, service_p99_ms=p99_ms), now)
            if not now < self._zeros_until:  # else each running interval holds a 0 already: a no-op
                for codel in codels:
                    codel.observe(0.0, now)
                self._zeros_until = min(codel.interval_end for codel in codels)
            for k in range(rank + 1):
                if codels[k].mode is DROPPING:  # CoDel.dropping's test, without the property call
                    return False
        return self._gpu_cap is None or gpu_memory_fraction < self._gpu_cap[rank]

    @staticmethod
    def _saturated(snap: LoadSnapshot, growth_cap: float) -> bool:
        if snap.limit <= 0 or snap.inflight < snap.limit or snap.queue_growth_per_s <= 0:
            return False
        if snap.drain_rate_per_s <= 0:
            return True
        return snap.queue_growth_per_s >= growth_cap * snap.drain_rate_per_s

    def _reject(
        self, reason: Reason, message: str, ahead: int, snap: LoadSnapshot, now: float, remaining_ms: float
    ) -> Reject:
        self._shed[reason] += 1
        # Room for it once the queue ahead has drained and then one more request finished, behind the
        # retries already promised, one slot each: a request finishes every 1 / drain rate.
        rate = snap.drain_rate_per_s
        if rate <= 0:  # nothing finished yet: no slot interval to schedule by, only the bound (the max)
            return Reject(reason, self.retry_after(drain_ms(ahead + 1, rate)), message)
        return Reject(
            reason, self.retry_after.schedule(drain_ms(ahead + 1, rate), now, 1000.0 / rate, remaining_ms), message
        )

    def statistics(self) -> ShedStatistics:
        codel = None if self.codels is None else tuple(c.statistics() for c in self.codels)
        target = interval = None
        if self.codels:
            target, interval = self.codels[0].target_ms, self.codels[0]._interval_s * 1000.0
        return ShedStatistics({r.value: n for r, n in self._shed.items()}, codel, target, interval, self.spared)

    def __repr__(self) -> str:
        return f"Shedder(classes={self.n_classes}, shed={ {r.value: n for r, n in self._shed.items()} }, codel={self.codels!r})"


def arrival_verdict(
    shedder: Shedder,
    snap: LoadSnapshot | None,
    rank: int,
    now: float,
    deadline: dl.Meetable | dl.Unmeetable,
    on_unmeetable: Literal["reject", "try"] = "reject",
    tenants: TenantQuota | None = None,
    tenant: bytes = b"",
    cost: float = 1,
    remaining_ms: float = math.inf,
) -> Reject | None:
    """The whole arrival gate: tenant quota, load rules, deadline. None: enqueue it. `snap` None:
    the load rules were found to pass already (`Shedder.passes_quiet`)."""
    if tenants is not None:
        wait_s = tenants.take(tenant, now, cost)
        if wait_s:
            retry = shedder.retry_after(wait_s * 1000.0)
            return Reject(Reason.TENANT_QUOTA, retry, "this tenant is over its request quota")
    in_time = isinstance(deadline, dl.Meetable) and math.isfinite(deadline.completion)
    verdict = None if snap is None else shedder.check(snap, rank, now, in_time, remaining_ms)
    if verdict is None and isinstance(deadline, dl.Unmeetable) and on_unmeetable == "reject":
        verdict = deadline_unmeetable(shedder, deadline)
    if verdict is not None and tenants is not None:
        tenants.refund(tenant, cost)
    return verdict


_NO_TIME_TO_WAIT = Reject(Reason.DEADLINE_UNMEETABLE, None, "the deadline leaves no time to wait for a slot")


def deadline_unmeetable(shedder: Shedder | None, verdict: dl.Unmeetable | None) -> Reject:
    """The producer of Reason.DEADLINE_UNMEETABLE: the deadline rule's verdict at arrival, or (None)
    a ticket the rule let through that must queue but whose expiry has come (no time to wait at all,
    core/admission.py arrive). Retry-After only where waiting would help, jittered by the shedder."""
    if verdict is None:
        return _NO_TIME_TO_WAIT
    wait_ms = verdict.retry_after_ms
    retry = None if wait_ms is None or shedder is None else shedder.retry_after(wait_ms)
    return Reject(Reason.DEADLINE_UNMEETABLE, retry, _unmeetable_message(verdict))


def _unmeetable_message(verdict: dl.Unmeetable) -> str:
    if verdict.retry_after_ms is None:
        return "the request's timeout is shorter than its expected service time; raise it"
    return "the request cannot finish before its deadline at the current load"
