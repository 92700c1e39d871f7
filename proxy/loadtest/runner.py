"""Drive a trace at a target: open loop (scheduled arrivals) or closed loop (N users).

Theory of operation, open loop: one scheduler task walks each step's arrival
offsets, sleeping until the next intended time and then releasing every request
that is due onto a worker. Workers are long-lived tasks (h1: one connection
each); an idle one is handed its next row with `trio.lowlevel.reschedule`
(no channel, no task per request), and a new one is started when none is idle,
up to `target.max_in_flight`. Past the cap, rows wait in a backlog (latency
still counts from their intended time) and the step is marked invalid, since
the target was not offered the load. The scheduler's own lateness (release
time - intended time) is sampled per release; the analysis marks a step
invalid when its p99 is over the threshold. Steps follow each other without a
gap; rows belong to the step of their intended time.

Closed loop: see `closed.py` (a mixin of the runner).

Every request's deadline is its intended time + `target.timeout_s`; the run
ends when the last row has ended. Cancelling the run (Ctrl-C) closes every
connection; unsent rows stay NOT_SENT and their steps are invalid.

Timer precision: epoll waits in whole milliseconds (CPython rounds up), so a
plain sleep releases a request 0-1 ms after its intended time, and that delay
is counted in its latency. `precise=True` sleeps to SPIN_S before the arrival
and yields in a loop for the rest: sub-millisecond releases at the price of a
busy core between arrivals (worth it when measuring a proxy's added latency).
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from typing import Any

import trio
from outcome import Value

from proxy.loadtest.closed import LEAD_S, ClosedLoop
from proxy.loadtest.exchange import exchange
from proxy.loadtest.records import ReasonTable, Records, StepRun
from proxy.loadtest.result import RunResult
from proxy.loadtest.trace import Trace
from proxy.loadtest.transport import Target, open_transport

SPIN_S = 0.001  # precise mode: the last stretch before an arrival is waited by yielding, not sleeping


class _Live:
    """Counters the progress display reads; cheap to bump on the hot path."""

    __slots__ = ("done", "failed", "in_flight", "ok", "sent", "step", "workers")

    def __init__(self) -> None:
        self.step: StepRun | None = None
        self.sent = self.done = self.ok = self.failed = self.in_flight = self.workers = 0


class Runner(ClosedLoop):
    def __init__(
        self, trace: Trace, target: Target, *, progress: Any = None, transport: Any = None, precise: bool = False
    ) -> None:
        self.trace, self.target = trace, target
        self.precise = precise
        self.progress = progress
        self._transport_override = transport
        self.reasons = ReasonTable()
        self.runs: list[StepRun] = []
        self.live = _Live()
        self._idle: list[Any] = []
        self._backlog: deque = deque()
        self._all_sent = trio.Event()
        self._stop_scope = trio.CancelScope()
        self._active: set[int] = set()  # closed loop: indices of running users
        self._users = 0  # closed loop: users wanted now
        self.t0 = 0.0

    def __repr__(self) -> str:
        return (
            f"<Runner {self.target.label} {self.trace.plan.mode} steps={len(self.trace.steps)} "
            f"sent={self.live.sent} in_flight={self.live.in_flight} workers={self.live.workers}>"
        )

    def statistics(self) -> dict[str, int]:
        live = self.live
        return {
            "sent": live.sent,
            "done": live.done,
            "ok": live.ok,
            "failed": live.failed,
            "in_flight": live.in_flight,
            "workers": live.workers,
            "idle": len(self._idle),
            "backlog": len(self._backlog),
        }

    def stop(self) -> None:
        """End the run now (Ctrl-C): in-flight requests are abandoned, the result is still returned."""
        self._stop_scope.cancel()

    async def run(self) -> RunResult:
        started = time.time()
        async with trio.open_nursery() as conns:
            self.transport = self._transport_override or open_transport(self.target, self.trace.mix.shapes, conns)
            try:
                with self._stop_scope:
                    async with trio.open_nursery() as nursery:
                        self._nursery = nursery
                        self.t0 = trio.current_time()
                        if self.progress is not None:
                            nursery.start_soon(self._ticker)
                        if self.trace.plan.mode == "open":
                            await self._open_loop()
                        else:
                            await self._closed_loop(nursery)
                        nursery.cancel_scope.cancel()  # the ticker and the lag monitor
            finally:
                stats: dict[str, Any] = getattr(self.transport, "statistics", dict)()
                self.transport.close()
                conns.cancel_scope.cancel()  # h2 reader/writer tasks
        return RunResult(
            self.trace,
            self.target,
            self.runs,
            self.reasons,
            started,
            trio.current_time() - self.t0,
            stats,
            self._stop_scope.cancelled_caught,
        )

    # --- open loop ---
    async def _open_loop(self) -> None:
        start = self.t0 + LEAD_S
        for st in self.trace.steps:
            await self._open_step(st, start)
            start += st.step.duration_s
        while self.live.in_flight or self._backlog:
            self._all_sent = trio.Event()
            await self._all_sent.wait()
        for task in self._idle:
            trio.lowlevel.reschedule(task, Value(None))
        self._idle.clear()

    async def _open_step(self, st: Any, start: float) -> None:
        n, rel = len(st), start - self.t0
        rec = Records(n)
        rec.intended = array("d", (rel + o for o in st.offsets))
        rec.shape = array("H", st.choices)
        run = StepRun(
            st.index,
            st.step.load,
            rel,
            st.step.duration_s,
            st.step.warmup_s,
            rec,
            in_flight_cap=self.target.max_in_flight,
        )
        self._begin(run)
        offsets, lateness, measured_from = st.offsets, run.lateness, start + st.step.warmup_s
        current_time, sleep_until, checkpoint = trio.current_time, trio.sleep_until, trio.lowlevel.checkpoint
        spin = SPIN_S if self.precise else 0.0
        i = 0
        while i < n:
            at = start + offsets[i]
            now = current_time()
            if at > now:
                if at - now > spin:
                    await sleep_until(at - spin)
                while (now := current_time()) < at:
                    await checkpoint()
            while i < n and (at := start + offsets[i]) <= now:
                if at >= measured_from:
                    lateness.append(now - at)
                self._dispatch((run, st, i))
                i += 1
        if n == 0:
            await sleep_until(start + st.step.duration_s)
        else:
            await sleep_until(max(start + st.step.duration_s, current_time()))
        self._end(run)

    def _dispatch(self, job: tuple) -> None:
        live = self.live
        live.sent += 1
        live.in_flight += 1
        if self._idle:
            trio.lowlevel.reschedule(self._idle.pop(), Value(job))
        elif live.workers < self.target.max_in_flight:
            live.workers += 1
            self._nursery.start_soon(self._worker, job)
        else:
            self._backlog.append(job)
            job[0].backlogged += 1

    async def _worker(self, job: tuple | None) -> None:
        session = self.transport.session()
        try:
            while job is not None:
                await self._one(session, job)
                job = self._backlog.popleft() if self._backlog else await self._park()
        finally:
            session.close()
            self.live.workers -= 1

    async def _park(self) -> Any:
        task = trio.lowlevel.current_task()
        self._idle.append(task)

        def abort(_: Any) -> trio.lowlevel.Abort:
            self._idle.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)

    async def _one(self, session: Any, job: tuple) -> None:
        run, st, i = job
        rec = run.records
        shape = rec.shape[i]
        p = self.trace.mix.shapes[shape]
        key = self.trace.key(st.keys[i]) if self.trace.idempotency != "none" else None
        deadline = self.t0 + rec.intended[i] + self.target.timeout_s
        try:
            await exchange(
                session, rec, i, shape, key, deadline, self.t0, p.stream, self.target.check_json, self.reasons
            )
        finally:
            self._finished(rec, i)

    def _finished(self, rec: Records, i: int) -> None:
        live = self.live
        live.in_flight -= 1
        live.done += 1
        if rec.error[i] == 0 and 200 <= rec.status[i] < 300:
            live.ok += 1
        else:
            live.failed += 1
        if not live.in_flight and not self._backlog:
            self._all_sent.set()

    # --- bookkeeping ---
    def _begin(self, run: StepRun) -> None:
        self.runs.append(run)
        self.live.step = run
        if self.progress is not None:
            self.progress.step_started(run, self)

    def _end(self, run: StepRun) -> None:
        if self.progress is not None:
            self.progress.step_ended(run, self)

    async def _ticker(self) -> None:
        while True:
            await trio.sleep(0.5)
            self.progress.tick(self)


async def run(
    trace: Trace, target: Target, *, progress: Any = None, transport: Any = None, precise: bool = False
) -> RunResult:
    """Run every step of `trace` against `target`; see the module doc.

    `transport`: send through this instead of opening connections to `target.url`
    (e.g. `inproc.HandlerTransport`).
    """
    return await Runner(trace, target, progress=progress, transport=transport, precise=precise).run()


async def run_interleaved(
    trace: Trace,
    targets: list[Target],
    *,
    progress: Any = None,
    transports: list[Any] | None = None,
    precise: bool = False,
) -> list[RunResult]:
    """Step by step, each target in turn (A B A B ...) on the same trace; one merged result per target."""
    merged: list[RunResult | None] = [None] * len(targets)
    for st in trace.steps:
        for k, target in enumerate(targets):
            part = await run(
                trace.subset([st.index]),
                target,
                progress=progress,
                precise=precise,
                transport=transports[k] if transports else None,
            )
            prev = merged[k]
            if prev is None:
                part.trace = trace
                merged[k] = part
            else:
                prev.merge(part)
    return [m for m in merged if m is not None]


def run_sync(trace: Trace, target: Target, **kw: Any) -> RunResult:
    return trio.run(lambda: run(trace, target, **kw))
