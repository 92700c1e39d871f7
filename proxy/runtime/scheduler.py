"""The trio driver of admission: waits where the core says wait, wakes whom it says wake.

Theory of operation: `AdmissionController` (proxy/core/admission.py) decides;
this layer keeps one `_Waiter` (an Event and a result) per queued request and
delivers the decisions the controller returns after each call. Time is
`trio.current_time()`, so autojump_clock drives every timer in tests.

Usage, on the request path (no exception for a rejection: a value, as everywhere):

    klass = scheduler.resolve_class(priority_header)  # once, at the edge (proxy/runtime/classify.py)
    ticket = scheduler.ticket(klass, scheduler.estimate(path, body, hint), deadline)
    with trio.move_on_at(deadline):                 # the caller's one deadline
        async with scheduler.admit(ticket) as slot:
            if slot.rejection is not None:          # Reject: answer it (slot.rejection.response())
                ...
            ... forward to upstream slot.upstream ...
            slot.done(Outcome.SUCCESS, rtt_ms, Observed(prompt, output))

Exactly-once release: the lease is released by `slot.done(...)` or, failing
that, by leaving the `async with` (CANCELLED on trio.Cancelled, with the time
since admission: the request was cut after that long upstream, a censored
sample for the service model; ERROR on any other exception or a plain exit
without done). A request whose task is
cancelled while queued leaves the queue at once (the core's `cancel`) and is
never forwarded: if an Admit reached it in the same instant, the lease goes
straight back. Waiting is bounded by the caller's cancel scope and by the
controller's expiry time (deadline minus expected service time), after which
the slot carries Reject(DEADLINE_EXPIRED).

Reload: `apply_policy` swaps the controller's policy, with the arrival gate and the
service-time family built for it (queued requests stay, see the core), and re-arms
every waiter's expiry timer.

Phantom leases (proxy/core/phantoms.py) end on a timer: `run()` (a task the app
starts) sleeps until the controller's next phantom end, calls `expire` there and
delivers whom the freed room admits; a new phantom that ends sooner wakes it.
Without the task phantoms still end, at the next event that reaches the core.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import trio

from proxy.core.admission import AdmissionController, Gate
from proxy.core.cost import Cost
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
from proxy.core.quantiles import LatencyFamily
from proxy.core.wire import Reason

if TYPE_CHECKING:
    from proxy.core.balancer import Balancer
    from proxy.metrics import Metrics
    from proxy.policy.schema import Policy
    from proxy.runtime.relay import Forwarded


class Slot:
    """What `admit` yields: a lease to use, or the rejection to answer."""

    __slots__ = ("_done", "_scheduler", "lease", "rejection")

    def __init__(self, scheduler: Scheduler, lease: Lease | None, rejection: Reject | None) -> None:
        self._scheduler = scheduler
        self.lease = lease
        self.rejection = rejection
        self._done = False

    @property
    def upstream(self) -> int:
        return self.lease.upstream  # type: ignore[union-attr]

    @property
    def queue_ms(self) -> float:
        return 0.0 if self.lease is None else self.lease.queue_ms

    @property
    def service_ms(self) -> float:
        """The service time admission planned this request with (computed once, by the controller)."""
        return 0.0 if self.lease is None else self.lease.service_ms

    def done(
        self,
        outcome: Outcome,
        rtt_ms: float | None = None,
        observed: Observed | None = None,
        now: float | None = None,
    ) -> None:
        """End the lease; feeds the limit and the service model. Once only. `now`: the trio time
        the caller read already in this step (the end of the exchange), else read here."""
        if self.lease is None or self._done:
            raise LeaseError("done() on a slot without a live lease")
        self._done = True
        self._scheduler._release(self.lease, outcome, rtt_ms, observed, now)

    def finished(self, r: Forwarded) -> None:
        """The relay's `on_complete` (relay.forward, Batcher.forward): the upstream's part is over, before
        the last write to the client. A deadline the pool ended it at is a censored cut, as the scope's
        cancellation would be (`cut`); else the lease ends with the outcome, the service time and the end
        time the relay read: `done`, inline (one call a request fewer, and no closure made per request)."""
        if r.reason is Reason.DEADLINE_EXPIRED:
            self.cut()
            return
        if self.lease is None or self._done:
            raise LeaseError("done() on a slot without a live lease")
        self._done = True
        self._scheduler._release(self.lease, r.outcome, r.service_ms, r.observed, r.ended_at)

    @property
    def released(self) -> bool:
        return self._done

    def close(self, exc_type: type[BaseException] | None) -> None:
        """Leaving the lease's scope (`exc_type`: the exception it leaves by, None for a plain exit): a
        lease not ended yet ends here, CANCELLED on trio.Cancelled (cut after this long upstream: a
        censored sample), else ERROR. What `async with scheduler.admit(...)` does on exit."""
        if self.lease is not None and not self._done:
            if exc_type is not None and issubclass(exc_type, trio.Cancelled):
                self.cut()
            else:
                self.done(Outcome.ERROR)

    def cut(self) -> None:
        """End a forwarded lease that was cut (deadline, client gone): CANCELLED with the time since
        admission, a censored sample, as leaving the `async with` on trio.Cancelled gives."""
        if self.lease is None:
            raise LeaseError("cut() on a slot without a live lease")
        self.done(Outcome.CANCELLED, (trio.current_time() - self.lease.admitted_at) * 1000.0)

    def __repr__(self) -> str:
        state = "rejected" if self.rejection else ("done" if self._done else "leased")
        return f"<Slot {state} lease={self.lease and self.lease.id} upstream={self.lease and self.lease.upstream}>"


class _Admission:
    """`async with scheduler.admit(ticket) as slot`: a class, not a generator, to stay cheap."""

    __slots__ = ("_now", "_scheduler", "_slot", "_ticket")

    def __init__(self, scheduler: Scheduler, ticket: Ticket, now: float | None) -> None:
        self._scheduler, self._ticket, self._now = scheduler, ticket, now
        self._slot: Slot | None = None

    async def __aenter__(self) -> Slot:
        slot = self._slot = await self._scheduler._acquire(self._ticket, self._now)
        return slot

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if self._slot is not None:
            self._slot.close(exc_type)
        return False


class _Waiter:
    __slots__ = ("event", "result", "scope")

    def __init__(self, expires_at: float | None) -> None:
        self.event = trio.Event()
        self.result: Admit | Expired | None = None
        self.scope = trio.CancelScope(deadline=math.inf if expires_at is None else expires_at)


class Scheduler:
    def __init__(
        self,
        policy: Policy,
        upstream_count: int | None = None,
        *,
        rng: random.Random | None = None,
        metrics: Metrics | None = None,
        balancer: Balancer | None = None,
        gate: Gate | None = None,
        service: LatencyFamily | None = None,
    ) -> None:
        rng = rng if rng is not None else random.Random()
        self.controller = AdmissionController(
            policy, upstream_count, rng, balancer=balancer, gate=gate, service=service
        )
        self._waiters: dict[int, _Waiter] = {}
        self._phantom_changed = trio.Event()
        self._m = _Instruments(metrics, self.controller) if metrics is not None else None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """End phantom leases on time (see the module docstring); runs until cancelled."""
        task_status.started()
        ctl = self.controller
        while True:
            at = ctl.next_phantom_end()
            with trio.move_on_at(math.inf if at is None else at):
                await self._phantom_changed.wait()
            self._phantom_changed = trio.Event()
            if at is not None and trio.current_time() >= at:
                self._deliver(ctl.expire(trio.current_time()))
                self._deliver(ctl.take_woken())

    def note_engine(self, index: int, running: float | None, waiting: float | None) -> None:
        """The engine's own gauges for upstream `index` (running, waiting requests; None unknown)."""
        self._deliver(self.controller.note_engine(index, running, waiting, trio.current_time()))
        if self._m:
            self._m.limit_changes(index)

    # --- the request path's calls -----------------------------------------

    def estimate(self, path: str, body: bytes, hint: int | None = None) -> Cost:
        return self.controller.estimate(path, body, hint)

    def ticket(
        self,
        klass: str,
        cost: Cost,
        deadline: float = math.inf,
        budget_ms: int | None = None,
        tenant: bytes = b"",
        now: float | None = None,
    ) -> Ticket:
        """The ticket for a request of `klass` (resolved already: `resolve_class`); `now`: the trio
        time the caller read in this step (a clock read costs three Python calls), else read here."""
        return self.controller.ticket(
            klass, cost, deadline, budget_ms, tenant, trio.current_time() if now is None else now
        )

    def resolve_class(self, priority: bytes | str | None) -> str:
        """The class for an x-priority value; unknown values fall back to the default and are counted."""
        klass, known = self.controller.resolve_class(priority)
        if not known and self._m:
            self._m.unknown_priority.inc()
        return klass

    def admit(self, ticket: Ticket, now: float | None = None) -> _Admission:
        """`now`: the trio time read in this same step (no checkpoint since), else read at entry."""
        return _Admission(self, ticket, now)

    def learn_probe(self, path: str, body: bytes, latency_ms: float) -> None:
        """A warm-up probe answered in `latency_ms`: seed the route's service model with it."""
        ctl = self.controller
        ctl.learn_probe(path, body, latency_ms, trio.current_time())
        self._deliver(ctl.take_woken())

    def keeps_computing(self, index: int) -> bool:
        """Whether upstream `index` is known to go on with a request after a disconnect
        (stops_on_cancel = false, or learned by "auto"; an unknown "auto" is not enough to
        keep work running past its deadline, only to hold its slot)."""
        habits = self.controller.habits
        return index < len(habits) and habits[index].known_to_keep_computing

    def mark_refused(self, index: int) -> None:
        self.controller.mark_refused(index, trio.current_time())

    def set_capacity_factor(self, index: int, factor: float) -> None:
        self._deliver(self.controller.set_capacity_factor(index, factor, trio.current_time()))
        if self._m:
            self._m.limit_changes(index)

    def apply_policy(self, policy: Policy, gate: Gate | None = None, service: LatencyFamily | None = None) -> None:
        """A reloaded policy, with the gate and service-time family built for it (None: keep)."""
        ctl = self.controller
        self._deliver(ctl.apply_policy(policy, trio.current_time(), gate, service))
        for ticket_id, waiter in self._waiters.items():
            at = ctl.expiry_of(ticket_id)
            waiter.scope.deadline = math.inf if at is None else at
        if self._m:
            self._m.everything()

    def statistics(self) -> dict[str, Any]:
        return {**self.controller.statistics(trio.current_time()), "waiters": len(self._waiters)}

    def __repr__(self) -> str:
        return f"<Scheduler waiters={len(self._waiters)} {self.controller!r}>"

    # --- waiting ----------------------------------------------------------

    async def _acquire(self, ticket: Ticket, now: float | None = None) -> Slot:
        decided = self.arrive(ticket, trio.current_time() if now is None else now)
        return decided if isinstance(decided, Slot) else await self.wait(decided)

    def arrive(self, ticket: Ticket, now: float) -> Slot | Enqueue:
        """`admit` without the context manager, for the request path's fast path (two coroutine
        layers fewer per request): the Slot when the arrival is decided at once (admitted, or
        rejected), else the Enqueue to `await wait(...)` on, at once (no checkpoint between). The
        caller then owns the lease's end as `admit` would: `slot.close(exc_type)` on every exit."""
        ctl = self.controller
        lease = ctl.admit_at_once(ticket, now)
        if lease is not None:  # the usual arrival (nobody queued, room), decided in one call
            if self._m:
                self._m.admitted(lease)
            return Slot(self, lease, None)
        decision = ctl.arrive(ticket, now)
        if ctl.outbox:  # decisions for other waiters (rare on arrival): take_woken only then
            self._deliver(ctl.take_woken())
        if isinstance(decision, Admit):
            if self._m:
                self._m.admitted(decision.lease)
            return Slot(self, decision.lease, None)
        if isinstance(decision, Enqueue):
            return decision
        return Slot(self, None, decision)  # counted where it is answered: rampmeter_rejections_total

    async def wait(self, enqueued: Enqueue) -> Slot:
        """Wait for the queued ticket's Admit or expiry (an abandoned wait leaves nothing behind)."""
        return await self._wait(enqueued)

    async def _wait(self, enqueued: Enqueue) -> Slot:
        ticket, ctl = enqueued.ticket, self.controller
        waiter = self._waiters[ticket.id] = _Waiter(enqueued.expires_at)
        try:
            while waiter.result is None:
                with waiter.scope:
                    await waiter.event.wait()
                if waiter.result is None:  # our expiry timer: sweep everything due, us included
                    self._deliver(ctl.expire(trio.current_time()))
                    self._deliver(ctl.take_woken())
                    waiter.scope = trio.CancelScope(deadline=_or_inf(ctl.expiry_of(ticket.id)))
            await trio.lowlevel.checkpoint_if_cancelled()  # cancelled as it was woken: never forward
        except BaseException:
            self._abandon(ticket, waiter)
            raise
        finally:
            del self._waiters[ticket.id]
        result = waiter.result
        if isinstance(result, Admit):
            return Slot(self, result.lease, None)
        return Slot(self, None, deadline_expired(ExpiredAt.QUEUED))

    def _abandon(self, ticket: Ticket, waiter: _Waiter) -> None:
        """The waiting task is leaving by an exception (cancelled): leave nothing behind."""
        now = trio.current_time()
        if waiter.result is None:
            if self.controller.cancel(ticket.id, now) and self._m:
                self._m.abandoned(ticket.klass)
            self._deliver(self.controller.take_woken())
        elif isinstance(waiter.result, Admit):
            self._release(waiter.result.lease, Outcome.CANCELLED, None, None)

    def _deliver(self, decisions: Sequence[Admit | Expired]) -> None:
        for d in decisions:
            waiter = self._waiters.get(d.ticket.id)
            if waiter is None or waiter.result is not None:
                # Cannot happen (a leaving waiter is cancelled in the core first);
                # if it ever does, a lease must not leak.
                if isinstance(d, Admit):
                    self._release(d.lease, Outcome.CANCELLED, None, None)
                continue
            waiter.result = d
            waiter.event.set()
            if self._m and isinstance(d, Admit):
                self._m.admitted(d.lease)

    def _release(
        self,
        lease: Lease,
        outcome: Outcome,
        rtt_ms: float | None,
        observed: Observed | None,
        now: float | None = None,
    ) -> None:
        ctl = self.controller
        if now is None:
            now = trio.current_time()
        if outcome is Outcome.CANCELLED:  # only a cut can start a phantom lease (AdmissionController.release)
            before = ctl.next_phantom_end()
            woken = ctl.release(lease, now, outcome, rtt_ms, observed)
            after = ctl.next_phantom_end()
            if after is not None and (before is None or after < before):
                self._phantom_changed.set()  # the timer task sleeps until the earliest end
        else:  # phantoms may end here, never start: the earliest end can only move later
            woken = ctl.release(lease, now, outcome, rtt_ms, observed)
        if self._m:
            self._m.released(lease, outcome, rtt_ms, observed)
        if woken:
            self._deliver(woken)


