"""Coalescing: one leader's response, recorded once, read by every follower.

Theory of operation: the leader's exchange writes into a `Recording` (head,
chunks, then exactly one terminal `End` or `Failed`). Each `Subscription` has its
own queue of references to the same immutable events, so a slow follower never
slows the leader or another follower, and the leader never waits for anyone: it
keeps recording with zero subscribers (its client may be gone while the work
goes on, so that client's retry can attach to it).

A follower that joins late gets the events recorded so far, then the live ones:
every subscriber sees the identical byte sequence. The recording keeps its log
only up to `max_buffer_bytes` (the policy's max_entry_bytes): past it the log is
dropped, subscribers already attached keep streaming, and newcomers cannot be
served from the start (`subscribe()` returns None; the engine answers 409).

`Events` is the iterator for everything else a caller reads: a replay (a fixed
list) or a follower of another replica (computed by one awaited call, so no
cancel scope is ever held across a `yield`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Self

import trio

from proxy.core.dedup import END, Chunk, DedupStateError, End, Event, Failed, Head, Stored, Trailers, replayed
from proxy.core.wire import IDEMPOTENT_REPLAYED, QUEUE_MS, TIMEOUT_HINT_MS, Reason
from proxy.http.messages import HOP_BY_HOP

# Never recorded: connection-specific headers.
_NOT_RECORDED = HOP_BY_HOP
# Recorded for live readers (the leader's own client, coalesced followers) but not
# stored for replay: they describe one execution (its queue wait, the hint then),
# and a replay gets `idempotent-replayed` added afresh.
_PER_EXECUTION = {name.encode() for name in (QUEUE_MS, TIMEOUT_HINT_MS, IDEMPOTENT_REPLAYED)}


class Recording:
    __slots__ = ("_log", "_max", "_subs", "claimed", "fingerprint", "head", "scope", "size", "terminal", "token")

    def __init__(self, scope: str, fingerprint: str, token: str, max_buffer_bytes: int, claimed: bool = True) -> None:
        self.scope = scope
        self.fingerprint = fingerprint
        self.token = token
        self.claimed = claimed  # False: fail_open flight with no store record
        self.head: Head | None = None
        self.terminal: End | Failed | None = None
        self.size = 0
        self._max = max_buffer_bytes
        self._log: list[Event] | None = []  # None once over _max
        self._subs: set[Subscription] = set()

    @property
    def overflowed(self) -> bool:
        return self._log is None

    @property
    def status(self) -> int | None:
        return None if self.head is None else self.head.status

    def record_head(self, status: int, headers: list[tuple[bytes, bytes]], streamed: bool = False) -> None:
        if self.head is not None or self.terminal is not None:
            raise DedupStateError("record_head: the head is recorded once, before any chunk")
        kept = [(k, v) for k, v in headers if k not in _NOT_RECORDED]
        self.head = Head(status, kept, streamed)
        self._append(self.head, sum(len(k) + len(v) for k, v in kept))

    def record_chunk(self, data: bytes) -> None:
        if self.head is None or self.terminal is not None:
            raise DedupStateError("record_chunk: only between record_head and the end")
        if data:
            self._append(Chunk(bytes(data)), len(data))

    def record_trailers(self, headers: list[tuple[bytes, bytes]]) -> None:
        if self.head is None or self.terminal is not None:
            raise DedupStateError("record_trailers: only after record_head, before the end")
        kept = [(k, v) for k, v in headers if k not in _NOT_RECORDED]
        self._append(Trailers(kept), sum(len(k) + len(v) for k, v in kept))

    def end(self) -> None:
        if self.head is None:
            raise DedupStateError("end: nothing was recorded")
        self._settle(END)

    def fail(self, reason: Reason, message: str) -> None:
        self._settle(Failed(reason, message))

    def subscribe(self, mark_replayed: bool) -> Subscription | None:
        """Everything so far, then live; None when the start is no longer kept."""
        if self._log is None:
            return None
        sub = Subscription(self, self._log, mark_replayed)
        if self.terminal is None:
            self._subs.add(sub)
        return sub

    def stored(self) -> Stored:
        assert self.head is not None and self._log is not None and self.terminal is END
        chunks = [e.data for e in self._log if isinstance(e, Chunk)]
        trailers = [f for e in self._log if isinstance(e, Trailers) for f in e.headers]
        headers = [(k, v) for k, v in self.head.headers if k not in _PER_EXECUTION]
        return Stored(self.fingerprint, self.head.status, headers, chunks, self.head.streamed, trailers)

    def _append(self, event: Event, size: int) -> None:
        self.size += size
        if self._log is not None:
            self._log.append(event)
            if self.size > self._max:
                self._log = None
        for sub in self._subs:
            sub._push(event)

    def _settle(self, terminal: End | Failed) -> None:
        if self.terminal is not None:
            raise DedupStateError("a recording ends exactly once")
        self.terminal = terminal
        self._append(terminal, 0)
        self._subs.clear()  # each keeps its own queue; nothing more will come

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    def __repr__(self) -> str:
        state = "live" if self.terminal is None else type(self.terminal).__name__.lower()
        return (
            f"<Recording {self.scope[:12]} {state} status={self.status} bytes={self.size} "
            f"subscribers={len(self._subs)} overflowed={self.overflowed}>"
        )


class Subscription:
    """Async iterator of one reader's events; ends after the terminal event."""

    __slots__ = ("_done", "_mark", "_queue", "_recording", "_wake")

    def __init__(self, recording: Recording, backlog: Iterable[Event], mark_replayed: bool) -> None:
        self._recording = recording
        self._queue: deque[Event] = deque(backlog)
        self._wake: trio.Event | None = None
        self._mark = mark_replayed
        self._done = False

    def _push(self, event: Event) -> None:
        self._queue.append(event)
        if self._wake is not None:
            self._wake.set()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        if self._done:
            raise StopAsyncIteration
        while not self._queue:
            self._wake = trio.Event()
            try:
                await self._wake.wait()
            finally:
                self._wake = None
        event = self._queue.popleft()
        if isinstance(event, Head) and self._mark:
            event = replayed(event)
        elif isinstance(event, End | Failed):
            self.close()
        return event

    def close(self) -> None:
        """Stop receiving (the reader's client left); idempotent."""
        self._done = True
        self._queue.clear()
        self._recording._subs.discard(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Subscription {self._recording.scope[:12]} queued={len(self._queue)} done={self._done}>"


class Events:
    """Events from a list, or from one awaited call that produces the list."""

    __slots__ = ("_produce", "_queue")

    def __init__(
        self, events: Iterable[Event] = (), produce: Callable[[], Awaitable[list[Event]]] | None = None
    ) -> None:
        self._queue: deque[Event] = deque(events)
        self._produce = produce

    def __aiter__(self) -> Events:
        return self

    async def __anext__(self) -> Event:
        if self._produce is not None:
            produce, self._produce = self._produce, None
            self._queue.extend(await produce())
        if not self._queue:
            raise StopAsyncIteration
        return self._queue.popleft()

    def close(self) -> None:
        self._produce = None
        self._queue.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Events queued={len(self._queue)} pending={self._produce is not None}>"
