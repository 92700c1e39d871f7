"""Socket reads and writes for the data path: trio's semantics, without its per-call overheads.

Theory of operation: trio's `SocketStream.send_all` / `receive_some` try the
system call first and, when it succeeds at once, yield to the scheduler anyway
(`cancel_shielded_checkpoint`, so every call is a scheduling point); when it
would block they catch BlockingIOError and wait. On a proxy that is a full
scheduler pass per response written, plus an exception, an async context
manager and a spare system call per read that has to wait. Here:

- `send_all` writes with one non-blocking `os.write`; the kernel nearly always
  takes a response whole. Only a remainder waits (`wait_writable`), as trio would.
- `receive(sock, n, wait_first)`: a caller in the middle of a message reads
  first and waits only if nothing was there. A caller that knows nothing can be
  there yet (the peer is waiting for our answer, or for its next request) first
  lets the other tasks run (one scheduler pass), then reads, and waits for
  readability only on EAGAIN. trio's wait costs an epoll_ctl to arm the
  descriptor (EPOLLONESHOT), the epoll event and the reschedule; under load the
  peer's bytes have arrived by the time the other tasks have run, so most reads
  skip all of that (the wire configuration of bench/overhead, A/B in one run on
  a busy machine: 218 -> 170 us/request CPU at best, 289 -> 221 median). An idle
  server pays one failed read per wait.

Both still honour cancellation on entry (`checkpoint_if_cancelled`), every wait
is a trio checkpoint (so deadlines and cancellation work as before), and a
fairness budget forces a real yield after FAIR_STREAK operations in a row that
completed without waiting, so a connection that always has data ready (a fast
upstream streaming a large body to a fast client) cannot starve the others.

`wrap(stream)` gives a connection one object with both operations: these fast
paths for a `trio.SocketStream`, the stream's own methods for any other stream
(the in-memory streams of the tests). `SocketIO(sock, learns=True)` (the HTTP/1.1
upstream connection's) also remembers whether reading first pays on that socket:
where the peer is slower than we are, every optimistic read fails, so after two
such misses in a row it waits for readability first, trying a read first again
every PROBE_EVERY-th time (SocketIO doc). Measured (stream6, callgrind, the wire
with the habit on every connection): a request every 50 ms 546-548k -> 515-516k
instructions per request, a paced SSE chunk 105k -> 95k; closed loop within the
noise. It is off elsewhere: through the sidecar to an h2c gRPC servicer
(bench.grpc --quick, two pairs on a busy machine) CPU per call did not drop and
at 32 calls in flight rose (375 -> 447, 310 -> 501 µs), which the noise there
could not settle either way; so the server connections and the h2c upstream read
as before.

Errors are trio's: a closed socket raises trio.ClosedResourceError, any other
OSError trio.BrokenResourceError (as `SocketStream` translates them). Callers
pass trio socket objects (`SocketStream.socket`); the descriptor is read at each
call, never cached, so a socket closed by another task is never confused with a
reused descriptor. Only one task may read, and one write, a socket at a time
(trio raises BusyResourceError for two waiters, as before).
"""

from __future__ import annotations

import errno
import math
import os
from functools import partial

import trio

FAIR_STREAK = 16
MISSES_BEFORE_SKIP = 2  # SocketIO.receive: failed optimistic reads in a row before it waits first
PROBE_EVERY = 8  # ... and, while it does, how many reads wait first between two that try first
_CLOSED_ERRNOS = frozenset({errno.EBADF, errno.ENOTSOCK})
_streak = 0  # operations completed without a scheduling point since the last one


def _translate(exc: OSError) -> trio.BrokenResourceError | trio.ClosedResourceError:
    if exc.errno in _CLOSED_ERRNOS:
        return trio.ClosedResourceError("this socket was already closed")
    return trio.BrokenResourceError(f"socket connection broken: {exc}")


