"""Sockets held waiting for a client that may never send, woken in bounded batches.

Theory of operation: trio wakes every task whose socket became readable in the same
scheduler pass. That is what a server wants for connections doing work, and what it
cannot afford for thousands of connections a client holds open and then drops at
once: under bench.attacks' stalled_bodies, 4,096 request bodies stall, the attacker
exits, all 4,096 sockets report EOF together, and every connection's task ran its
ending (the read, the failed body, the close: ~30 us each) in one or two passes,
120-270 ms in which no other request moved.

A connection that waits for such a client (a request body still to come, an idle HTTP/2
connection) parks its socket in the server's `WaitRoom` instead of trio's own epoll (`receive`).
The room has an epoll descriptor of its own (one-shot registrations), which trio watches for it
(one registration). When that is readable, the room's task sorts every ready socket (SORT per
epoll_wait, a scheduler pass between chunks) into two lanes: bytes to read, or a hang-up (EOF,
reset, error: EPOLLRDHUP / EPOLLHUP / EPOLLERR), and wakes at most BATCH tasks a pass, the
bytes-to-read lane first. After a full batch, more may be ready: it waits until every other task
is blocked (trio.testing.wait_all_tasks_blocked, the loop's idle time, as the accept loop does:
proxy/http/server.py) before sorting again and taking the next, BURST_DEFER_MAX_S at most. So a
burst of N closes is N / BATCH passes of at most BATCH endings each (~1 ms), run while the loop
has nothing better to do, and a request in flight waits for one batch at most per pass, not for
the whole burst. A socket with bytes for us goes before every hang-up still queued: a normal
client's idle HTTP/2 connection is parked in the same room as an attacker's stalled bodies, and
when thousands of those hung up at once its next request was woken behind all of them (300th of
301 in tests/security/test_waitroom_lanes.py; under bench.attacks' stalled_bodies an HTTP/2
request sent at once was answered after 873 ms while the sidecar's own handling of every request
took at most 61 ms: this is one way that happens). Waking costs one scheduler pass and one epoll_ctl
per wait, which only a body that arrives in pieces and an idle HTTP/2 connection's next request
pay, and only when a read finds nothing.

A connection that trio itself woke for its client's EOF (an HTTP/2 connection idle
after its streams ended: its reader began waiting while they ran, so in trio's epoll)
takes a turn to end (`ending()`): at most BATCH such endings are let through per pass,
the same way. The wake-up and the read of the EOF (a few us each) still happen in one
pass; the ending itself (GOAWAY, the writer task, the nursery, the close: ~100 us for
HTTP/2) is batched. bench.attacks' bad_targets held ~500 such connections and dropped
them at its exit.

While a burst goes through (from the first full batch until both lanes are empty), the
cyclic garbage collector is paused (`gc.disable()`, only if it was on, and on again when
the burst ends, or after GC_PAUSE_MAX_S at most). A collector pass in the middle of a burst walks every
object of the connections still waiting for their turn, which are about to be freed by
refcount anyway: under stalled_bodies' exit that was one gen-1 pass over ~130,000-
190,000 objects, ~100 ms, the largest pause left. After the burst the same pass walks
what is still alive. A burst is at most N / BATCH batches of BURST_DEFER_MAX_S
(~1.3 s for 4,096 held connections with the loop never idle); the connections'
endings leave no cyclic garbage (h1server `_unlink`, `_H2State.release`), so nothing
piles up meanwhile.

A parked wait is a trio checkpoint like trio's own: cancelling it (a deadline, an
eviction, the patrol) takes the socket out of the room. Outside a running room (a
server not serving, a system without epoll) the wait is trio's.

Why not nginx's design whole (connections without a task, one watcher for all their
sockets): here a connection is a task, and a parked task costs memory, not CPU; what
hurt was only how many woke at once, and that the room bounds.
"""

from __future__ import annotations

import errno
import gc
import os
import select
from collections import deque

import trio
from trio.testing import wait_all_tasks_blocked  # the runner's own idle test (module doc)

BATCH = 32  # sockets woken per scheduler pass (~30 us each for an ending connection: ~1 ms)
SORT = 256  # ready sockets taken from the room's epoll per call while sorting them into lanes
_HANGUP = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR if hasattr(select, "epoll") else 0
BURST_DEFER_MAX_S = 0.01  # with the loop never idle, one batch per this long: endings are slowed, never stopped
# The longest the collector stays paused for one burst. A burst of N endings lasts N / BATCH batches (4,096:
# ~1.3 s with the loop never idle), but sockets that keep becoming ready (thousands of idle HTTP/2 clients
# pinging, stalled bodies trickling) can keep both lanes from emptying for as long as they last, and the
# collector must not stay off with them.
GC_PAUSE_MAX_S = 2.0
_CLOSED_ERRNOS = frozenset({errno.EBADF, errno.ENOTSOCK})


