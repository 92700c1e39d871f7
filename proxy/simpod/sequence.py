"""One request inside the simulated engine, and its lifecycle table.

Theory of operation: a `Sequence` is created waiting, is admitted to the running
batch, then either finishes (reached its length) or is cancelled (its client
left), from the queue or the batch. The lifecycle is the `(state, event) ->
state` table below; an unknown transition is a bug and raises. The engine
(`engine.py`) mutates sequences; the runtime only reads them and parks its wakeup
in `waker`. Pure: no I/O, no clock.

An engine whose profile keeps computing after a disconnect does not cancel:
it marks the sequence `orphaned` (nobody reads its answer any more) and lets
it run on through the same table to FINISHED.
"""

from __future__ import annotations

from typing import Any

from proxy.simpod.workload import Job

WAITING, RUNNING, FINISHED, CANCELLED = "waiting", "running", "finished", "cancelled"
ADMIT, FINISH, CANCEL = "admit", "finish", "cancel"
TRANSITIONS: dict[tuple[str, str], str] = {
    (WAITING, ADMIT): RUNNING,
    (WAITING, CANCEL): CANCELLED,
    (RUNNING, FINISH): FINISHED,
    (RUNNING, CANCEL): CANCELLED,
}


def transition(state: str, event: str) -> str:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise RuntimeError(f"sequence cannot {event} while {state}") from None


class Sequence:
    """One request inside the engine. `waker` belongs to the runtime (opaque here)."""

    __slots__ = (
        "admitted_at",
        "arrived_at",
        "deadline",
        "engine_s",
        "finished_at",
        "generated",
        "idempotency_key",
        "job",
        "orphaned",
        "seq_id",
        "state",
        "steps_done",
        "waker",
    )

    def __init__(self, seq_id: int, job: Job, now: float, deadline: float | None, key: str | None) -> None:
        self.seq_id = seq_id
        self.job = job
        self.deadline = deadline
        self.idempotency_key = key
        self.state = WAITING
        self.arrived_at = now
        self.admitted_at: float | None = None
        self.finished_at: float | None = None
        self.steps_done = 0
        self.generated = 0  # output tokens emitted so far
        self.engine_s = 0.0  # engine time charged to this sequence
        self.orphaned = False  # its client left, but the engine computes it anyway
        self.waker: Any = None  # a trio.Event in the driver

    @property
    def done(self) -> bool:
        return self.state is FINISHED or self.state is CANCELLED

    def __repr__(self) -> str:
        return (
            f"<Sequence #{self.seq_id} {self.state} {self.job.kind} prompt={self.job.prompt_tokens} "
            f"tokens={self.generated}/{self.job.output_tokens} engine_s={self.engine_s:.6f}>"
        )
