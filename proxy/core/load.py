"""The load and wait estimator: how long an arrival would wait, and what the shedding rules read.

Theory of operation: the admission controller (proxy/core/admission.py) tells this
module what happens (`arrived`, `accepted`, `admitted`, `left`, `released`,
`completed`) and it keeps the running figures the estimates need, all in the
backend's own time scale (expected milliseconds of service, never request counts
alone):

- the expected work in flight (`inflight_expected_ms`: each lease's expected
  service time, plus what phantoms still cost);
- per class, the expected work arriving per second by log2 size bucket (decayed
  rates): all of it is what the strict-priority overtaking factor reads, the buckets
  below a request's size what the SJF stretch reads (shorter work of its own class);
- arrivals to and departures from the queue, and completions (decayed rates):
  queue growth and drain rate for the saturation rule;
- the service times of completed requests, all routes (a windowed quantile): the
  CoDel target and interval scale with them.

It reads, never changes, the controller's `Waitline` and `Capacity` (the controller
re-binds `capacity` when a reload rebuilds it). Every method takes `now`; nothing
here does I/O or reads a clock.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from proxy.core.quantiles import WindowedQuantiles
from proxy.core.rates import BucketedRate, DecayedRate
from proxy.core.shedding import LoadSnapshot
from proxy.core.sjf import SIZE_BUCKETS, size_bucket

SERVICE_REFRESH_S = 1.0  # how long a service-time quantile (and service_quantiles' pair) is reused

if TYPE_CHECKING:
    from proxy.core.capacity import Capacity
    from proxy.core.decisions import Ticket
    from proxy.core.sjf import Entry
    from proxy.core.waitline import Waitline
    from proxy.policy.schema import Policy

MAX_RHO = 0.95  # the largest share of capacity overtaking work is taken to need (a 20x stretch)
_INF = float("inf")


class LoadEstimator:
    __slots__ = (
        "_arrivals",
        "_class_mode",
        "_drain",
        "_fcfs_multiple",
        "_leaves",
        "_quantiles",
        "_quantiles_until",
        "_unit_requests",
        "_window_s",
        "_work_in",
        "capacity",
        "inflight_expected_ms",
        "service_times",
        "waitline",
    )

    def __init__(self, policy: Policy, waitline: Waitline, capacity: Capacity) -> None:
        self.waitline, self.capacity = waitline, capacity
        self.inflight_expected_ms = 0.0
        # Completed requests' service time, all routes: the backend's own time scale for shedding.
        self.service_times = WindowedQuantiles(window_s=60.0, sub_windows=6, refresh_s=SERVICE_REFRESH_S)
        self._quantiles, self._quantiles_until = (0.0, 0.0), -math.inf  # service_quantiles' pair
        self._window_s = -1.0
        self.configure(policy)

    def configure(self, policy: Policy) -> None:
        """A (re)loaded policy: the rates restart only when their window changed."""
        sched = policy.scheduling
        self._unit_requests = policy.limits.unit == "requests"
        self._class_mode = sched.class_mode
        self._fcfs_multiple = sched.fcfs_wait_multiple
        if sched.drain_window_s != self._window_s:
            self._window_s = sched.drain_window_s
            self._drain, self._arrivals, self._leaves = (DecayedRate(self._window_s) for _ in range(3))
            # Per class: expected ms of work arriving per second, by size_bucket(expected_ms) (the total is
            # all buckets: one decay per accepted request serves both readers).
            self._work_in: dict[str, BucketedRate] = {}

    # --- what the controller reports --------------------------------------

    def arrived(self, now: float) -> None:
        """A ticket joined the queue."""
        self._arrivals.add(now)

    def left(self, now: float) -> None:
        """A ticket left the queue (admitted from it, expired, cancelled, rejected after joining)."""
        self._leaves.add(now)

    def accepted(self, ticket: Ticket, now: float) -> None:
        """Work that will take a slot (admitted at once, or queued): what higher classes' overtaking reads."""
        rate = self._work_in.get(ticket.klass)
        if rate is None:
            rate = self._work_in[ticket.klass] = BucketedRate(self._window_s, SIZE_BUCKETS, now)
        rate.add(now, size_bucket(ticket.expected_ms), ticket.expected_ms)

    def released(self, now: float) -> None:
        """A lease ended (the drain rate)."""
        self._drain.add(now)

    def completed(self, rtt_ms: float, now: float) -> None:
        """A request finished upstream in `rtt_ms`."""
        self.service_times.record(rtt_ms, now)

    # --- estimates --------------------------------------------------------

    def slot_ms(self, expected_ms: float) -> float:
        """How long a slot takes to free, for an arrival expecting `expected_ms`: its own time, or
        the mean expected time of the work in flight when that is longer."""
        inflight = sum(self.capacity.requests)
        return max(expected_ms, self.inflight_expected_ms / inflight if inflight else 0.0)

    def expected_wait_ms(self, klass: str, expected_ms: float, now: float, exclude: Entry | None = None) -> float:
        """Queue wait a would-be arrival of `klass` and `expected_ms` faces (fluid estimate).

        0 when it would be placed at once; else the waiting work served before it
        (Waitline.work_ahead_ms) plus half the expected work in flight (the mean
        residual), over the parallelism that drains it (`_parallel`), stretched
        by the work that will arrive and go first: higher classes' (`overtaking_factor`) and,
        in an SJF class, shorter work of its own (`sjf_stretch`). The latter never takes the
        estimate past the starvation bound's promise, scheduling.fcfs_wait_multiple x the
        FCFS wait (proxy/core/sjf.py): a request overtaken that long goes to the front.
        """
        line, cap = self.waitline, self.capacity
        nobody_waits = not len(line) or (exclude is not None and len(line) == 1)
        if nobody_waits:
            for i in range(len(cap)):  # a loop, not any(<genexpr>): this runs on every arrival
                if cap.fits(i, klass, 1) is not None:
                    return 0.0
        ahead = line.work_ahead_ms(klass, expected_ms, exclude)
        wait = (ahead + self.inflight_expected_ms / 2.0) / self._parallel()
        wait *= self.overtaking_factor(klass, now)
        stretch = self.sjf_stretch(klass, now, expected_ms)
        if stretch == 1.0:
            return wait
        if self._fcfs_multiple <= 0:
            return wait * stretch
        return max(wait, min(wait * stretch, self._fcfs_multiple * self.fcfs_wait_ms(now)))

    def fcfs_wait_ms(self, now: float) -> float:
        """The wait FCFS would give an arrival now: all waiting work, plus half the work in flight
        (the mean residual), over the parallelism (requests in flight, or the limit when it
        counts requests: what drains a standing queue). On a serial server this is the work in
        the system, which no work-conserving order changes. It sets the arrival's due time
        (the starvation bound, proxy/core/sjf.py)."""
        return (self.waitline.backlog_ms() + self.inflight_expected_ms / 2.0) / self._parallel()

    def promised_wait_ms(self, klass: str, now: float) -> float | None:
        """The wait the starvation bound promises an SJF request arriving now: what FCFS would give it
        (`fcfs_wait_ms`, stretched by higher classes' overtaking). Its due time (Waitline.push) falls
        between its FCFS start and its expiry, so when FCFS would finish it in time SJF does too, by
        going to the front then. None where no such bound applies (FCFS order, fcfs_wait_multiple 0).

        The deadline rule asks this when the SJF estimate says no (`ArrivalGate.deadline_verdict`): at
        0.9x on vLLM the stretched estimate alone turned away 47-69 long requests in 30 s that direct
        FCFS served in time (2026-12-04-s28 vllm-30s)."""
        if self._fcfs_multiple <= 0 or klass not in self.waitline.queues or self.waitline.queues[klass].order != "sjf":
            return None
        return self.fcfs_wait_ms(now) * self.overtaking_factor(klass, now)

    def _parallel(self) -> int:
        """What drains a standing queue: the requests in flight, or the limit when it counts requests
        (fewer are in flight while a route's first requests are held, core/admission.py)."""
        cap = self.capacity
        parallel = sum(cap.requests)
        if self._unit_requests:
            parallel = max(parallel, sum(cap.limit(i) for i in range(len(cap))))
        return max(1, parallel)

    def overtaking_factor(self, klass: str, now: float) -> float:
        """1 / (1 - rho): under strict class priority, work arriving in higher classes while
        a request waits is served before it (the M/G/1 priority-queue stretch), with rho the
        share of the parallelism that work needs (`_parallel`, as in the wait itself). Without it
        a batch request queued behind interactive traffic at capacity was promised a wait it never
        got: it waited out its deadline (bench/overload at 2x: 82 batch 504s after ~9 s) instead
        of hearing 503 at arrival. rho is capped at MAX_RHO (a finite estimate for Retry-After)."""
        classes = self.waitline.classes
        if self._class_mode != "strict" or klass not in classes:
            return 1.0
        mine = classes[klass].priority
        work_ms_per_s = sum(
            rate.rate_below(now, SIZE_BUCKETS)
            for name, rate in self._work_in.items()
            if name in classes and classes[name].priority < mine
        )
        return self._stretch(work_ms_per_s)

    def sjf_stretch(self, klass: str, now: float, expected_ms: float) -> float:
        """1 / (1 - rho) for the shorter work of its own SJF class that arrives while a request of
        `expected_ms` waits and is served first (smaller size buckets; inf, "behind everything",
        is Retry-After's wait of the queue as it stands: 1). rho as in `overtaking_factor`.

        Without it a long request was promised a wait behind the queue as it stood, and a stream
        of short ones went ahead of it until it expired there (the sim pod standing in for vLLM
        at 3x offered: ~80 504s a run after up to 10 s queued, instead of a 503 at arrival)."""
        sizes = self._work_in.get(klass)
        if sizes is None or expected_ms == _INF or self.waitline.queues[klass].order != "sjf":
            return 1.0
        work_ms_per_s = sizes.rate_below(now, size_bucket(expected_ms))
        return self._stretch(work_ms_per_s)

    def _stretch(self, work_ms_per_s: float) -> float:
        """1 / (1 - rho), rho the share of the parallelism `work_ms_per_s` of overtaking work needs, at most MAX_RHO."""
        if not work_ms_per_s:
            return 1.0
        rho = min(MAX_RHO, work_ms_per_s / 1000.0 / self._parallel())
        return 1.0 / (1.0 - rho)

    def quiet(self) -> bool:
        """Nothing queued and the requests in flight below the limit: no load rule can shed an
        arrival (queue_length needs one queued ahead, saturation in-flight at the limit), so the
        arrival gate skips the snapshot (proxy/core/arrival.py ArrivalGate.__call__)."""
        if self.waitline.entries:  # (runs twice per arrival: attribute reads, not len() on the classes)
            return False
        cap = self.capacity
        n = len(cap.limits)
        if n == 1:  # the usual sidecar: one upstream, no generator per arrival
            limit = cap.limits[0].value if cap.factors[0] == 1.0 else cap.limit(0)  # limit(0), its fast case inline
            return limit <= 0 or cap.requests[0] < limit
        limit = sum(cap.limit(i) for i in range(n))
        return limit <= 0 or sum(cap.requests) < limit

    def service_quantiles(self, now: float) -> tuple[float, float]:
        """(p50, p99) of completed requests' service time (0 when unknown): the CoDel scale. Read per
        arrival (the gate's quiet pass): the pair is kept for the quantiles' own refresh (SERVICE_REFRESH_S),
        as each of them is."""
        if now < self._quantiles_until:
            return self._quantiles
        times = self.service_times
        pair = self._quantiles = (times.quantile(0.5, now) or 0.0, times.quantile(0.99, now) or 0.0)
        self._quantiles_until = now + SERVICE_REFRESH_S
        return pair

    def snapshot(self, now: float, ranked: tuple[str, ...], gpu_memory_fraction: float = 0.0) -> LoadSnapshot:
        """What the shedding rules read, per arrival: O(classes + upstreams), no dicts."""
        queues = self.waitline.queues
        depths, waits = [], []
        for name in ranked:
            q = queues[name]
            depths.append(q.live)
            oldest = q.oldest() if q.live else None
            waits.append(0.0 if oldest is None else (now - oldest.enqueued_at) * 1000.0)
        cap = self.capacity
        return LoadSnapshot(
            tuple(depths),
            max(waits, default=0.0),
            sum(cap.requests),
            sum(cap.limit(i) for i in range(len(cap))),
            self._arrivals.rate(now) - self._leaves.rate(now),
            self._drain.rate(now),
            gpu_memory_fraction,
            head_wait_by_class=tuple(waits),
            service_p50_ms=self.service_times.quantile(0.5, now) or 0.0,
            service_p99_ms=self.service_times.quantile(0.99, now) or 0.0,
        )

    def rates(self, now: float) -> tuple[float, float, float]:
        """(arrivals, departures, completions) per second, for statistics."""
        return self._arrivals.rate(now), self._leaves.rate(now), self._drain.rate(now)
