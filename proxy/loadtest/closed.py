"""Closed loop: N users per step, each sending, reading, thinking and sending again.

Theory of operation: a mixin of `Runner` (it shares the runner's transport,
counters and step bookkeeping). At each step boundary the wanted user count
changes: missing users are started, extra ones stop after their current
request, so steps follow each other without a drain. Each request is a new row
of the current step; its deadline is its send time + the client timeout. User
u draws think times from its own `random.Random` seeded by (trace seed, u), so a
run replays. A 10 ms ticker samples event-loop oversleep as the sender's
lateness (there is no schedule to be late against).
"""

from __future__ import annotations

import random
from typing import Any

import trio

from proxy.loadtest import arrivals
from proxy.loadtest.exchange import exchange
from proxy.loadtest.records import Records, StepRun

LAG_TICK_S = 0.01
LEAD_S = 0.05  # the first request leaves this long after start, so start-up is not counted as lateness


class ClosedLoop:
    # Provided by Runner: trace, target, transport, live, reasons, t0, _active, _users, _all_sent,
    # _closed, _begin(), _end(), _finished().
    trace: Any
    target: Any
    transport: Any
    live: Any
    reasons: Any
    t0: float
    _active: set[Any]
    _begin: Any
    _end: Any
    _finished: Any

    async def _closed_loop(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._lag_monitor)
        start = self.t0 + LEAD_S
        await trio.sleep_until(start)
        for st in self.trace.steps:
            rel = start - self.t0
            run = StepRun(
                st.index,
                st.step.load,
                rel,
                st.step.duration_s,
                st.step.warmup_s,
                Records(),
                in_flight_cap=self.target.max_in_flight,
            )
            self._closed = (run, st, [0])
            self._begin(run)
            self._users = min(int(st.step.load), self.target.max_in_flight)
            for u in range(self._users):
                if u not in self._active:  # users told to stop may still be finishing: they carry on
                    self._active.add(u)
                    nursery.start_soon(self._user, u)
            start += st.step.duration_s
            await trio.sleep_until(start)
            self._end(run)
        self._users = 0
        while self._active:
            self._all_sent = trio.Event()
            await self._all_sent.wait()

    async def _user(self, u: int) -> None:
        rng = random.Random(f"rampmeter-loadtest/{self.trace.seed}/user/{u}")
        plan = self.trace.plan
        think_s = plan.think_ms / 1000.0
        session = self.transport.session()
        try:
            while u < self._users:
                run, st, counter = self._closed
                k = counter[0]
                counter[0] += 1
                shape, keynum = st.closed_request(k)
                now = trio.current_time()
                i = run.records.append(now - self.t0, shape)
                self.live.sent += 1
                self.live.in_flight += 1
                p = self.trace.mix.shapes[shape]
                try:
                    await exchange(
                        session,
                        run.records,
                        i,
                        shape,
                        self.trace.key(keynum),
                        now + self.target.timeout_s,
                        self.t0,
                        p.stream,
                        self.target.check_json,
                        self.reasons,
                    )
                finally:
                    self._finished(run.records, i)
                gap = arrivals.think_gap(plan.think, think_s, rng)
                if gap:
                    await trio.sleep(gap)
        finally:
            session.close()
            self._active.discard(u)
            if not self._active:
                self._all_sent.set()

    async def _lag_monitor(self) -> None:
        current_time = trio.current_time
        at = current_time()
        while True:
            at += LAG_TICK_S
            await trio.sleep_until(at)
            now = current_time()
            run = self.live.step
            if run is not None and now - self.t0 >= run.window[0]:
                run.lateness.append(now - at)
            at = max(at, now - LAG_TICK_S)  # after a long stall, do not replay the missed ticks