def _or_inf(value: float | None) -> float:
    return math.inf if value is None else value


class _Instruments:
    """The admission metrics (proxy/metrics.py SPECS), children bound once per label.

    Levels (queue depth, in-flight units, limit) are read from the controller at
    scrape time (Gauge.set_function), and the per-request counters and histograms
    (admitted, queue wait, estimate error) are folded ones (proxy/metrics.py `Tally`:
    plain numbers), so admitting and releasing cost a few additions here.
    """

    def __init__(self, metrics: Metrics, controller: AdmissionController) -> None:
        self._ctl = controller
        self._metrics = metrics
        self.unknown_priority = metrics.unknown_priority
        self._children: dict[tuple[str, ...], Any] = {}
        self._per_class: dict[str, tuple[Any, Any]] = {}  # class -> (admitted, queue_wait_seconds) children
        self._service_error = metrics.cost_estimate_error_ratio.labels("service_time")
        self._tokens_error = metrics.cost_estimate_error_ratio.labels("output_tokens")
        self._limits = [controller.capacity.limit(i) for i in range(controller.upstream_count)]
        self.everything()

    def _child(self, name: str, *labels: str) -> Any:
        key = (name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = getattr(self._metrics, name).labels(*labels)
        return child

    def admitted(self, lease: Lease) -> None:
        klass = lease.ticket.klass
        pair = self._per_class.get(klass)
        if pair is None:
            m = self._metrics
            pair = self._per_class[klass] = (m.admitted.labels(klass), m.queue_wait_seconds.labels(klass))
        pair[0].inc()
        pair[1].observe(lease.queue_ms / 1000.0)

    def abandoned(self, klass: str) -> None:
        self._child("queue_abandoned", klass).inc()

    def limit_changes(self, i: int) -> None:
        cap = self._ctl.capacity
        limit = cap.limit(i)
        if limit != self._limits[i]:
            self._limits[i] = limit
            self._child("limit_changes", self._metrics.upstream(i), cap.limits[i].last_reason).inc()

    def released(self, lease: Lease, outcome: Outcome, rtt_ms: float | None, observed: Observed | None) -> None:
        i = lease.upstream
        cap = self._ctl.capacity
        limit = cap.limits[i].value if cap.factors[i] == 1.0 else cap.limit(i)  # cap.limit(i), its fast case inline
        if limit != self._limits[i]:  # limit_changes' test, inline: once per request
            self.limit_changes(i)
        ticket = lease.ticket
        if outcome is Outcome.SUCCESS and rtt_ms is not None and ticket.expected_ms > 0:
            self._service_error.observe(rtt_ms / ticket.expected_ms)
            estimated = ticket.cost.output_tokens
            if observed is not None and observed.output_tokens is not None and estimated > 0:
                self._tokens_error.observe(observed.output_tokens / estimated)

    def everything(self) -> None:
        """(Re)bind the scrape-time levels; after a reload the class set may differ."""
        ctl = self._ctl
        for klass in ctl.policy.classes:
            self._child("queue_depth", klass).set_function(lambda k=klass: ctl.depth(k))
        for i in range(ctl.upstream_count):
            label = self._metrics.upstream(i)
            self._child("admission_inflight", label).set_function(lambda i=i: ctl.capacity.used[i])
            self._child("admission_limit", label).set_function(lambda i=i: ctl.capacity.limit(i))
            self._child("phantom_leases", label).set_function(lambda i=i: len(ctl.phantoms.on(i)))
            self.limit_changes(i)
