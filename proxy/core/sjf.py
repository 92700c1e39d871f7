"""The waiting line: per-class SJF-with-aging queues and the choice between classes.

Theory of operation. Within a class, order "sjf" serves the smallest key
    key(now) = expected_ms - aging * waited_ms,   waited_ms = now_ms - enq_ms
and "fcfs" the earliest arrival. Linear aging needs no re-keying: for any two
entries i, j at any one `now`,
    key_i(now) - key_j(now) = (exp_i + aging*enq_i) - (exp_j + aging*enq_j)
because the `aging * now_ms` terms cancel. So the fixed key
exp + aging * enq_ms, computed once at enqueue, orders the entries exactly as the
time-varying key does at every instant, and a plain heap is exact
(`aging` = aging_ms_per_s / 1000, in ms of key per ms waited).
FCFS is the same heap keyed by the arrival sequence number.

Starvation bound, in the backend's terms (issue 12: a fixed 10 s let long
requests on a serial server wait 1.8x what FCFS gave them): an entry is due at

    due_at = min(enqueued + max_wait_s, fcfs_due)

where `fcfs_due` is its arrival plus a multiple of the wait FCFS would have given
it (the work ahead of it at arrival over the parallelism; the caller computes
it, see Waitline.push), or earlier when its deadline leaves less slack, and
max_wait_s the class's absolute backstop. Past due_at the entry is overdue and
goes to the front, overdue entries oldest first: SJF may reorder as it likes,
but nobody waits much more than FCFS would have made it wait. A heap per class
by due_at says when the next entry falls due; entries past it move to a heap
by arrival sequence, whose top is the class's oldest overdue entry (O(log n)
each); a FIFO gives the oldest entry (head wait, statistics). Removal is lazy: an entry is
marked dead and skipped when it reaches a head; the structures are rebuilt when
dead entries outnumber live ones, so memory stays O(live).

Between classes, `ClassPicker` orders the classes that have someone waiting:
"strict" by priority (then name); "weighted" by smooth weighted round robin
(nginx's SWRR), which over any run where the same classes stay backlogged gives
each exactly weight/total of the picks, interleaved rather than in bursts. The
picker is only charged (`commit`) for a pick actually admitted.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from proxy.core.decisions import Ticket


class Entry:
    """A queued ticket; mutable only in `alive` (lazy deletion)."""

    __slots__ = ("alive", "due_at", "enqueued_at", "fcfs_due", "key", "seq", "ticket")

    def __init__(self, ticket: Ticket, enqueued_at: float, seq: int, fcfs_due: float = math.inf) -> None:
        self.ticket = ticket
        self.enqueued_at = enqueued_at
        self.seq = seq
        self.key = 0.0
        self.fcfs_due = fcfs_due  # arrival + a multiple of the FCFS wait it faced (inf: no such bound)
        self.due_at = math.inf  # min(fcfs_due, enqueued_at + its class's max wait); set by the queue
        self.alive = True

    def __repr__(self) -> str:
        return f"<Entry {self.ticket.id} {self.ticket.klass} key={self.key:.1f} alive={self.alive}>"


SIZE_BUCKETS = 48


def size_bucket(expected_ms: float) -> int:
    """log2 bucket of an expected service time: work_ahead_ms's and the overtaking rate's grain."""
    if expected_ms >= 2.0 ** (SIZE_BUCKETS - 1):  # also inf: 'behind everything'
        return SIZE_BUCKETS - 1
    return int(expected_ms).bit_length()


def sjf_key(expected_ms: float, enqueued_at: float, aging_ms_per_s: float) -> float:
    """The fixed heap key equivalent to expected_ms - aging * waited (see module docstring)."""
    return expected_ms + aging_ms_per_s * enqueued_at


class ClassQueue:
    __slots__ = (
        "_bucket_ms",
        "_due",
        "_fifo",
        "_overdue",
        "_heap",
        "aging_ms_per_s",
        "backlog_ms",
        "live",
        "max_wait_s",
        "name",
        "order",
    )

    def __init__(self, name: str, order: str, aging_ms_per_s: float, max_wait_s: float) -> None:
        self.name = name
        self.order = order
        self.aging_ms_per_s = aging_ms_per_s
        self.max_wait_s = max_wait_s
        self._heap: list[tuple[float, int, Entry]] = []
        self._due: list[tuple[float, int, Entry]] = []  # not yet overdue, by due_at
        self._overdue: list[tuple[int, Entry]] = []  # past due_at, by arrival
        self._fifo: deque[Entry] = deque()
        self.live = 0
        self.backlog_ms = 0.0  # sum of expected_ms of live entries
        self._bucket_ms = [0.0] * SIZE_BUCKETS  # the same sum by log2(expected_ms), for work_ahead_ms

    def __len__(self) -> int:
        return self.live

    def push(self, entry: Entry) -> None:
        entry.key = self._key(entry)
        entry.due_at = min(entry.fcfs_due, entry.enqueued_at + self.max_wait_s)
        heapq.heappush(self._heap, (entry.key, entry.seq, entry))
        heapq.heappush(self._due, (entry.due_at, entry.seq, entry))
        self._fifo.append(entry)
        self.live += 1
        self.backlog_ms += entry.ticket.expected_ms
        self._bucket_ms[size_bucket(entry.ticket.expected_ms)] += entry.ticket.expected_ms

    def _key(self, entry: Entry) -> float:
        if self.order == "fcfs":
            return float(entry.seq)
        return sjf_key(entry.ticket.expected_ms, entry.enqueued_at, self.aging_ms_per_s)

    def best(self) -> Entry | None:
        """The live entry with the smallest key."""
        heap = self._heap
        while heap and not heap[0][2].alive:
            heapq.heappop(heap)
        return heap[0][2] if heap else None

    def best_passing(self, skip: Callable[[Entry], bool]) -> Entry | None:
        """The best live entry for which `skip(entry)` is false. O(1) when the best passes (the
        usual case); else one sorted scan of the heap (held entries are rare: a route's first
        requests, until its first answer)."""
        best = self.best()
        if best is None or not skip(best):
            return best
        for _, _, e in sorted(self._heap):
            if e.alive and not skip(e):
                return e
        return None

    def oldest(self) -> Entry | None:
        fifo = self._fifo
        while fifo and not fifo[0].alive:
            fifo.popleft()
        return fifo[0] if fifo else None

    def _promote(self, now: float) -> None:
        due, overdue = self._due, self._overdue
        while due and (not due[0][2].alive or due[0][0] <= now):
            _, seq, e = heapq.heappop(due)
            if e.alive:
                heapq.heappush(overdue, (seq, e))

    def overdue_head(self, now: float) -> Entry | None:
        """The oldest live entry past its due time at `now`."""
        self._promote(now)
        overdue = self._overdue
        while overdue and not overdue[0][1].alive:
            heapq.heappop(overdue)
        return overdue[0][1] if overdue else None

    def overdue_at(self, now: float | None = None) -> float | None:
        """When the next live entry falls (or fell: -inf) due."""
        if now is not None and self.overdue_head(now) is not None:
            return -math.inf
        due = self._due
        while due and not due[0][2].alive:
            heapq.heappop(due)
        if due:
            return due[0][0]
        return -math.inf if any(e.alive for _, e in self._overdue) else None

    def remove(self, entry: Entry) -> None:
        """Take a live entry out (admitted, cancelled, expired)."""
        entry.alive = False
        self.live -= 1
        self.backlog_ms -= entry.ticket.expected_ms
        self._bucket_ms[size_bucket(entry.ticket.expected_ms)] -= entry.ticket.expected_ms
        if self.live == 0:  # no float drift across busy periods
            self.backlog_ms = 0.0
            self._bucket_ms = [0.0] * SIZE_BUCKETS
        if len(self._heap) > 2 * self.live + 64:
            self._compact()

    def work_ahead_ms(self, expected_ms: float) -> float:
        """Expected ms of the live entries a new arrival of `expected_ms` would wait behind.

        FCFS: all of them. SJF: those with a shorter expected time, and those of about its
        own (whole log2 buckets below, and all of its own bucket: aging puts every older
        entry of about its size ahead of it, and the queued ones are older; counting half
        of it, as before s28, promised a long request arriving behind 150 longs half their
        wait, and it expired in the queue). Older entries of larger buckets that aging
        moves ahead are ignored. Later, shorter arrivals are `LoadEstimator`'s stretch. O(buckets).
        """
        if self.order == "fcfs":
            return self.backlog_ms
        b = size_bucket(expected_ms)
        return max(0.0, sum(self._bucket_ms[: b + 1]))

    def entries(self) -> list[Entry]:
        """Live entries in arrival order."""
        return [e for e in self._fifo if e.alive]

    def _compact(self) -> None:
        self._heap = [item for item in self._heap if item[2].alive]
        heapq.heapify(self._heap)
        self._due = [item for item in self._due if item[2].alive]
        heapq.heapify(self._due)
        self._overdue = [item for item in self._overdue if item[1].alive]
        heapq.heapify(self._overdue)
        self._fifo = deque(e for e in self._fifo if e.alive)

    def __repr__(self) -> str:
        return f"<ClassQueue {self.name} {self.order} live={self.live} backlog_ms={self.backlog_ms:.0f}>"


class ClassPicker:
    """Order in which classes with waiting entries are offered a slot."""

    __slots__ = ("_by_priority", "_current", "_priority", "_weight", "mode")

    def __init__(self, mode: str, classes: dict[str, Any]) -> None:
        self.mode = mode
        self._priority = {name: c.priority for name, c in classes.items()}
        self._weight = {name: c.weight for name, c in classes.items()}
        self._current = dict.fromkeys(classes, 0)  # SWRR state, exact integers
        self._by_priority = sorted(classes, key=lambda n: (self._priority[n], n))

    def order(self, waiting: set[str] | dict[str, Any]) -> list[str]:
        """Classes with someone waiting, best first (the first is the pick; the rest are fallbacks)."""
        ranked = [n for n in self._by_priority if n in waiting]
        if self.mode == "strict" or len(ranked) < 2:
            return ranked
        current, weight = self._current, self._weight
        pick = max(ranked, key=lambda n: (current[n] + weight[n], -self._priority[n]))
        return [pick] + [n for n in ranked if n != pick]

    def commit(self, chosen: str, waiting: set[str] | dict[str, Any]) -> None:
        """`chosen` was admitted through the weighted pick among `waiting` classes."""
        if self.mode != "weighted":
            return
        current, weight = self._current, self._weight
        total = 0
        for name in waiting:
            current[name] += weight[name]
            total += weight[name]
        current[chosen] -= total

    def statistics(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "order": list(self._by_priority),
            "swrr_current": dict(self._current),
        }

    def __repr__(self) -> str:
        return f"<ClassPicker {self.mode} {self._by_priority}>"