class WaitRoom:
    def __init__(self) -> None:
        self._epoll: select.epoll | None = None  # while the room's task runs
        self._waiting: dict[int, trio.lowlevel.Task] = {}
        self._data: deque[int] = deque()  # sorted, not yet woken: sockets with bytes to read
        self._hangups: deque[int] = deque()  # and sockets whose peer hung up (or failed)
        self.woken = 0
        self.batches_deferred = 0  # full batches after which the next waited for the loop's idle time
        self._endings = trio.lowlevel.ParkingLot()  # connections waiting for their turn to end (`ending`)
        self._endings_waiting = trio.Event()
        self.endings = 0
        self._bursts = 0  # batch loops in a burst now (the wakes', the endings'): the collector waits meanwhile
        self._gc_paused = False
        self._gc_paused_at = 0.0  # trio time the collector was paused (GC_PAUSE_MAX_S)

    def __repr__(self) -> str:
        return f"<WaitRoom waiting={len(self._waiting)} woken={self.woken}>"

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The room's task: wake parked sockets' tasks, BATCH a pass (module doc). Until cancelled."""
        if not hasattr(select, "epoll"):
            task_status.started()
            await trio.sleep_forever()  # no room: every wait is trio's own
        self._epoll = epoll = select.epoll()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._let_endings_through)
                task_status.started()
                while True:
                    if not (self._data or self._hangups):
                        await trio.lowlevel.wait_readable(epoll.fileno())
                    await self._sort(epoll)
                    if self._wake_batch() == BATCH and (self._data or self._hangups):
                        self._burst_begins()
                        try:
                            while self._data or self._hangups:
                                await self._between_batches()
                                await self._sort(epoll)  # bytes that came meanwhile go before the hang-ups
                                self._wake_batch()
                        finally:
                            self._burst_ends()
        finally:
            self._epoll = None
            for fd, task in list(self._waiting.items()):  # none should be left: they share our nursery
                del self._waiting[fd]
                trio.lowlevel.reschedule(task)
            epoll.close()

    async def _between_batches(self) -> None:
        """After a full batch: until the loop has nothing else to run, BURST_DEFER_MAX_S at most (module doc).
        The batch just woken runs meanwhile."""
        self.batches_deferred += 1
        if self._gc_paused and trio.current_time() - self._gc_paused_at >= GC_PAUSE_MAX_S:
            self._gc_paused = False  # a burst that does not end: the collector runs again (GC_PAUSE_MAX_S)
            gc.enable()
        with trio.move_on_after(BURST_DEFER_MAX_S):
            await wait_all_tasks_blocked()

    async def _let_endings_through(self) -> None:
        lot = self._endings
        while True:
            await self._endings_waiting.wait()
            self._endings_waiting = trio.Event()
            if lot.unpark(count=BATCH) and lot:
                self._burst_begins()
                try:
                    while True:
                        await self._between_batches()
                        if not (lot.unpark(count=BATCH) and lot):
                            break
                finally:
                    self._burst_ends()
            await trio.lowlevel.checkpoint()  # the last batch runs before the lot is looked at again

    def _burst_begins(self) -> None:
        """The collector waits until the burst is over (module doc); only if it was on."""
        if not self._bursts and gc.isenabled():
            gc.disable()
            self._gc_paused = True
            self._gc_paused_at = trio.current_time()
        self._bursts += 1

    def _burst_ends(self) -> None:
        self._bursts -= 1
        if not self._bursts and self._gc_paused:
            self._gc_paused = False
            gc.enable()

    async def ending(self) -> None:
        """Wait for this connection's turn to end (module doc): at once, unless many end together."""
        if self._epoll is None:
            return
        self._endings_waiting.set()
        self.endings += 1
        await self._endings.park()

    async def _sort(self, epoll: select.epoll) -> None:
        """Every socket ready now, out of the room's epoll into its lane: bytes to read, or a hang-up."""
        while True:
            ready = epoll.poll(0, SORT)
            for fd, events in ready:  # one-shot: reported once, still registered until its task is woken
                (self._hangups if events & _HANGUP else self._data).append(fd)
            if len(ready) < SORT:
                return
            await trio.lowlevel.checkpoint()  # thousands ready at once: sorted a chunk a pass

    def _wake_batch(self) -> int:
        """Wake up to BATCH parked tasks, those with bytes to read first; how many were woken."""
        woken = 0
        for lane in (self._data, self._hangups):
            while lane and woken < BATCH:
                fd = lane.popleft()
                task = self._waiting.pop(fd, None)
                if task is None:
                    continue  # its wait was cancelled meanwhile
                # A stale entry (its wait cancelled, the fd reused by a newer wait) wakes that newer
                # wait: it reads nothing and parks again.
                self._unregister(fd)
                woken += 1
                trio.lowlevel.reschedule(task)
        self.woken += woken
        return woken

    def _unregister(self, fd: int) -> None:
        epoll = self._epoll
        if epoll is not None:
            try:
                epoll.unregister(fd)
            except (OSError, ValueError):
                pass  # closed meanwhile (the kernel dropped it), or the room closed

    async def wait_readable(self, fd: int) -> None:
        """Until `fd` is readable (or has EOF or an error): parked in the room, or trio's wait outside one."""
        epoll = self._epoll
        if epoll is None:
            await trio.lowlevel.wait_readable(fd)
            return
        if fd in self._waiting:
            raise trio.BusyResourceError("another task is waiting for this socket")
        epoll.register(fd, select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLONESHOT)
        self._waiting[fd] = trio.lowlevel.current_task()

        def abort(_raise_cancel) -> trio.lowlevel.Abort:
            self._waiting.pop(fd, None)
            self._unregister(fd)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def receive(self, sock: trio.socket.SocketType, max_bytes: int) -> bytes:
        """Up to `max_bytes` from `sock`, b"" at EOF: read now, or park until readable. A checkpoint on entry.

        Errors as trio's SocketStream: ClosedResourceError for a closed socket, BrokenResourceError otherwise.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            fd = sock.fileno()
            if fd < 0:
                raise trio.ClosedResourceError("socket was closed")
            try:
                return os.read(fd, max_bytes)
            except BlockingIOError:
                pass
            except OSError as exc:
                if exc.errno in _CLOSED_ERRNOS:
                    raise trio.ClosedResourceError("socket was closed") from exc
                raise trio.BrokenResourceError(exc) from exc
            await self.wait_readable(fd)