# Descriptors are read at each use as `sock._sock.fileno()` ("_fd(), inline" below): -1 once
# closed. The stdlib socket under trio's is asked directly: trio's `fileno()` is a Python method
# around the same call, and these paths ask two to four times per request.


def _check_open(fd: int) -> None:
    if fd < 0:  # closed by us: trio's wait functions want a real descriptor
        raise trio.ClosedResourceError("this socket was already closed")


async def send_all(
    sock: trio.socket.SocketType,
    data: bytes | bytearray | memoryview,
    deadline: float = math.inf,
    stall_s: float = math.inf,
) -> None:
    """Write all of `data`: at once if the kernel takes it, else waiting for room until `deadline`.

    Past `deadline` (trio time), or once the kernel has taken nothing for `stall_s`, it
    raises trio.TooSlowError. Only a write that has to wait pays for the cancel scope
    that takes.
    """
    global _streak
    await _checkpoint_if_cancelled()
    try:
        sent = _write(sock._sock.fileno(), data)  # type: ignore[attr-defined]  # _fd(), inline: see above
    except BlockingIOError:
        sent = 0
    except OSError as exc:
        raise _translate(exc) from exc
    if sent == len(data):
        _streak += 1
        if _streak >= FAIR_STREAK:
            _streak = 0
            await _yield()
        return
    view = memoryview(data)
    with trio.fail_at(min(deadline, trio.current_time() + stall_s)) as scope:
        while sent < len(view):
            fd = sock._sock.fileno()  # type: ignore[attr-defined]  # _fd(), inline: see above
            _check_open(fd)
            try:
                await _wait_writable(fd)  # a checkpoint; ClosedResourceError if closed meanwhile
                sent += _write(sock._sock.fileno(), view[sent:])  # type: ignore[attr-defined]  # _fd(), inline: see above
            except BlockingIOError:
                continue
            except OSError as exc:
                raise _translate(exc) from exc
            if stall_s != math.inf:  # progress: the stall bound starts again
                scope.deadline = min(deadline, trio.current_time() + stall_s)
    _streak = 0


async def receive(sock: trio.socket.SocketType, max_bytes: int, wait_first: bool) -> bytes:
    """Up to `max_bytes` bytes; b"" at EOF. See the module doc for `wait_first`."""
    global _streak
    if wait_first:
        await _checkpoint()  # the other tasks first (module doc); a cancellation raises here
        _streak = 0
    else:
        await _checkpoint_if_cancelled()
    try:
        data = _read(sock._sock.fileno(), max_bytes)  # type: ignore[attr-defined]  # _fd(), inline: see above
    except BlockingIOError:
        pass
    except OSError as exc:
        raise _translate(exc) from exc
    else:
        if not wait_first:
            _streak += 1
            if _streak >= FAIR_STREAK:
                _streak = 0
                await _yield()
        return data
    return await _wait_and_read(sock, max_bytes)


async def _wait_and_read(sock: trio.socket.SocketType, max_bytes: int) -> bytes:
    """Wait until `sock` is readable, then read once (again on a spurious wake-up)."""
    global _streak
    while True:
        fd = sock._sock.fileno()  # type: ignore[attr-defined]  # _fd(), inline: see above
        _check_open(fd)
        try:
            # A checkpoint; ClosedResourceError if closed meanwhile. Given the descriptor (read
            # just now), not the socket, which trio would ask for it once more.
            await _wait_readable(fd)
            _streak = 0
            return _read(sock._sock.fileno(), max_bytes)  # type: ignore[attr-defined]  # _fd(), inline: see above
        except BlockingIOError:
            continue
        except OSError as exc:
            raise _translate(exc) from exc


# Bound once: each is looked up per call otherwise (module attribute, then trio's re-exports).
_checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
_checkpoint = trio.lowlevel.checkpoint
_yield = trio.lowlevel.cancel_shielded_checkpoint
_wait_readable = trio.lowlevel.wait_readable
_wait_writable = trio.lowlevel.wait_writable
_read = os.read
_write = os.write


