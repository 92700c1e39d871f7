"""The admission controller: who goes upstream now, who waits, who is told no.

Theory of operation (decide under bookkeeping, act outside): every method takes
`now` and returns decision values (proxy/core/decisions.py); the trio layer
(proxy/runtime/scheduler.py) wakes the waiters those decisions name.

- `arrive(ticket, now)`: a past deadline is rejected (DEADLINE_EXPIRED); then the expected
  service time is computed, once (`service_ms`: the observed p99 of the ticket's cost
  bucket, else the model's estimate, never below the censored floor of its shape), and
  the arrival `gate` given at construction (proxy/core/arrival.py: tenant quota, shedding
  rules, the deadline check) judges the ticket from that figure and the load estimator
  (proxy/core/load.py), never calling back into the controller; then, with nobody
  waiting, the ticket is placed at once if some upstream has room. Otherwise it joins its
  class queue and a dispatch round runs (it may still be first in line, or fit a
  reserved slot); if it is still waiting and its class is over
  `max_queue_length`, it leaves again with Reject(CLASS_QUEUE_FULL) (the shedding
  rules' queue_full is a different cap: shedding.max_queued_requests over the classes
  at or above it). One that would have to wait but is already past its expiry time
  (it cannot afford any wait) leaves with DEADLINE_UNMEETABLE, built where that
  reason always is (core/shedding.py deadline_unmeetable).
- `admit_at_once(ticket, now)`: the same decision for the usual arrival (nobody queued, no
  phantom lease, one upstream with room, the limit in requests, no reservations), in one call
  and without the values only the general path needs (the snapshot, the wait estimate, the
  Admit): the Lease, or None where any of that does not hold, and the caller asks `arrive`.
- Dequeue: every admission tells the gate (`gate.dequeued`: CoDel sees each queue wait
  where it ends), and the lease carries `service_ms`: the arrival's figure for a ticket
  admitted at once, a fresh one for a queued ticket (floors may have risen while it
  waited). A queued ticket of an on_unmeetable = "reject" class whose remaining time no
  longer covers that figure is not admitted: it expires (docs/shedding.md, the arrival
  rule again at dequeue); "try" classes go ahead while any time is left.
- Dispatch round (after every event that can free room): offer the slot to
  overdue entries first (past their due time: `scheduling.fcfs_wait_multiple`
  times the FCFS wait they faced at arrival, `fcfs_wait_ms`, or their class's
  max_queue_wait_ms; earliest due first, whatever their class), then to class
  heads in `ClassPicker` order. The
  first candidate that fits is admitted and the round starts over; once one
  does not fit, the general pool is held for it and later candidates may only
  use their own reserved slots (no overtaking, so big requests are not starved).
- A queued ticket whose deadline can no longer be met is never admitted: it
  expires at its expiry time (proxy/core/waitline.py: deadline - expected
  service time, or the deadline for on_unmeetable = "try" classes), found by
  `expire(now)` or by a dispatch round that reaches it. Decisions for *other*
  waiters (Admit, Expired) go to an outbox that `take_woken()` empties; callers
  drain it after each call (`release` returns it directly).
- `release(lease, now, outcome, rtt_ms, observed)` ends a lease exactly once,
  feeds the limit (SUCCESS, DROPPED), the service model (SUCCESS; CANCELLED with
  the time it had upstream is a censored sample), the balancer (REFUSED), then
  dispatches.
- Dispatch in groups (`limits.dispatch_batch` > 1): while tickets wait, a round runs only once
  some upstream has a whole group free (that many requests, or as many as wait, or its whole
  limit), so a batcher that cuts batches by arrival time gets them together; a group's slots
  come back together when its batch ends, and a split batch heals at the next round.
- Phantom leases (proxy/core/phantoms.py): a lease released CANCELLED after time
  upstream, on an upstream that keeps computing after a disconnect
  (`upstreams[i].stops_on_cancel`, or "auto" until learned), keeps its units
  charged for its expected remaining service time: the backend still does that
  work. Every call settles the phantoms that are due first (`next_phantom_end()`
  says when the next one is; the runtime wakes then and calls `expire`).
  `note_engine(i, running, waiting, now)` feeds the engine's own gauges: they
  teach "auto" whether cut requests stay in the engine.
- Unjudged routes: while a route's service model has nothing but priors (no
  completed sample, no informative cut, no warm-up probe), at most
  `scheduling.unjudged_in_flight` requests of it that carry a deadline are
  upstream at once; the others wait for the first answer, which judges them
  (a prior is a guess: issue 12's embeddings server took seconds where the
  prior said 9 ms, and every request was forwarded into a 200 ms deadline).
  A held ticket does not hold the general pool: others pass it.

Reload (`apply_policy`): queued tickets survive and are re-keyed under the new
order/aging (O(n log n), reloads are rare); tickets of a class that no longer
exists move to the new default class. In-flight leases are re-counted under the
new unit and reservations; a changed `[limits]` section restarts the limits.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from proxy.core import deadline as dl
from proxy.core.balancer import Balancer
from proxy.core.capacity import Capacity
from proxy.core.cost import Cost, CostEstimator
from proxy.core.decisions import (
    Admit,
    Enqueue,
    Expired,
    ExpiredAt,
    Lease,
    LeaseError,
    Observed,
    Outcome,
    Reject,
    Ticket,
    deadline_expired,
)
from proxy.core.limits import make_limit
from proxy.core.load import LoadEstimator
from proxy.core.phantoms import STOPS, CancelHabit, Phantoms
from proxy.core.quantiles import LatencyFamily
from proxy.core.service_model import ServiceModels
from proxy.core.shedding import deadline_unmeetable
from proxy.core.sjf import Entry
from proxy.core.waitline import Waitline
from proxy.core.wire import Reason

if TYPE_CHECKING:
    import random

    from proxy.core.phantoms import Phantom
    from proxy.policy.schema import Policy


class Gate(Protocol):
    """The arrival rules (proxy/core/arrival.py ArrivalGate), as the controller uses them."""

    def __call__(self, ticket: Ticket, now: float, load: LoadEstimator, service_ms: float) -> Reject | None:
        """None to go on, or why the ticket is refused at arrival."""
        ...

    def retry_after(self, wait_ms: float) -> int:
        """Retry-After (ms) for a full queue whose back waits `wait_ms`."""
        ...

    def dequeued(self, klass: str, wait_ms: float, now: float) -> None:
        """A ticket of `klass` left the queue for upstream after `wait_ms`."""
        ...

    # Optional: `passes_at_once(ticket, now, load, service_ms) -> bool`, True where `__call__` would
    # answer None for an arrival that finds the load quiet and a slot free at once (AdmissionController
    # .admit_at_once); a gate without it is asked through `__call__` every time.

    def pushback(self, wait_ms: float, now: float, slot_ms: float, remaining_ms: float) -> int | None:
        """Retry-After (ms) for a full queue behind the retries already promised (RetryAfter.schedule)."""
        ...


_NOTHING_OBSERVED = Observed()
# Completed samples folded at once on the quiet path (release): the model already solves theta
# once per SOLVE_EVERY (proxy/core/service_model.py); the same count bounds how stale a limit is.
SAMPLE_BATCH = 16
# The route models learn from this many completed samples a second at most (_fold): past that rate each
# more sample costs CPU (a few us) and tells a model with a 500-sample memory little it did not know.
LEARN_PER_S = 200.0
LEARN_BURST = float(SAMPLE_BATCH)
# A ticket that would have to queue but cannot afford any wait (now >= its expiry time).
_NO_TIME_TO_WAIT = deadline_unmeetable(None, None)


class AdmissionController:
    def __init__(
        self,
        policy: Policy,
        upstream_count: int | None = None,
        rng: random.Random | None = None,
        *,
        balancer: Balancer | None = None,
        gate: Gate | None = None,
        service: LatencyFamily | None = None,
    ) -> None:
        """`rng` breaks the balancer's ties; give one, or a ready `balancer`. `gate`: the arrival
        rules (none: every arrival goes on); `service`: observed service times per (route, cost
        bucket), the p99 the deadline rules read (none: the model's estimates alone)."""
        self.upstream_count = n = upstream_count or len(policy.upstreams)
        if balancer is None:
            if rng is None:
                raise ValueError("an injected random.Random (rng) or a balancer is required")
            balancer = Balancer(n, _cooldowns(policy, n), rng=rng)
        self.balancer = balancer
        self.service = service
        self._set_gate(gate)
        self._ticket_ids, self._lease_ids = itertools.count(1), itertools.count(1)
        self._leases: dict[int, Lease] = {}
        self._charges: dict[int, int] = {}  # lease id -> units charged now (re-counted on reload)
        self.outbox: list[Admit | Expired] = []  # decisions for other waiters, until take_woken()
        # Completed samples not yet fed to the limits, load and models (release, _fold).
        self._samples: list[tuple[int, float, int, Ticket, float, Observed | None, float]] = []
        self._learn_credit, self._learn_at = LEARN_BURST, -math.inf  # the models' learning rate (_fold)
        self._newcomer: int | None = None  # the ticket whose own decision arrive() returns
        self._newcomer_admit: Admit | None = None
        self._newcomer_service_ms = 0.0
        self.phantoms = Phantoms()
        self.habits: list[CancelHabit] = []
        self._probes: dict[str, int] = {}  # route -> its unjudged requests upstream
        self._probe_leases: set[int] = set()
        self._now = 0.0
        self.counts = {
            "admitted": 0,
            "expired": 0,
            "abandoned": 0,
            "released": 0,
            "phantoms": 0,
            "held_for_group": 0,
            "not_learned": 0,
        }
        self.rejected: dict[str, int] = {}  # reason -> count
        self.models = ServiceModels()
        self.waitline = Waitline(policy.scheduling, policy.classes)
        self.load: LoadEstimator  # built by _configure, once capacity exists
        self._configure(policy, None, 0.0)

    def _set_gate(self, gate: Gate | None) -> None:
        self.gate = gate
        # admit_at_once asks the gate's quiet pass: none to ask without a gate (every arrival goes on);
        # a gate without one (a test's stand-in) is asked through arrive, every time.
        self._gate_at_once: Callable[[Ticket, float, LoadEstimator, float], bool] = (
            _passes if gate is None else getattr(gate, "passes_at_once", _asks_arrive)
        )

    # --- arrival ----------------------------------------------------------

    def resolve_class(self, value: bytes | str | None) -> tuple[str, bool]:
        """(class, known) for an x-priority value; absent or unknown -> the default class."""
        if value:
            name = (value.decode("latin-1") if isinstance(value, bytes) else value).strip().lower()
            if name in self.waitline.queues:
                return name, True
            return self.waitline.default_class, False
        return self.waitline.default_class, True

    def estimate(self, path: str, body: bytes, hint: int | None = None) -> Cost:
        return self.estimator.estimate(path, body, hint)

    def ticket(
        self,
        klass: str,
        cost: Cost,
        deadline: float = math.inf,
        budget_ms: int | None = None,
        tenant: bytes = b"",
        now: float | None = None,
    ) -> Ticket:
        """A ticket with its expected service time from the route's learned model (never below
        the censored floor of its shape at `now`, unless it goes as that floor's probe:
        core/censored.py; `now` default: the controller's last event time)."""
        now = self._now if now is None else now
        tid, models, route, units = next(self._ticket_ids), self.models, cost.route, float(cost.units)
        expected = models.expected_ms(route, cost.prompt_tokens, cost.output_tokens, units, now)
        if (
            deadline != math.inf
            and route not in models.settled  # settled: no floor, so no probe (ServiceModels.settled)
            and models.probe(route, cost.prompt_tokens, cost.output_tokens, tid, deadline, now)
        ):
            expected = models.expected_ms(route, cost.prompt_tokens, cost.output_tokens, units)  # a probe: no floor
        return Ticket(tid, klass, cost, expected, deadline, budget_ms, tenant)

    def admit_at_once(self, ticket: Ticket, now: float) -> Lease | None:
        """`arrive` for the usual arrival, in one call: the Lease its Admit would carry, or None where
        this is not that case (then call `arrive`, which decides it; nothing was changed here but what
        `arrive` repeats idempotently: the quantile windows' caches, the CoDels' zero waits).

        The usual case, as `arrive` would find it: no phantom lease to settle, nobody queued (so
        `load.quiet()` holds and no pending sample is folded first), one upstream, the limit in
        requests with no reservations (the ticket's one unit fits iff used < limit: what
        `LoadEstimator.expected_wait_ms` also finds, so the gate's wait is 0), room under the limit,
        the deadline ahead, the gate's quiet pass (`passes_at_once`: what its `__call__` answers None
        for, a zero wait given) and the route judged or under its unjudged cap. Then `arrive` admits
        the ticket at once, to upstream 0 with a charge of 1, and this does the same
        (tests/core/test_admit_at_once.py: both decide alike, and leave the controller alike)."""
        cap = self.capacity
        if (
            self.phantoms.live
            or self.waitline.entries
            or not self._unit_requests
            or cap.reserved_total
            or len(cap.limits) != 1
            or now >= ticket.deadline
        ):
            return None
        limit = cap.limits[0].value if cap.factors[0] == 1.0 else cap.limit(0)  # cap.limit(0), its fast case inline
        if limit <= 0 or cap.used[0] >= limit or cap.requests[0] >= limit:
            return None
        self._now = now
        service_ms = self.service_ms(ticket, now)
        if not self._gate_at_once(ticket, now, self.load, service_ms):
            return None
        if not (
            ticket.deadline == math.inf  # _held, as in arrive
            or ticket.cost.route in self.models.settled  # judged, read without a call
            or self._probes.get(ticket.cost.route, 0) < self._unjudged_in_flight
            or self.models.judged(ticket.cost.route)
        ):
            return None
        self.load.accepted(ticket, now)
        return self._lease(ticket, 0, 1, now, now, service_ms)

    def arrive(self, ticket: Ticket, now: float) -> Admit | Enqueue | Reject:
        # Per request: the common case (nothing queued, room under the limit) runs here with few
        # calls; attribute reads stand in for the small methods that said the same (len(line.entries)
        # for len(line), phantoms.live for _settle's test, _held's and _place's bodies inline).
        self._now = now
        if self.phantoms.live:
            self._settle(now)
        line = self.waitline
        load = self.load
        if self._samples and not load.quiet():
            self._fold()  # not the quiet fast path: the limit and the estimates it is judged by are current
        if ticket.id in line.entries:
            raise ValueError(f"ticket {ticket.id} is already queued")
        if now >= ticket.deadline:
            return self._reject(deadline_expired(ExpiredAt.ARRIVAL))
        service_ms = self.service_ms(ticket, now)
        if self.gate is not None:
            verdict = self.gate(ticket, now, load, service_ms)
            if verdict is not None:
                return self._reject(verdict)
        alone = not line.entries
        route = ticket.cost.route
        if alone and (
            ticket.deadline == math.inf  # _held: no deadline, nothing to protect
            or self._probes.get(route, 0) < self._unjudged_in_flight
            or self.models.judged(route)
        ):
            units = 1 if self._unit_requests else max(1, ticket.cost.units)  # _units
            placed = self.capacity.place(ticket.klass, units, now, self.balancer, False)
            if placed is not None:
                load.accepted(ticket, now)
                return self._admit(ticket, placed, now, now, service_ms)
        slot_ms = load.slot_ms(ticket.expected_ms)
        entry = line.push(ticket, now, fcfs_wait_ms=load.fcfs_wait_ms(now), slot_ms=slot_ms)
        load.arrived(now)
        if not alone:  # alone, it just failed to fit: a round would fail the same way
            self._newcomer, self._newcomer_admit, self._newcomer_service_ms = ticket.id, None, service_ms
            try:
                self._dispatch(now)
            finally:
                self._newcomer = None
            if self._newcomer_admit is not None:
                load.accepted(ticket, now)
                return self._newcomer_admit
        expires_at = line.expires_at(ticket)
        if expires_at is not None and now >= expires_at:  # it must wait, and cannot afford to
            self._remove(entry)
            return self._reject(_NO_TIME_TO_WAIT)
        if line.depth(ticket.klass) > line.classes[ticket.klass].max_queue_length:
            self._remove(entry)
            back_ms = load.expected_wait_ms(ticket.klass, float("inf"), now)
            retry_ms: int | None  # None: no retry can start before the deadline
            if self.gate is None:
                retry_ms = default_retry_after(back_ms)
            else:  # behind the retries already promised, a slot interval each (core/retry_after.py schedule)
                slot_ms = load.slot_ms(ticket.expected_ms) / max(1, sum(self.capacity.requests))
                retry_ms = self.gate.pushback(back_ms, now, slot_ms, (ticket.deadline - now) * 1000.0)
            message = f"the {ticket.klass} queue is at its max_queue_length"
            return self._reject(Reject(Reason.CLASS_QUEUE_FULL, retry_ms, message))
        load.accepted(ticket, now)  # accepted work only: it is what takes slots
        wait = load.expected_wait_ms(ticket.klass, ticket.expected_ms, now, exclude=entry)
        return Enqueue(ticket, line.depth(ticket.klass), wait, expires_at)

    # --- events that free room or end waits -------------------------------

    def release(
        self,
        lease: Lease,
        now: float,
        outcome: Outcome,
        rtt_ms: float | None = None,
        observed: Observed | None = None,
    ) -> list[Admit | Expired]:
        """End `lease` (exactly once) and return the decisions for the waiters it woke."""
        self._now = now
        if self._leases.pop(lease.id, None) is None:
            raise LeaseError(f"lease {lease.id} released twice or never granted")
        if outcome is not Outcome.SUCCESS:
            self._fold()  # the samples taken before this event first: the limit and models hear them in order
        if self.phantoms.live:
            self._settle(now)
        i, t = lease.upstream, lease.ticket
        inflight = self.capacity.used[i]
        charge = self._charges.pop(lease.id)
        load = self.load
        load.inflight_expected_ms -= t.expected_ms
        cut = outcome is Outcome.CANCELLED and rtt_ms is not None
        if (
            cut and rtt_ms is not None
        ):  # cut after rtt_ms upstream: a censored sample, and maybe work the backend still does
            self.models.censored(t.cost.route, t.cost.prompt_tokens, t.cost.output_tokens, rtt_ms, now)
        remaining = self._remaining_ms(lease, rtt_ms, now) if cut and rtt_ms is not None else 0.0
        if remaining > 0.0:
            self.phantoms.add(lease, charge, now, remaining)
            self._charges[lease.id] = charge  # still charged, re-counted on reload
            load.inflight_expected_ms += remaining
            self.counts["phantoms"] += 1
        else:
            self.capacity.give(i, t.klass, charge)
        probe = lease.id in self._probe_leases
        if probe:
            self._probe_leases.discard(lease.id)
            self._probes[t.cost.route] -= 1
        load.released(now)
        self.counts["released"] += 1
        if outcome is Outcome.SUCCESS and rtt_ms is not None:
            if observed is not None and not observed.prompt_tokens and not observed.output_tokens:
                observed = None  # usage all zeros (LitServe reports that): it reported nothing
            # Taken now, folded in batches (_fold): with nobody queued nothing reads these samples
            # before the next few releases; a queue, a judging (probe) sample, a model still in
            # warm-up (its first samples move it off the priors) or any other event folds at once.
            per = (
                latency_tokens(t, observed, self.models.fill(t.cost.route, t.cost.output_tokens))
                if self._per_token
                else 1
            )
            samples = self._samples
            samples.append((i, rtt_ms / per, inflight, t, rtt_ms, observed, now))
            route = t.cost.route
            if probe or (
                route not in self.models.settled  # settled: past warm-up, no floor standing
                and (
                    self.models.warming(route) or self.models.floored(route, t.cost.prompt_tokens, t.cost.output_tokens)
                )
            ):  # a judging answer (a probe, a model in warm-up, a shape a censored floor condemns): learned
                self._fold(learn_last=True)  # whatever the rate, and at once: it moves the next estimates
            elif len(samples) >= SAMPLE_BATCH or self.waitline.entries:
                self._fold()
        elif outcome is Outcome.REFUSED:
            self.balancer.mark_refused(i, now)
        elif outcome is Outcome.DROPPED:  # overload signal: back off, latency or not
            self.capacity.limits[i].on_sample(now, rtt_ms or 0.0, inflight, True)
        if self.waitline.entries:  # nobody waiting (the usual case): no round to run
            self._dispatch(now)
        woken, self.outbox = self.outbox, []  # take_woken(), inline: once per request
        return woken

    def _fold(self, learn_last: bool = False) -> None:
        """Feed the completed samples taken since the last fold, in order: each upstream's limit, the
        load estimator's service times, the route models (one loop per model: ServiceModels.learn_many).
        `learn_last`: the last sample judges its route (release) and is learned whatever the rate."""
        samples = self._samples
        if not samples:
            return
        self._samples = []
        limits, load = self.capacity.limits, self.load
        learned = []
        # The models learn from LEARN_PER_S samples a second at most (a credit that refills with time,
        # LEARN_BURST deep): below that rate, from every one; above it, from an even share, so their
        # memory (memory_samples) spans at least memory_samples / LEARN_PER_S seconds. The limits and
        # the load estimator still take every sample.
        credit, last = self._learn_credit, self._learn_at
        judging = samples[-1] if learn_last else None
        for sample in samples:
            i, latency, inflight, t, rtt_ms, observed, now = sample
            if i < len(limits):  # a reload may have dropped the upstream
                limits[i].on_sample(now, latency, inflight, False)
            load.completed(rtt_ms, now)
            credit = min(LEARN_BURST, credit + (now - last) * LEARN_PER_S)
            last = now
            if credit >= 1.0:
                credit -= 1.0
            elif sample is not judging:
                self.counts["not_learned"] += 1
                continue
            c, o = t.cost, observed or _NOTHING_OBSERVED
            learned.append(
                (
                    c.route,
                    c.prompt_tokens,
                    c.output_tokens,
                    t.expected_ms,
                    rtt_ms,
                    o.prompt_tokens,
                    o.output_tokens,
                    now,
                )
            )
        self._learn_credit, self._learn_at = credit, last
        self.models.learn_many(learned)

    def flush(self) -> None:
        """Fold the completed samples taken so far (introspection and tests read a current state)."""
        self._fold()

    def _remaining_ms(self, lease: Lease, elapsed_ms: float, now: float) -> float:
        """What a cut request still costs its upstream: 0 if it stops on cancel, else its expected
        total (the model's, never below the censored floor the cut just raised) less what it had."""
        if not self.habits[lease.upstream].keeps_computing:
            return 0.0
        t = lease.ticket
        c = t.cost
        total = max(
            t.expected_ms, self.models.expected_ms(c.route, c.prompt_tokens, c.output_tokens, t.expected_ms, now)
        )
        return max(0.0, total - elapsed_ms)

    def _settle(self, now: float) -> bool:
        """End the phantoms that are due; True when any did (room freed)."""
        if not self.phantoms:  # the usual case, on every event: no list built
            return False
        ended = self.phantoms.due(now)
        for p in ended:
            self._end_phantom(p)
        return bool(ended)

    def _end_phantom(self, p: Phantom) -> None:
        lease = p.lease
        self.capacity.give(lease.upstream, lease.ticket.klass, self._charges.pop(lease.id))
        self.load.inflight_expected_ms -= p.remaining_ms

    def next_phantom_end(self) -> float | None:
        """When the next phantom lease ends (None: none held)."""
        return self.phantoms.next_end()

    def note_engine(
        self, index: int, running: float | None, waiting: float | None, now: float
    ) -> list[Admit | Expired]:
        """The engine's own request gauges for upstream `index` (None: unknown): teach "auto"
        whether cut requests stay in the engine; returns the waiters woken."""
        self._now = now
        self._fold()
        self._settle(now)
        live = self.capacity.requests[index] - len(self.phantoms.on(index))
        if running is not None and index < len(self.habits):
            active = running + (waiting or 0.0)
            if self.habits[index].observe_engine(active, live, self.phantoms.on(index), now):
                for p in self.phantoms.drop(index):  # it stops on cancel: those slots are free
                    self._end_phantom(p)
                live = self.capacity.requests[index]
        if (running is not None or waiting is not None) and self._unit_requests:
            self.capacity.limits[index].on_engine(running, waiting or 0.0, live, now)
        self._dispatch(now)
        return self.take_woken()

    def learn_probe(self, path: str, body: bytes, latency_ms: float, now: float) -> None:
        """A warm-up probe of this request took `latency_ms`: a sample before any real traffic
        (the route is judged from then on), then dispatch, since held tickets may now go."""
        self._now = now
        self._fold()
        self._settle(now)
        c = self.estimator.estimate(path, body)
        self.models.seed(c.route, c.prompt_tokens, c.output_tokens, latency_ms, now)
        self._dispatch(now)

    def cancel(self, ticket_id: int, now: float) -> bool:
        """A queued ticket's client went away: it leaves the queue now. False if it was not queued."""
        self._now = now
        self._settle(now)
        entry = self.waitline.get(ticket_id)
        if entry is None:
            return False
        self._remove(entry)
        self.counts["abandoned"] += 1
        self._dispatch(now)  # it may have held the general pool
        return True

    def expire(self, now: float) -> list[Expired]:
        """Queued tickets whose deadline can no longer be met (answer 504 deadline_expired); also
        ends the phantom leases that are due (and admits into the room they leave: take_woken)."""
        self._now = now
        freed = self._settle(now)
        due = self.waitline.pop_due(now)
        for _ in due:
            self.load.left(now)
        self.counts["expired"] += len(due)
        if due or freed:
            self._dispatch(now)
        return [Expired(e.ticket, (now - e.enqueued_at) * 1000.0) for e in due]

    def set_capacity_factor(self, index: int, factor: float, now: float) -> list[Admit | Expired]:
        """Scale upstream `index`'s limit (slow start ramp; 0 closes it). Returns woken waiters."""
        self.capacity.factors[index] = max(0.0, factor)
        self._settle(now)
        self._dispatch(now)
        return self.take_woken()

    def mark_refused(self, index: int, now: float) -> None:
        self.balancer.mark_refused(index, now)

    def take_woken(self) -> list[Admit | Expired]:
        out, self.outbox = self.outbox, []
        return out

    def depth(self, klass: str) -> int:
        return self.waitline.depth(klass)

    def expiry_of(self, ticket_id: int) -> float | None:
        """When a queued ticket expires (None: not queued, or no deadline)."""
        return self.waitline.expiry_of(ticket_id)

    def next_expiry(self) -> float | None:
        return self.waitline.next_expiry()

    # --- placement and dispatch -------------------------------------------

    def _units(self, ticket: Ticket) -> int:
        """What the ticket counts against a limit: 1 request, or its tokens."""
        return 1 if self._unit_requests else max(1, ticket.cost.units)

    def _held(self, ticket: Ticket) -> bool:
        """Waits for its route's first answer (see "Unjudged routes" in the module docstring)."""
        if ticket.deadline == math.inf:  # no deadline (probes, tests): nothing to protect
            return False
        route = ticket.cost.route
        return self._probes.get(route, 0) >= self._unjudged_in_flight and not self.models.judged(route)

    def _probes_held(self) -> bool:
        """Some route is at its unjudged in-flight cap (the dispatch round must skip its tickets)."""
        cap = self._unjudged_in_flight
        return any(n >= cap for n in self._probes.values())

    def _held_entry(self, entry: Entry) -> bool:
        return self._held(entry.ticket)

    def _place(self, ticket: Ticket, now: float, reserve_only: bool) -> tuple[int, int] | None:
        return self.capacity.place(ticket.klass, self._units(ticket), now, self.balancer, reserve_only)

    def _admit(
        self, ticket: Ticket, placed: tuple[int, int], now: float, enqueued_at: float, service_ms: float
    ) -> Admit:
        return Admit(self._lease(ticket, placed[0], placed[1], now, enqueued_at, service_ms))

    def _lease(self, ticket: Ticket, i: int, charge: int, now: float, enqueued_at: float, service_ms: float) -> Lease:
        queue_ms = (now - enqueued_at) * 1000.0
        lease = Lease(next(self._lease_ids), ticket, i, charge, now, queue_ms, service_ms)
        if self.gate is not None:
            self.gate.dequeued(ticket.klass, queue_ms, now)
        self.capacity.take(i, ticket.klass, charge)
        self._leases[lease.id] = lease
        self._charges[lease.id] = charge
        self.load.inflight_expected_ms += ticket.expected_ms
        route = ticket.cost.route
        if ticket.deadline != math.inf and route not in self.models.settled and not self.models.judged(route):
            # a probe of an unjudged route
            self._probe_leases.add(lease.id)
            self._probes[route] = self._probes.get(route, 0) + 1
        self.counts["admitted"] += 1
        return lease

    def _dispatch(self, now: float) -> None:
        """Admit (or expire) waiting tickets while room allows; see the module docstring."""
        line, cap = self.waitline, self.capacity
        if self._dispatch_batch > 1 and line.entries and not self._batch_room():
            self.counts["held_for_group"] += 1
            return  # freed slots held for a whole group (expiries are found by expire(now))
        while line.entries:
            if not cap.has_room():
                return  # the usual saturated case; expiries are found by expire(now)
            progressed = blocked = False
            skip = self._held_entry if self._probes_held() else None
            for entry, weighted_pick in line.candidates(now, skip):
                t = entry.ticket
                expires_at = line.expires_at(t)
                if expires_at is not None and now >= expires_at and t.id != self._newcomer:
                    self._remove(entry)
                    self.counts["expired"] += 1
                    self.outbox.append(Expired(t, (now - entry.enqueued_at) * 1000.0))
                    progressed = True
                    break
                placed = self._place(t, now, reserve_only=blocked)
                if placed is None:
                    blocked = True  # hold the general pool for it: later candidates use reservations only
                    continue
                if weighted_pick:
                    line.commit(t.klass)
                self._remove(entry)
                if t.id == self._newcomer:  # judged a moment ago, from the same figure
                    service_ms = self._newcomer_service_ms
                else:
                    service_ms = self.service_ms(t, now)
                    if self._too_late(t, now, service_ms):  # likely cut at its deadline: not started
                        self.counts["expired"] += 1
                        self.outbox.append(Expired(t, (now - entry.enqueued_at) * 1000.0))
                        progressed = True
                        break
                admit = self._admit(t, placed, now, entry.enqueued_at, service_ms)
                if t.id == self._newcomer:
                    self._newcomer_admit = admit
                else:
                    self.outbox.append(admit)
                progressed = True
                break
            if not progressed:
                return

    def _batch_room(self) -> bool:
        """`limits.dispatch_batch`: some upstream has a whole group free (the group: dispatch_batch
        requests, or as many as wait, or its whole limit, whichever is least). Never holds for ever:
        room only grows as leases end, and with none in flight an upstream's whole limit is free."""
        cap, group = self.capacity, min(self._dispatch_batch, len(self.waitline.entries))
        return any(cap.limit(i) - used >= min(group, cap.limit(i)) for i, used in enumerate(cap.used))

    def _remove(self, entry: Entry) -> None:
        self.waitline.remove(entry)
        self.load.left(self._now)

    def _too_late(self, ticket: Ticket, now: float, service_ms: float) -> bool:
        """The arrival's deadline rule again at dequeue, for on_unmeetable = "reject" classes: the
        queue's own expiry uses the mean expected time; work that would likely be cut at its
        deadline is not started (docs/shedding.md). "try" classes go ahead while time is left."""
        cls = self.waitline.classes.get(ticket.klass)
        return cls is not None and cls.on_unmeetable == "reject" and dl.should_expire(now, ticket.deadline, service_ms)

    def service_ms(self, ticket: Ticket, now: float) -> float:
        """The service time the deadline rules plan with: the observed p99 of the ticket's cost
        bucket, else the model's estimate; never below the censored floor of its shape (the p99
        of the requests that finished is a survivor's figure when most are cut, core/censored.py)."""
        c = ticket.cost
        p99 = None if self.service is None else self.service.quantile(ticket.key, 0.99, now)
        estimate = dl.service_estimate_ms(p99, ticket.expected_ms)
        if c.route in self.models.settled:  # no censored floor on it (ServiceModels.settled)
            return estimate
        return max(estimate, self.models.floor_ms(c.route, c.prompt_tokens, c.output_tokens, now, ticket.id))

    def _reject(self, verdict: Reject) -> Reject:
        rejected = self.rejected
        rejected[verdict.reason.value] = rejected.get(verdict.reason.value, 0) + 1
        return verdict

    # --- policy -----------------------------------------------------------

    def apply_policy(
        self, policy: Policy, now: float, gate: Gate | None = None, service: LatencyFamily | None = None
    ) -> list[Admit | Expired]:
        """Swap the policy, with the arrival gate and service-time family built for it (None: keep
        the ones in force); queued tickets and leases survive (see the module docstring)."""
        self._now = now
        self._fold()
        if gate is not None:
            self._set_gate(gate)
        if service is not None:
            self.service = service
        self._configure(policy, self.policy, now)
        self._dispatch(now)
        return self.take_woken()

    def _configure(self, policy: Policy, old: Policy | None, now: float) -> None:
        self.policy = policy
        sched, limits = policy.scheduling, policy.limits
        self._unit_requests = limits.unit == "requests"
        self._dispatch_batch = limits.dispatch_batch if self._unit_requests else 1
        self._per_token = limits.latency_measure == "ms_per_token"
        self._unjudged_in_flight = sched.unjudged_in_flight or float("inf")
        self.estimator = CostEstimator(policy.routes, sched.parse_max_bytes)
        self.waitline.configure(sched, policy.classes, now)
        self.models.configure(
            (*policy.routes, self.estimator.route_for("/")),
            sched.model_memory_samples,
            sched.model_prior_samples,
        )
        self._configure_capacity(policy, old)
        if not hasattr(self, "load"):
            self.load = LoadEstimator(policy, self.waitline, self.capacity)
        else:
            self.load.capacity = self.capacity  # rebuilt by _configure_capacity
            self.load.configure(policy)
        if len(policy.upstreams) == self.upstream_count:
            self.balancer.set_cooldowns(_cooldowns(policy, self.upstream_count))
        self._configure_habits(policy)

    def _configure_habits(self, policy: Policy) -> None:
        """One CancelHabit per upstream; what "auto" learned survives a reload that keeps "auto"."""
        ups = getattr(policy, "upstreams", ())
        settings = [ups[i].stops_on_cancel if i < len(ups) else "auto" for i in range(self.upstream_count)]
        old = self.habits
        self.habits = [
            old[i] if i < len(old) and old[i].setting == setting else CancelHabit(setting)
            for i, setting in enumerate(settings)
        ]

    def _configure_capacity(self, policy: Policy, old: Policy | None) -> None:
        """New limits if [limits] changed; in-flight leases re-counted under the new unit and reservations."""
        n = self.upstream_count
        previous = getattr(self, "capacity", None)
        if previous is not None and old is not None and old.limits == policy.limits:
            limits = previous.limits
        else:
            limits = [make_limit(policy.limits) for _ in range(n)]
        self.capacity = cap = Capacity(limits, dict(policy.scheduling.reserved_slots))
        if previous is not None:
            cap.factors = list(previous.factors)
        held = [*self._leases.values(), *(p.lease for p in self.phantoms)]
        self._charges = cap.recount((lz.id, lz.upstream, lz.ticket.klass, self._units(lz.ticket)) for lz in held)

    def statistics(self, now: float | None = None) -> dict[str, Any]:
        self._fold()
        now = self._now if now is None else now
        classes = self.waitline.statistics(now)
        arrivals, leaves, drain = self.load.rates(now)
        cap = self.capacity
        return {
            "order": self.policy.scheduling.order,
            "class_mode": self.policy.scheduling.class_mode,
            "unit": self.policy.limits.unit,
            "queued": len(self.waitline),
            "classes": classes,
            "queued_by_class": tuple(c["depth"] for c in classes.values()),  # best class first
            "head_wait_ms": max((c["oldest_wait_ms"] for c in classes.values()), default=0.0),
            "upstreams": cap.statistics(),
            "inflight_requests": sum(cap.requests),
            "inflight_units": sum(cap.used),
            "limit_total": sum(cap.limit(i) for i in range(len(cap))),
            "dispatch_batch": self._dispatch_batch,
            "drain_rate_per_s": drain,
            "queue_growth_per_s": arrivals - leaves,
            "queue_growing": bool(len(self.waitline)) and arrivals > leaves,
            "counts": {**self.counts, "rejected": dict(self.rejected)},
            "phantoms": self.phantoms.statistics(now),
            "stops_on_cancel": [h.state == STOPS if h.state != "unknown" else "auto" for h in self.habits],
            "models": self.models.statistics(now),
            "balancer": self.balancer.statistics(now),
        }

    def __repr__(self) -> str:
        return f"<AdmissionController {self.waitline!r} leases={len(self._leases)} {self.capacity!r}>"


def _passes(ticket: Ticket, now: float, load: LoadEstimator, service_ms: float) -> bool:
    return True  # no gate: every arrival goes on


def _asks_arrive(ticket: Ticket, now: float, load: LoadEstimator, service_ms: float) -> bool:
    return False  # a gate without passes_at_once: AdmissionController.arrive asks it


def latency_tokens(ticket: Ticket, observed: Observed | None, fill: float) -> int:
    """What `ms_per_token` divides by: generated tokens (a TPOT-like figure, since
    decode time dominates and grows with the batch); for requests that generate
    nothing (embeddings), their input tokens. Observed counts when the upstream
    reported usage, else the estimate (requested output x the learned fill ratio)."""
    cost = ticket.cost
    if observed is not None and observed.output_tokens is not None:
        output = observed.output_tokens
    else:
        output = round(cost.output_tokens * fill)
    if output > 0:
        return output
    prompt = cost.prompt_tokens if observed is None or observed.prompt_tokens is None else observed.prompt_tokens
    return max(1, prompt)


def default_retry_after(wait_ms: float) -> int:
    """Retry-After for a full queue without a gate: the wait at the back of the class's queue,
    0.5-60 s. The gate's (proxy/core/retry_after.py) brings jitter and the policy's bounds."""
    return int(min(60_000.0, max(500.0, wait_ms)))


def _cooldowns(policy: Policy, n: int) -> list[float] | float:
    ups = getattr(policy, "upstreams", ())
    return [u.cooldown_s for u in ups] if len(ups) == n else (ups[0].cooldown_s if ups else 5.0)
