"""The simulated inference engine: vLLM-style continuous batching, pure.

Theory of operation: the engine owns an FCFS waiting queue and a running batch.
The driver calls `begin_step(now, slowdown)` then, `duration` later,
`end_step(now)`, over and over while `has_work`:

- begin_step admits waiting sequences in arrival order while (a) running <
  max_num_seqs and (b) KV reserved (prompt + max output tokens of every running
  sequence) + the candidate's <= kv_capacity_tokens. The head that does not fit
  blocks those behind it (FCFS, no rejection, no overtaking). It then prices the
  step (formula in `profiles.py`) and charges it to the batch at once.
- end_step advances every sequence still running by one step: a generating one
  emits one token, and any that reached its length finishes and frees its KV.
- cancel(seq, now) removes a sequence at once, from the queue or the batch
  (freeing its KV); a step already priced stays charged, since the GPU ran it.
  A profile with stops_on_cancel = false orphans it instead: it keeps its
  place and runs to the end, all of its work wasted (the real servers' habit
  that makes cutting a request at its deadline free nothing).
- batching = "padded": a batch is formed from the queue head only while
  nothing runs; every member is charged prefill for the batch's longest
  prompt (padding) and finishes in the step the longest member finishes.

Accounting (honest, since the last `reset_stats`):
- each step's duration is split over the sequences in it: base cost equally,
  per-sequence cost each, prefill cost to the sequences whose prompt it processed,
  so `busy_s == sum of every sequence's engine_s` exactly (up to float rounding).
- when a sequence ends, its engine_s is settled: completed by its deadline ->
  useful_s; cancelled (client gone) -> wasted_client_gone_s; completed after, or
  cancelled at/after, its deadline -> wasted_deadline_s (nobody was waiting for
  it any more); orphaned -> wasted as if cancelled when it ends. Hence
  busy_s == useful_s + wasted_s + in_progress_s. `idle_since` is when the
  engine last ran out of work (None while busy or before any work), so a
  benchmark can tell how long the backend kept computing after its load stopped.

Invariants (tested with Hypothesis): running <= max_num_seqs; kv_reserved <=
kv_capacity_tokens; admission order == submission order minus cancellations.
Pure: no trio, no clock (`now` is an argument), no randomness.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from proxy.simpod.profiles import Profile
from proxy.simpod.sequence import (
    ADMIT,
    CANCEL,
    CANCELLED,
    FINISH,
    FINISHED,
    RUNNING,
    WAITING,
    Sequence,
    transition,
)
from proxy.simpod.workload import Job

__all__ = ["CANCELLED", "FINISHED", "RUNNING", "WAITING", "Engine", "EngineStats", "Sequence", "transition"]


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    kv_reserved_tokens: int
    kv_used_tokens: int  # prompt + generated tokens of running sequences (vLLM's cache usage)
    kv_capacity_tokens: int
    requests_submitted: int
    requests_executed: int  # admitted to the batch
    requests_completed: int
    requests_late: int  # completed after their deadline
    requests_cancelled: int
    requests_cancelled_waiting: int
    requests_cancelled_running: int
    requests_orphaned: int  # client gone, computed anyway (stops_on_cancel = false)
    orphans: int  # orphaned sequences still queued or running
    prompt_tokens: int  # prefilled (of executed requests)
    output_tokens: int  # generated
    steps: int
    busy_s: float
    useful_s: float
    wasted_s: float
    wasted_client_gone_s: float
    wasted_deadline_s: float
    in_progress_s: float
    cold_multiplier: float
    idle_since: float | None = None
    executions_by_idempotency_key: dict[str, int] = field(default_factory=dict)


_COUNTERS = (
    "_submitted",
    "_executed",
    "_completed",
    "_late",
    "_cancelled_waiting",
    "_cancelled_running",
    "_orphaned",
    "_prompt_tokens",
    "_output_tokens",
    "_steps",
)
_TIMERS = ("_busy_s", "_useful_s", "_wasted_gone_s", "_wasted_deadline_s")


class Engine:
    # Zeroed by reset_stats (the names in _COUNTERS and _TIMERS).
    _submitted: int
    _executed: int
    _completed: int
    _late: int
    _cancelled_waiting: int
    _cancelled_running: int
    _orphaned: int
    _prompt_tokens: int
    _output_tokens: int
    _steps: int
    _busy_s: float
    _useful_s: float
    _wasted_gone_s: float
    _wasted_deadline_s: float

    def __init__(self, profile: Profile, *, cold_penalty: float = 1.0, cold_penalty_requests: int = 0) -> None:
        if cold_penalty < 1.0 or cold_penalty_requests < 0:
            raise ValueError("cold_penalty must be >= 1 and cold_penalty_requests >= 0")
        self.profile = profile
        self.cold_penalty = cold_penalty
        self.cold_penalty_requests = cold_penalty_requests
        self._waiting: deque[Sequence] = deque()  # may hold cancelled tombstones (lazy removal)
        self._waiting_live = 0
        self._running: dict[Sequence, None] = {}  # insertion-ordered set
        self._kv_reserved = 0
        self._next_id = 0
        self._lifetime_executed = 0  # drives the cold penalty; never reset
        self._in_step = False
        self._by_key: dict[str, int] = {}
        self._orphans = 0
        self.idle_since: float | None = None
        self.reset_stats()

    # --- the driver's interface ---
    @property
    def has_work(self) -> bool:
        return bool(self._running) or self._waiting_live > 0

    def submit(self, job: Job, now: float, *, deadline: float | None = None, key: str | None = None) -> Sequence:
        if job.kv_tokens > self.profile.kv_capacity_tokens:
            raise ValueError(f"{job.kv_tokens} KV tokens can never fit in {self.profile.kv_capacity_tokens}")
        self.idle_since = None
        self._next_id += 1
        seq = Sequence(self._next_id, job, now, deadline, key)
        self._waiting.append(seq)
        self._waiting_live += 1
        self._submitted += 1
        return seq

    def cold_multiplier(self) -> float:
        if self.cold_penalty_requests == 0:
            return 1.0
        left = max(0.0, 1.0 - self._lifetime_executed / self.cold_penalty_requests)
        return 1.0 + (self.cold_penalty - 1.0) * left

    def begin_step(self, now: float, slowdown: float = 1.0) -> float | None:
        """Admit, price and charge one step; its duration in seconds, or None when idle."""
        if self._in_step:
            raise RuntimeError("begin_step twice without end_step")
        scale = slowdown * self.cold_multiplier() * self.profile.ms_to_s
        prefill_s = self.profile.prefill_ms_per_token * scale
        admitted_cost = self._admit(now, prefill_s)
        if not self._running:
            return None
        n = len(self._running)
        each_s = (self.profile.base_ms / n + self.profile.per_seq_ms) * scale
        for seq in self._running:
            seq.engine_s += each_s
        duration = each_s * n + admitted_cost
        self._busy_s += duration
        self._steps += 1
        self._in_step = True
        return duration

    def _admit(self, now: float, prefill_s: float) -> float:
        if self.profile.padded and self._running:
            return 0.0  # a padded batch runs to its end before the next one forms
        admitted: list[Sequence] = []
        cap, kv_cap, waiting = self.profile.max_num_seqs, self.profile.kv_capacity_tokens, self._waiting
        while waiting and len(self._running) < cap:
            seq = waiting[0]
            if seq.state is CANCELLED:
                waiting.popleft()
                continue
            if self._kv_reserved + seq.job.kv_tokens > kv_cap:
                break  # FCFS: the head blocks everyone behind it
            waiting.popleft()
            self._waiting_live -= 1
            seq.state = transition(seq.state, ADMIT)
            seq.admitted_at = now
            self._running[seq] = None
            self._kv_reserved += seq.job.kv_tokens
            admitted.append(seq)
            self._executed += 1
            self._lifetime_executed += 1
            self._prompt_tokens += seq.job.prompt_tokens
            if seq.idempotency_key is not None:
                self._by_key[seq.idempotency_key] = self._by_key.get(seq.idempotency_key, 0) + 1
        if not admitted:
            return 0.0
        # Padded: every input is padded to the batch's longest prompt, and pays for it.
        padded_to = max(s.job.prompt_tokens for s in admitted) if self.profile.padded else 0
        cost = 0.0
        for seq in admitted:
            charge = (padded_to or seq.job.prompt_tokens) * prefill_s
            seq.engine_s += charge
            cost += charge
        return cost

    def end_step(self, now: float) -> list[Sequence]:
        """Advance the batch one step; the sequences that progressed (some now finished)."""
        if not self._in_step:
            raise RuntimeError("end_step without begin_step")
        self._in_step = False
        batch = list(self._running)
        padded = self.profile.padded
        for seq in batch:
            seq.steps_done += 1
            if seq.generated < seq.job.output_tokens:  # a padded member past its length idles
                seq.generated += 1
                self._output_tokens += 1
            if not padded and seq.steps_done >= seq.job.steps:
                self._finish(seq, now)
        if padded and all(seq.steps_done >= seq.job.steps for seq in batch):
            for seq in batch:  # the whole batch ends with its longest member
                self._finish(seq, now)
        self._note_idle(now)
        return batch

    def _note_idle(self, now: float) -> None:
        if not self.has_work:
            self.idle_since = now

    def _finish(self, seq: Sequence, now: float) -> None:
        seq.state = transition(seq.state, FINISH)
        seq.finished_at = now
        del self._running[seq]
        self._kv_reserved -= seq.job.kv_tokens
        self._completed += 1
        if seq.orphaned:
            self._orphans -= 1
            self._waste(seq, now)
        elif seq.deadline is not None and now > seq.deadline:
            self._late += 1
            self._wasted_deadline_s += seq.engine_s
        else:
            self._useful_s += seq.engine_s

    def cancel(self, seq: Sequence, now: float) -> None:
        """The client went away: drop the sequence now and count its work as wasted.

        With stops_on_cancel = false the engine does not notice: the sequence is
        orphaned and runs to the end (idempotent: a second call does nothing)."""
        if not self.profile.stops_on_cancel:
            if not seq.orphaned:
                seq.orphaned = True
                self._orphaned += 1
                self._orphans += 1
            return
        was = seq.state
        seq.state = transition(was, CANCEL)
        seq.finished_at = now
        if was is WAITING:
            self._waiting_live -= 1  # the deque entry is a tombstone, skipped at admission
            self._cancelled_waiting += 1
            self._note_idle(now)
            return
        del self._running[seq]
        self._kv_reserved -= seq.job.kv_tokens
        self._cancelled_running += 1
        self._waste(seq, now)
        self._note_idle(now)

    def _waste(self, seq: Sequence, now: float) -> None:
        if seq.deadline is not None and now >= seq.deadline:
            self._wasted_deadline_s += seq.engine_s
        else:
            self._wasted_gone_s += seq.engine_s

    # --- introspection ---
    def reset_stats(self) -> None:
        """Zero the counters; live sequences are charged only from now on."""
        for name in _COUNTERS:
            setattr(self, name, 0)
        for name in _TIMERS:
            setattr(self, name, 0.0)
        self._by_key = {}
        for seq in self._running:
            seq.engine_s = 0.0

    def statistics(self) -> EngineStats:
        running = self._running
        wasted = self._wasted_gone_s + self._wasted_deadline_s
        return EngineStats(
            running=len(running),
            waiting=self._waiting_live,
            kv_reserved_tokens=self._kv_reserved,
            kv_used_tokens=sum(s.job.prompt_tokens + s.generated for s in running),
            kv_capacity_tokens=self.profile.kv_capacity_tokens,
            requests_submitted=self._submitted,
            requests_executed=self._executed,
            requests_completed=self._completed,
            requests_late=self._late,
            requests_cancelled=self._cancelled_waiting + self._cancelled_running,
            requests_cancelled_waiting=self._cancelled_waiting,
            requests_cancelled_running=self._cancelled_running,
            requests_orphaned=self._orphaned,
            orphans=self._orphans,
            prompt_tokens=self._prompt_tokens,
            output_tokens=self._output_tokens,
            steps=self._steps,
            busy_s=self._busy_s,
            useful_s=self._useful_s,
            wasted_s=wasted,
            wasted_client_gone_s=self._wasted_gone_s,
            wasted_deadline_s=self._wasted_deadline_s,
            in_progress_s=sum(s.engine_s for s in running),
            cold_multiplier=self.cold_multiplier(),
            idle_since=self.idle_since,
            executions_by_idempotency_key=dict(self._by_key),
        )

    def __repr__(self) -> str:
        return (
            f"<Engine {self.profile.name} running={len(self._running)}/{self.profile.max_num_seqs} "
            f"waiting={self._waiting_live} orphans={self._orphans} kv={self._kv_reserved}/{self.profile.kv_capacity_tokens}>"
        )
