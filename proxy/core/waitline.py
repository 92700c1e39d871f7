"""Everyone waiting for admission: class queues, their order, and their expiry times.

Theory of operation: one `ClassQueue` per class (proxy/core/sjf.py: SJF with
aging or FCFS, overdue FIFO, lazy deletion), the `ClassPicker` between classes,
and one heap of expiry times over all entries (lazy deletion too, rebuilt by
`remove` once dead items outnumber twice the live ones), so that
`pop_due(now)` finds expired tickets in O(log n) each, without scanning.

Expiry time of a ticket with a deadline: deadline - expected service time (it
could no longer finish in time) for classes with on_unmeetable = "reject"; the
deadline itself for "try" classes, which accept a late finish over no answer.

`candidates(now)` is the order in which entries are offered a slot: first the
entries that are overdue (past their due time: a multiple of the FCFS wait they
faced at arrival, or their class's max_queue_wait_ms; earliest due first,
whatever the class), then each waiting class's best entry in picker order.
`push(..., fcfs_wait_ms)` takes the FCFS wait the caller estimated for the
arrival (the controller: the work ahead of it over the parallelism) and sets
its due time at `scheduling.fcfs_wait_multiple` times that (0: off). `configure` applies a new policy and keeps every entry (re-keyed;
entries of a class that no longer exists move to the default class).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from proxy.core.sjf import ClassPicker, ClassQueue, Entry

_COMPACT_MIN = 64  # dead expiry items tolerated before remove() rebuilds the heap (above twice the live ones)

if TYPE_CHECKING:
    from collections.abc import Callable

    from proxy.core.decisions import Ticket
    from proxy.policy.admission import Scheduling


class Waitline:
    __slots__ = ("_expiry", "_fcfs_multiple", "_seq", "classes", "default_class", "entries", "picker", "queues")

    def __init__(self, scheduling: Scheduling, classes: dict[str, Any]) -> None:
        self.entries: dict[int, Entry] = {}  # ticket id -> entry; the controller reads it for membership and emptiness
        self._expiry: list[tuple[float, int, Entry]] = []
        self._seq = itertools.count()
        self.queues: dict[str, ClassQueue] = {}
        self.configure(scheduling, classes, 0.0)

    def configure(self, scheduling: Scheduling, classes: dict[str, Any], now: float) -> None:
        self.classes = dict(classes)
        self.default_class = scheduling.default_class
        self._fcfs_multiple = scheduling.fcfs_wait_multiple
        self.picker = ClassPicker(scheduling.class_mode, self.classes)
        old = sorted(self.entries.values(), key=lambda e: e.seq)
        self.queues = {
            name: ClassQueue(name, scheduling.order, scheduling.aging_ms_per_s, c.max_queue_wait_ms / 1000.0)
            for name, c in self.classes.items()
        }
        self.entries, self._expiry = {}, []
        for e in old:
            t = e.ticket
            if t.klass not in self.queues:
                t = t.with_class(self.default_class)
            self.push(t, now, e.enqueued_at, e.seq, fcfs_due=e.fcfs_due)

    # --- membership -------------------------------------------------------

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, ticket_id: int) -> Entry | None:
        return self.entries.get(ticket_id)

    def depth(self, klass: str) -> int:
        q = self.queues.get(klass)
        return 0 if q is None else q.live

    def push(
        self,
        ticket: Ticket,
        now: float,
        enqueued_at: float | None = None,
        seq: int | None = None,
        *,
        fcfs_wait_ms: float | None = None,
        slot_ms: float = 0.0,
        fcfs_due: float | None = None,
    ) -> Entry:
        """Queue `ticket`. Its due time (the starvation bound) is `fcfs_wait_multiple` x
        `fcfs_wait_ms` after arrival, or, when its deadline leaves less room, its FCFS start
        (arrival + fcfs_wait_ms) plus half the slack FCFS would leave it (expiry - slot_ms - FCFS
        start; `slot_ms`: how long a slot takes to free). Both grow with the FCFS wait, so among
        requests with one budget the due order is the arrival order, and overdue entries go
        oldest first: reordering does not cost a request a deadline FCFS would have met."""
        enq = now if enqueued_at is None else enqueued_at
        if fcfs_due is None:
            fcfs_due = math.inf
            if fcfs_wait_ms is not None and self._fcfs_multiple > 0:
                fcfs_due = enq + self._fcfs_multiple * fcfs_wait_ms / 1000.0
                expires = self.expires_at(ticket)
                if expires is not None:
                    start = enq + fcfs_wait_ms / 1000.0
                    fcfs_due = min(fcfs_due, start + (expires - slot_ms / 1000.0 - start) / 2.0)
        entry = Entry(ticket, enq, next(self._seq) if seq is None else seq, fcfs_due)
        self.queues[ticket.klass].push(entry)
        self.entries[ticket.id] = entry
        at = self.expires_at(ticket)
        if at is not None:
            heapq.heappush(self._expiry, (at, entry.seq, entry))
        return entry

    def remove(self, entry: Entry) -> None:
        self.queues[entry.ticket.klass].remove(entry)
        del self.entries[entry.ticket.id]
        heap = self._expiry
        if len(heap) > 2 * len(self.entries) + _COMPACT_MIN:
            # Entries admitted before their expiry leave their item behind (lazy deletion), and only
            # pop_due, when a wait expires, trims the heap: a sidecar whose waits never expire kept one
            # item per queued request for ever. Rebuilt once the dead are most of it: amortised O(1).
            heap[:] = [item for item in heap if item[2].alive]
            heapq.heapify(heap)

    # --- expiry -----------------------------------------------------------

    def expires_at(self, ticket: Ticket) -> float | None:
        if ticket.deadline == math.inf:
            return None
        cls = self.classes.get(ticket.klass)
        if cls is not None and cls.on_unmeetable == "try":
            return ticket.deadline
        return ticket.deadline - ticket.expected_ms / 1000.0

    def expiry_of(self, ticket_id: int) -> float | None:
        entry = self.entries.get(ticket_id)
        return None if entry is None else self.expires_at(entry.ticket)

    def pop_due(self, now: float) -> list[Entry]:
        """Remove and return the entries whose expiry time has come."""
        due, heap = [], self._expiry
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)[2]
            if entry.alive:
                self.remove(entry)
                due.append(entry)
        return due

    def next_expiry(self) -> float | None:
        heap = self._expiry
        while heap and not heap[0][2].alive:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    # --- order ------------------------------------------------------------

    def waiting(self) -> set[str]:
        return {name for name, q in self.queues.items() if q.live}

    def candidates(self, now: float, skip: Callable[[Entry], bool] | None = None) -> Iterator[tuple[Entry, bool]]:
        """(entry, is_weighted_pick), best first: overdue heads, then class heads in picker order.
        With `skip`, an entry it says to skip is passed over and the next best of its class
        offered instead (held entries: they wait without holding their class up)."""
        overdue = sorted(
            (head.seq, q.name, head)
            for q in self.queues.values()
            if q.live and (head := q.overdue_head(now)) is not None
        )
        for _, _, head in overdue:
            if skip is None or not skip(head):
                yield head, False
        weighted = self.picker.mode == "weighted"
        for rank, name in enumerate(self.picker.order(self.waiting())):
            q = self.queues[name]
            entry = q.best() if skip is None else q.best_passing(skip)
            if entry is not None:
                yield entry, weighted and rank == 0

    def backlog_ms(self) -> float:
        """Expected ms of all waiting work, every class."""
        return sum(q.backlog_ms for q in self.queues.values())

    def commit(self, klass: str) -> None:
        """The weighted pick `klass` was admitted: charge the picker (before removing it)."""
        self.picker.commit(klass, self.waiting())

    def work_ahead_ms(self, klass: str, expected_ms: float, exclude: Entry | None = None) -> float:
        """Expected ms of waiting work a `klass` arrival of `expected_ms` would be served after:
        its own class's entries that go first, plus, strict: all work of higher classes;
        weighted: each other class's work up to its weight's share relative to ours."""
        own_q, mine = self.queues[klass], self.classes[klass]
        own = own_q.work_ahead_ms(expected_ms)
        if exclude is not None:  # the arrival itself, already pushed
            own = max(0.0, own - exclude.ticket.expected_ms)
        ahead = own
        strict = self.picker.mode == "strict"
        for name, q in self.queues.items():
            if name == klass or not q.live:
                continue
            other = self.classes[name]
            if not strict:
                ahead += min(q.backlog_ms, (own + expected_ms) * other.weight / mine.weight)
            elif (other.priority, name) < (mine.priority, klass):
                ahead += q.backlog_ms
        return ahead

    def statistics(self, now: float) -> dict[str, Any]:
        out = {}
        for name in self.picker.order(self.queues):
            q = self.queues[name]
            head = q.oldest()
            out[name] = {
                "depth": q.live,
                "oldest_wait_ms": 0.0 if head is None else (now - head.enqueued_at) * 1000.0,
                "backlog_ms": q.backlog_ms,
                "max_queue_length": self.classes[name].max_queue_length,
            }
        return out

    def __repr__(self) -> str:
        return f"<Waitline {len(self.entries)} waiting { {n: q.live for n, q in self.queues.items()} }>"
