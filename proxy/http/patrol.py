"""One watch over all of a server's HTTP/1.1 connections: phase deadlines, eviction, clients that hung up.

Theory of operation: one `Patrol` per `Server` (in its `ServerContext`), one task.
Connections report phase changes to it with O(1) calls, and it keeps them in
queues ordered by time, each queue with one timeout:

    heads   a request head is due: fresh connections since accept, keep-alive ones
            since the first byte of the head                  -> header_timeout_s
    idle    keep-alive connections between requests, since their last answer
                                                              -> idle_timeout_s
    bodies  a handler waits for body bytes, by last progress  (its own timeout: the
            body read waits under the request's deadline and body_timeout_s)

A connection is in at most one queue. Each queue is an OrderedDict whose order is
entry time, and entries of one queue share a timeout, so the earliest deadline is
the first entry: the patrol expires connections from the front and then sleeps
exactly until the next deadline (exact under trio's autojump clock), however far
off: an idle server's patrol does not wake at all. An entry added while it sleeps
can only be due before its wake-up when it starts a queue (an entry behind
another of the same queue is due later), so each phase change compares the new
deadline with the wake-up (a float) and only one that is earlier moves it (a
scope deadline, ~3.5 us: the first request after a quiet spell). A reload of the
limits wakes it (`wake()`), since the timeouts it slept on may have shrunk. It used
to wake at least ten times a second, which cost an idle sidecar ~2 ms of CPU a
second per server.

Requests in flight are the fourth queue, `_running`: (start, connection, request
number), appended when a handler starts. A request still running WATCH_AFTER_S
later (give or take WATCH_BATCH_S, so that one pass serves many) gets a watcher
task (the connection's `watch_peer`), which waits for the
client's socket to become readable: EOF or a reset means the client hung up, and
the connection's scope is cancelled, with its handler and the upstream exchange.
The overwhelming majority of requests end sooner and cost a deque append; a
finished entry is dropped when the patrol reaches it.

Eviction (`victim()`, when listen.max_connections is reached): the connection
whose last sign of life is oldest among the first entries of the three queues:
a slowloris head, a stalled body, the longest-idle keep-alive connection. A
connection whose handler runs is never evicted.

Why not a cancel scope per connection phase: entering and leaving a trio scope
costs ~17 us and moving a live scope's deadline ~3.5 us on the shared machine
(trio keeps a heap of deadlines); an OrderedDict insert and delete costs ~0.1 us.

`expire(reason)` on the connection is called with "head", "idle" or "evicted";
the connection cancels its own scope and answers as the reason requires.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import Protocol

import trio

WATCH_AFTER_S = 0.1  # a request running this long gets a watcher for its client's hang-up
# Requests' watch times are gathered into passes this far apart at most: without it the patrol
# woke for the oldest entry, then for the next one a request later (a scheduler pass, a scope
# and its expiry every ~6 requests under load); with it, ~40 passes a second at any rate.
WATCH_BATCH_S = 0.025


class Patrolled(Protocol):
    since: float  # when it entered its current queue (trio time)
    requests: int  # requests begun on it
    evicted: bool  # set when the patrol closes it for a newcomer

    def expire(self, reason: str) -> None: ...

    async def watch_peer(self, request_number: int) -> None: ...


class Patrol:
    def __init__(self, ctx) -> None:
        self.ctx = ctx  # ServerContext: `limits` is read at each pass (a reload may change them)
        self.heads: OrderedDict[Patrolled, None] = OrderedDict()
        self.idle: OrderedDict[Patrolled, None] = OrderedDict()
        self.bodies: OrderedDict[Patrolled, None] = OrderedDict()
        self._queue: dict[Patrolled, OrderedDict] = {}  # where each connection is
        self._running: deque[tuple[float, Patrolled, int]] = deque()
        self.nursery: trio.Nursery | None = None
        self.expired = 0
        self.watchers = 0
        self._sleep: trio.CancelScope | None = None  # the patrol's sleep until its next pass
        self._wake_at = -math.inf  # when that sleep ends: a phase change due before it moves it (module doc)

    def __repr__(self) -> str:
        return (
            f"<Patrol heads={len(self.heads)} idle={len(self.idle)} bodies={len(self.bodies)} "
            f"running~{len(self._running)} expired={self.expired}>"
        )

    # --- phase changes (each O(1)) ---
    def head_due(self, conn: Patrolled, now: float) -> None:
        self._enter(conn, self.heads, now)
        if now + self.ctx.limits.header_timeout_s < self._wake_at:
            self._wake(now + self.ctx.limits.header_timeout_s)

    def idle_since(self, conn: Patrolled, now: float) -> None:
        self._enter(conn, self.idle, now)
        if now + self.ctx.limits.idle_timeout_s < self._wake_at:
            self._wake(now + self.ctx.limits.idle_timeout_s)

    def body_wait(self, conn: Patrolled, now: float) -> None:
        self._enter(conn, self.bodies, now)

    def running(self, conn: Patrolled, request_number: int, now: float) -> None:
        queue = self._queue.pop(conn, None)  # forget(), inline: once per request
        if queue is not None:
            del queue[conn]
        self._running.append((now, conn, request_number))
        # Only a wake-up later than this entry's latest pass is brought forward. (Comparing with its
        # watch time, not its pass, moved a wake-up between the two later, request after request: under
        # traffic less than WATCH_BATCH_S apart the patrol never passed, and no head or idle timed out.)
        due = now + (WATCH_AFTER_S + WATCH_BATCH_S)
        if due < self._wake_at:
            self._wake(due)

    def forget(self, conn: Patrolled) -> None:
        queue = self._queue.pop(conn, None)
        if queue is not None:
            del queue[conn]

    def _enter(self, conn: Patrolled, queue: OrderedDict, now: float) -> None:
        old = self._queue.get(conn)
        if old is not None:
            del old[conn]
        queue[conn] = None
        self._queue[conn] = queue
        conn.since = now

    def wake(self) -> None:
        """Pass now: the limits were reloaded (the timeouts the patrol slept on may have shrunk)."""
        self._wake(-math.inf)

    def _wake(self, at: float) -> None:
        sleep = self._sleep
        if sleep is not None:
            sleep.deadline = at
        self._wake_at = at

    # --- eviction ---
    def victim(self) -> Patrolled | None:
        """Take the connection with the oldest sign of life out of the queues (the caller evicts it)."""
        best = None
        for queue in (self.heads, self.idle, self.bodies):
            if queue:
                first = next(iter(queue))
                if best is None or first.since < best.since:
                    best = first
        if best is not None:
            self.forget(best)
        return best

    # --- the task ---
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            try:
                task_status.started()
                while True:
                    self._wake_at = at = self._pass(trio.current_time())
                    with trio.CancelScope(deadline=at) as self._sleep:
                        await trio.sleep_forever()
                    self._sleep = None
            finally:
                # Closing: a handler still unwinding at shutdown (read_body's finally) must find no
                # nursery to start a watcher in, not a closed one (RuntimeError, logged as a
                # failure). Dropped here, as the body ends: once it has, the nursery refuses new
                # tasks while it waits for its watchers, which a finally outside it would leave open.
                self.nursery = None

    def _pass(self, now: float) -> float:
        """Expire what is due and start watchers; returns when the next pass is due."""
        limits = self.ctx.limits
        header, idle = limits.header_timeout_s, limits.idle_timeout_s
        at = min(self._expire(self.heads, now, header, "head"), self._expire(self.idle, now, idle, "idle"))
        running = self._running
        while running and running[0][0] + WATCH_AFTER_S <= now:
            _, conn, number = running.popleft()
            if conn.requests == number and self.nursery is not None:
                self.watchers += 1
                self.nursery.start_soon(conn.watch_peer, number)
        if running:
            at = min(at, running[0][0] + WATCH_AFTER_S + WATCH_BATCH_S)
        return at

    def _expire(self, queue: OrderedDict, now: float, timeout_s: float, reason: str) -> float:
        while queue:
            conn = next(iter(queue))
            due = conn.since + timeout_s
            if due > now:
                return due
            self.forget(conn)
            self.expired += 1
            conn.expire(reason)
        return math.inf
