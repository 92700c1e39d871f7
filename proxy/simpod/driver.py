"""The pod's runtime: a trio task stepping the pure engine in (virtual) time.

Theory of operation: `Pod.run` loops only while the engine has work; when idle
it parks on an Event that `submit` sets, so an idle pod costs nothing. Each step:
`engine.begin_step(start, slowdown)` (admission and price), then
`trio.sleep_until(start + duration)` (so trio's MockClock/autojump_clock drives
it in tests), then `engine.end_step(start + duration)` and wake the handlers
whose sequences progressed. A
handler parks on a one-shot `trio.Event` stored in `seq.waker`: streaming
handlers are woken every step they got a token, non-streaming ones only when
their sequence is done, so there is no task per token and no wakeup per token
for a handler that does not need one.

A handler owns its sequence's lease: `submit` then, in a `finally`, `release`,
which cancels the sequence in the engine (freeing its slot and KV, counting its
work as wasted) unless it already finished. That runs also when the server
cancels the handler because the client went away (trio.Cancelled).

Keeping time under load: answering a step's finished requests costs CPU, so
the loop often resumes after the step's planned end. Starting the next step at
`now` would add that overhead to every step and make the pod slower than its
profile (about 15% at 32 answers per 10 ms step). Instead the next step starts at
the previous one's planned end (the engine clock), lagging real time by at most
MAX_LAG_S; past that the pod really is slower than its profile.
`loop_late_steps` and `loop_lag_s` in the statistics say how often and how much.

Pod-relative time: cold start and fault windows are measured in seconds since
`run` started (`elapsed(now)`), so `--fault-start-s 10` means 10 s after start.
"""

from __future__ import annotations

import random
import time
import uuid

import trio

from proxy.simpod.engine import FINISHED, Engine, Sequence
from proxy.simpod.faults import Faults
from proxy.simpod.profiles import Profile
from proxy.simpod.workload import Job

# How far behind real time the engine clock may run when the process is CPU-bound.
MAX_LAG_S = 0.05


class Pod:
    def __init__(
        self,
        profile: Profile,
        *,
        seed: int = 0,
        cold_start_s: float = 0.0,
        cold_penalty: float = 1.0,
        cold_penalty_requests: int = 0,
        faults: Faults | None = None,
    ) -> None:
        self.profile = profile
        self.seed = seed
        self.cold_start_s = cold_start_s
        self.engine = Engine(profile, cold_penalty=cold_penalty, cold_penalty_requests=cold_penalty_requests)
        self.faults = faults if faults is not None else Faults()
        self._rng = random.Random(seed)  # error draws: reproducible given the arrival order
        self._frontend_rng = random.Random(seed + 1)  # front-end crossings: apart, so error draws stay as they were
        self.instance_id = uuid.uuid4().hex  # new per process start: restart detection keys on it
        self.started_at = time.time()  # wall clock, for humans and restart detection
        self._t0: float | None = None
        self._kick = trio.Event()
        self._late_steps = 0
        self._lag_s = 0.0

    # --- the step loop ---
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._t0 = trio.current_time()
        task_status.started()
        engine = self.engine
        planned: float | None = None  # engine-clock end of the previous step, while busy
        while True:
            if not engine.has_work:
                planned = None
                self._kick = trio.Event()
                await self._kick.wait()
                continue
            now = trio.current_time()
            start = now
            if planned is not None and now > planned:
                # Late (CPU busy answering the last step): keep the engine's cadence,
                # catching up at most MAX_LAG_S, and say so in the statistics.
                self._late_steps += 1
                self._lag_s += now - planned
                start = max(planned, now - MAX_LAG_S)
            duration = engine.begin_step(start, self.faults.at(start - self._t0).slowdown)
            if duration is None:
                raise RuntimeError(f"engine has work but admitted nothing: {engine!r}")
            planned = start + duration
            await trio.sleep_until(planned)
            for seq in engine.end_step(planned):
                waker = seq.waker
                if waker is not None and (seq.job.stream or seq.state is FINISHED):
                    seq.waker = None
                    waker.set()

    # --- the handlers' interface ---
    def elapsed(self, now: float | None = None) -> float:
        """Seconds since the step loop started (0 before)."""
        if self._t0 is None:
            return 0.0
        return (trio.current_time() if now is None else now) - self._t0

    def ready(self) -> bool:
        return self._t0 is not None and self.elapsed() >= self.cold_start_s

    def draw_error(self) -> bool:
        """Whether the fault in force fails this request (seeded draw)."""
        rate = self.faults.at(self.elapsed()).error_rate
        return rate > 0.0 and self._rng.random() < rate

    def frontend_s(self) -> float:
        """Seconds one crossing of the HTTP front end takes (profile frontend_ms, spread by a seeded draw)."""
        p = self.profile
        if not p.frontend_ms:
            return 0.0
        spread = p.frontend_spread * (2.0 * self._frontend_rng.random() - 1.0) if p.frontend_spread else 0.0
        return p.frontend_ms * (1.0 + spread) * p.ms_to_s

    def submit(self, job: Job, *, deadline: float | None = None, key: str | None = None) -> Sequence:
        seq = self.engine.submit(job, trio.current_time(), deadline=deadline, key=key)
        self._kick.set()
        return seq

    async def wait(self, seq: Sequence) -> None:
        """Until `seq` progresses (streaming) or is done; returns at once if done."""
        if seq.done:
            return
        event = trio.Event()
        seq.waker = event
        await event.wait()

    async def wait_done(self, seq: Sequence) -> None:
        while not seq.done:
            await self.wait(seq)

    def release(self, seq: Sequence) -> None:
        """End the handler's lease: cancel the sequence unless it finished (a profile that
        keeps computing after a disconnect orphans it instead). Idempotent."""
        seq.waker = None
        if not seq.done:
            self.engine.cancel(seq, trio.current_time())

    def idle_for_s(self) -> float:
        """How long the engine has had nothing to do (0 while busy or before any work):
        a benchmark reads it to tell when the backend really stopped computing."""
        since = self.engine.idle_since
        return 0.0 if since is None or self.engine.has_work else trio.current_time() - since

    def reset_stats(self) -> None:
        self.engine.reset_stats()
        self._late_steps = 0
        self._lag_s = 0.0

    def statistics(self) -> dict:
        return {
            "instance_id": self.instance_id,
            "started_at": self.started_at,
            "uptime_s": self.elapsed(),
            "ready": self.ready(),
            "profile": self.profile.name,
            "model": self.profile.model,
            "seed": self.seed,
            "faults": self.faults.statistics(self.elapsed()),
            "idle_for_s": self.idle_for_s(),
            "loop_late_steps": self._late_steps,
            "loop_lag_s": self._lag_s,
        }

    def __repr__(self) -> str:
        return f"<Pod {self.instance_id[:8]} {self.engine!r} ready={self.ready()}>"
