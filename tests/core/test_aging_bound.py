"""The starvation bound in the backend's terms (issue 12 item 4): a request is overdue once it
has waited `fcfs_wait_multiple` times the FCFS wait it faced at arrival. Pure controller on a
hand-advanced clock: a strictly serial server (limit 1) serving each request in exactly its
expected time."""

from __future__ import annotations

import heapq
import itertools
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.admission import AdmissionController
from proxy.core.cost import Cost
from proxy.core.decisions import Admit, Outcome, Ticket
from tests.core.test_admission import make_policy

_ids = itertools.count(1)


def serial_run(
    order: str, jobs: list[tuple[float, float]], multiple: float, check_overdue: bool = False, aging: float = 100.0
):
    """jobs: (arrival s, service ms). Returns per job (service ms, wait ms, fcfs wait ms at arrival)."""
    ctl = AdmissionController(
        make_policy(1, order=order, aging_ms_per_s=aging, fcfs_wait_multiple=multiple), rng=random.Random(0)
    )
    done: dict[int, tuple[float, float, float]] = {}
    fcfs_at: dict[int, float] = {}
    running: list = []  # (finish, id, lease)

    def start(admit: Admit, now: float) -> None:
        t = admit.ticket
        if check_overdue and admit.lease.queue_ms > 0:
            waiting = [e for e in ctl.waitline.entries.values() if e.due_at <= now]
            if waiting:  # an overdue entry was waiting: the admitted one is overdue, and the oldest
                due_at, enqueued_at = admitted_due[t.id]
                assert due_at <= now and all(enqueued_at <= e.enqueued_at for e in waiting), (t, waiting)
        done[t.id] = (t.expected_ms, admit.lease.queue_ms, fcfs_at[t.id])
        heapq.heappush(running, (now + t.expected_ms / 1000.0, t.id, admit.lease))

    admitted_due: dict[int, tuple[float, float]] = {}
    arrivals = sorted(jobs)
    i = 0
    while i < len(arrivals) or running:
        next_arrival = arrivals[i][0] if i < len(arrivals) else math.inf
        if running and running[0][0] <= next_arrival:
            now, _, lease = heapq.heappop(running)
            woken = ctl.release(lease, now, Outcome.SUCCESS, lease.ticket.expected_ms)
        else:
            now, ms = arrivals[i]
            i += 1
            t = Ticket(next(_ids), "interactive", Cost(1, 0, 1, route="/"), ms, math.inf)
            fcfs_at[t.id] = ctl.load.fcfs_wait_ms(now)
            d = ctl.arrive(t, now)
            entry = ctl.waitline.get(t.id)
            admitted_due[t.id] = (entry.due_at, entry.enqueued_at) if entry is not None else (now, now)
            woken = [d] if isinstance(d, Admit) else []
            woken += ctl.take_woken()
        for w in woken:
            start(w, now)
    return list(done.values())


def mix(seed: int, n: int = 3000, load: float = 0.9) -> list[tuple[float, float]]:
    """80% short (~0.34 s) / 20% long (~5.1 s), as the serial llama.cpp-style server of issue 12,
    Poisson arrivals at `load` of what one slot serves; +-10% noise."""
    rng = random.Random(seed)
    mean_ms = 0.8 * 340 + 0.2 * 5140
    rate = load / (mean_ms / 1000.0)
    t, jobs = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        ms = (340.0 if rng.random() < 0.8 else 5140.0) * rng.uniform(0.9, 1.1)
        jobs.append((t, ms))
    return jobs


def quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, math.ceil(q * len(v)) - 1)]


def test_sjf_keeps_the_short_gain_and_bounds_the_long_tail_by_fcfs_at_0_9_load() -> None:
    """The defaults (aging 100 ms/s, due at 2x the FCFS wait) at 0.9 load, three seeded traces."""
    for seed in (1, 2, 3):
        jobs = mix(seed)
        fcfs = serial_run("fcfs", jobs, 2.0)
        sjf = serial_run("sjf", jobs, 2.0)
        pure = serial_run("sjf", jobs, 2.0, aging=0.0)  # no aging: the FCFS-relative bound alone
        unbounded = serial_run("sjf", jobs, 0.0, aging=0.0)  # neither: plain SJF starves long requests

        def short(run):
            return [w + s for s, w, _ in run if s < 1000]

        def long_(run):
            return [w + s for s, w, _ in run if s > 1000]

        assert quantile(short(fcfs), 0.5) >= 3.0 * quantile(short(sjf), 0.5), seed
        assert quantile(long_(sjf), 0.99) <= 1.3 * quantile(long_(fcfs), 0.99), seed
        assert quantile(long_(unbounded), 0.99) > 2.0 * quantile(long_(fcfs), 0.99), seed
        assert quantile(long_(pure), 0.99) <= 2.0 * quantile(long_(fcfs), 0.99), seed  # the bound holds it


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20_000), st.integers(1, 5_000)), min_size=1, max_size=40),
    st.sampled_from([1.0, 1.2, 2.0]),
)
def test_overdue_entries_go_first_oldest_first_and_no_wait_runs_far_past_its_due(arrivals, multiple) -> None:
    """For any arrival sequence: whenever an overdue entry waits, the admitted one is overdue and
    the oldest of them; and a request waits at most until its due time plus the work served first
    (everything else at worst) plus one service that had started."""
    jobs = [(ms_at / 1000.0, float(ms)) for ms_at, ms in arrivals]
    run = serial_run("sjf", jobs, multiple, check_overdue=True)
    longest = max(ms for _, ms in jobs)
    total = sum(ms for _, ms in jobs)
    for _service, wait, fcfs in run:
        assert wait <= multiple * fcfs + total + longest
        assert wait >= 0.0
    assert len(run) == len(jobs)