class SocketIO:
    """The fast paths above for one socket, whose reads learn when not to try first.

    `send_all` is the function itself (one call less). `receive` is `receive()` plus one
    habit per socket: after MISSES_BEFORE_SKIP optimistic reads in a row found nothing
    (EAGAIN), the next ones go straight to the readability wait and read once it fires,
    saving the failed read (a system call and an exception) and, for `wait_first`, the
    scheduler pass before it. That is a connection whose peer is slower than we are: a
    unary gRPC call at a modest rate (two failed reads a call, one per side), or an SSE
    stream relayed token by token (one failed read per chunk). Every PROBE_EVERY-th read
    still tries first, so a connection whose bytes start arriving ahead of us (the same
    connection under load) finds out within that many reads and goes back to reading
    first, where a wait for bytes already there would cost an epoll round trip instead.
    A wait is a checkpoint either way, so cancellation and fairness are as before.
    """

    __slots__ = ("_misses", "_skips", "send_all", "sock")

    def __init__(self, sock: trio.socket.SocketType, *, learns: bool = False) -> None:
        self.sock = sock
        self.send_all = partial(send_all, sock)
        # learns=False: never waits first (the habit off; `_misses` stays below the bar), as the server
        # connections and the h2c upstream read (see the module doc for where it was measured to pay).
        self._misses = 0 if learns else -(1 << 62)  # optimistic reads in a row that found nothing
        self._skips = 0  # reads since the last optimistic one (in skip mode)

    async def receive(self, max_bytes: int, wait_first: bool) -> bytes:
        """As `receive(sock, max_bytes, wait_first)`, skipping the read first where it keeps failing."""
        global _streak
        sock = self.sock
        if self._misses >= MISSES_BEFORE_SKIP:
            if self._skips < PROBE_EVERY:
                self._skips += 1
                while True:  # _wait_and_read, inline: the path of every chunk of a paced stream
                    fd = sock._sock.fileno()  # type: ignore[attr-defined]  # _fd(), inline: see above
                    _check_open(fd)
                    try:
                        await _wait_readable(fd)  # a checkpoint: cancellation as before, the others run
                        _streak = 0
                        return _read(sock._sock.fileno(), max_bytes)  # type: ignore[attr-defined]  # _fd(), inline
                    except BlockingIOError:
                        continue
                    except OSError as exc:
                        raise _translate(exc) from exc
            self._skips = 0
        if wait_first:
            await _checkpoint()
            _streak = 0
        else:
            await _checkpoint_if_cancelled()
        try:
            data = _read(sock._sock.fileno(), max_bytes)  # type: ignore[attr-defined]  # _fd(), inline: see above
        except BlockingIOError:
            self._misses += 1
            return await _wait_and_read(sock, max_bytes)
        except OSError as exc:
            raise _translate(exc) from exc
        if self._misses > 0:
            self._misses = 0
        if not wait_first:
            _streak += 1
            if _streak >= FAIR_STREAK:
                _streak = 0
                await _yield()
        return data


class StreamIO:
    """Any other trio stream, through its own methods."""

    __slots__ = ("stream",)

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream

    async def send_all(
        self, data: bytes | bytearray | memoryview, deadline: float = math.inf, stall_s: float = math.inf
    ) -> None:
        # No progress to watch through a stream's send_all: the stall bound caps the whole write.
        with trio.fail_at(min(deadline, trio.current_time() + stall_s)):
            await self.stream.send_all(data)

    async def receive(self, max_bytes: int, wait_first: bool) -> bytes:
        return await self.stream.receive_some(max_bytes)  # type: ignore[return-value]  # a SocketStream's are bytes; no copy on the data path


def wrap(stream: trio.abc.Stream) -> SocketIO | StreamIO:
    return SocketIO(stream.socket) if isinstance(stream, trio.SocketStream) else StreamIO(stream)
