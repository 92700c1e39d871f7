"""Deadlines for upstream exchanges without a cancel scope each: one heap, one task.

Theory of operation: `arm(at, victim)` files `victim` under time `at`; the keeper's
task calls `victim.deadline_passed()` (synchronously) once `at` comes, unless
`disarm(entry)` came first. For an HTTP/1.1 upstream exchange the victim is its
connection, which then closes its socket: whatever the exchange was waiting for
(the upstream's answer, room to send the body) fails at once with UpstreamTimeout.
That is what cancelling the exchange would do too: the pool never reuses a
connection whose exchange did not end cleanly.

The task sleeps until the earliest live deadline. An `arm` earlier than that wakes
it; that is rare, since requests of one class share a budget, so a new deadline
is almost never the earliest. Disarmed entries are dropped lazily: when they
reach the top of the heap, or by a rebuild once they outnumber the live ones
(amortised O(1) per entry).

Why: a request's deadline used to be a `trio.move_on_at` scope around its whole
exchange; entering and leaving a scope costs ~17 us (trio's own deadline heap
plus the cancel-status tree) against ~1 us for an arm and a disarm here. Waits
that are not the upstream's (a connection slot, a slow client) still get a real
scope, and only when they happen.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Protocol

import trio

_REBUILD_MIN = 64


class Expirable(Protocol):
    def deadline_passed(self) -> None: ...


class DeadlineKeeper:
    def __init__(self) -> None:
        self._heap: list[list] = []  # [at, seq, victim or None when disarmed]
        self._seq = itertools.count()
        self._dead = 0
        self._next = math.inf  # when the task will wake next
        self._wake: trio.Event | None = None
        self.fired = 0

    def __repr__(self) -> str:
        return f"<DeadlineKeeper armed={len(self._heap) - self._dead} fired={self.fired}>"

    def arm(self, at: float, victim: Expirable) -> list:
        entry = [at, next(self._seq), victim]
        heapq.heappush(self._heap, entry)
        if at < self._next and self._wake is not None:
            self._next = at
            self._wake.set()
        return entry

    def disarm(self, entry: list) -> None:
        if entry[2] is not None:
            entry[2] = None
            self._dead += 1
            heap = self._heap
            if self._dead > _REBUILD_MIN and self._dead * 2 > len(heap):
                heap[:] = [e for e in heap if e[2] is not None]
                heapq.heapify(heap)
                self._dead = 0

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        heap = self._heap
        while True:
            now = trio.current_time()
            while heap and (heap[0][2] is None or heap[0][0] <= now):
                _, _, victim = heapq.heappop(heap)
                if victim is None:
                    self._dead -= 1
                else:
                    self.fired += 1
                    victim.deadline_passed()
            self._next = heap[0][0] if heap else math.inf
            self._wake = trio.Event()
            with trio.move_on_at(self._next):
                await self._wake.wait()
