"""What `Deduplicator.begin()` answers, as values, and the leader's recording handle.

Theory of operation: the request path matches on the outcome type and never
sees the store. `Replay`, `Mismatch` and `InFlightConflict` are the pure core's
decisions themselves; `Leader`, `Follower` and `StoreDown` exist only at runtime
(a recording handle, a live subscription, a store that could not be asked).
Outcomes that end the request themselves get their answer from `answer()`, built
with `wire.rejection`, so their status codes and reasons stay in the wire contract. A follower whose
leader failed before any byte reads a `Failed` event; `failure_answer()` turns
it into the leader's status (or aborts the stream when bytes were sent).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import NamedTuple, Self

import trio

from proxy.core import dedup as core
from proxy.core import wire
from proxy.http.messages import Headers
from proxy.runtime.dedup.coalesce import Events, Recording, Subscription

RETRY_MS = 1000  # the retry-after for 409 in flight and 503 store unavailable


class Identity(NamedTuple):
    scope: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Leader:
    handle: LeaderHandle


@dataclass(frozen=True, slots=True)
class Follower:
    events: Subscription | Events
    remote: bool = False  # the leader is on another replica: the events come after it completes


# Replay, Mismatch and InFlightConflict are the pure core's own decisions
# (proxy.core.dedup), passed through as they are: one type per concept.


@dataclass(frozen=True, slots=True)
class StoreDown:
    """The store could not be asked and the policy says fail_closed: 503."""


def events_of(outcome: Follower | core.Replay) -> Subscription | Events:
    """What a follower or a replay reads: a stored response is the same events a live follower gets."""
    if isinstance(outcome, Follower):
        return outcome.events
    return Events(core.replay_events(outcome.stored))


def answer(outcome: core.Mismatch | core.InFlightConflict | StoreDown) -> tuple[int, Headers, bytes]:
    """The answer for an outcome that ends the request itself."""
    if isinstance(outcome, core.Mismatch):
        return wire.rejection(
            wire.Reason.IDEMPOTENCY_KEY_REUSED, "idempotency-key was already used with a different request"
        )
    if isinstance(outcome, core.InFlightConflict):
        return wire.rejection(
            wire.Reason.IDEMPOTENCY_KEY_IN_FLIGHT, "a request with this idempotency-key is in progress", RETRY_MS
        )
    return wire.rejection(wire.Reason.IDEMPOTENCY_STORE_UNAVAILABLE, "the idempotency store is unavailable", RETRY_MS)


DedupOutcome = Leader | Follower | core.Replay | core.Mismatch | core.InFlightConflict | StoreDown


def failure_answer(event: core.Failed) -> tuple[int, Headers, bytes]:
    """The answer for a follower whose leader failed before any byte was sent."""
    retry = RETRY_MS if event.reason in wire.RETRYABLE_REASONS else None
    return wire.rejection(event.reason, event.message, retry)


Finish = Callable[["LeaderHandle", bool, wire.Reason, str], Awaitable[core.Verdict]]


class LeaderHandle:
    """Record the response as it is sent; `finish()` exactly once (or leave `async with`)."""

    __slots__ = ("_finish", "degraded", "finished", "recording")

    def __init__(self, finish: Finish, recording: Recording, degraded: bool) -> None:
        self._finish = finish
        self.recording = recording
        self.degraded = degraded  # fail_open: no store record, coalescing on this replica only
        self.finished = False

    def record_head(self, status: int, headers: Headers, streamed: bool = False) -> None:
        self.recording.record_head(status, headers, streamed)

    def record_chunk(self, data: bytes) -> None:
        self.recording.record_chunk(data)

    def record_trailers(self, headers: Headers) -> None:
        self.recording.record_trailers(headers)

    def subscribe(self) -> Subscription:
        """The leader's own client reads here too, so the work can outlive it. Call before recording."""
        sub = self.recording.subscribe(mark_replayed=False)
        if sub is None:
            raise core.DedupStateError("subscribe the leader's client before recording past max_entry_bytes")
        return sub

    async def finish(
        self, ok: bool, reason: wire.Reason = wire.Reason.UPSTREAM_UNAVAILABLE, message: str = ""
    ) -> core.Verdict:
        """ok: the exchange completed and every byte was recorded. Else followers get `reason`."""
        return await self._finish(self, ok, reason, message or "the request holding this idempotency-key failed")

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self.finished:
            cancelled = exc_type is not None and issubclass(exc_type, trio.Cancelled)
            await self.finish(
                False, message="the request holding this idempotency-key was cancelled" if cancelled else ""
            )

    def __repr__(self) -> str:
        return f"<LeaderHandle {self.recording!r} degraded={self.degraded} finished={self.finished}>"
