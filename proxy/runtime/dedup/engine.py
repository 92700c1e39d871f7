"""The dedup engine: one upstream execution per idempotency key.

Theory of operation: `identify()` turns a request into (scope, fingerprint) or
None. `begin()` first looks for a local flight (a `Recording` this replica is
leading) and joins it live; otherwise it asks the store to claim the scope and
lets `proxy.core.dedup.decide` say what the answer means (outcomes.py):
Leader, Follower, Replay, Mismatch, InFlightConflict, StoreDown.

`LeaderHandle.finish()` settles the local recording synchronously (followers are
woken even if the caller is being cancelled), then writes the store under a
shield bounded by store_timeout_ms: the shield covers only that cleanup. Failed
flights leave the local table at once, so the next arrival leads instead of
following a failure. A background task in `run()` refreshes the leases of local
flights every lease_ms/3, so only a dead replica's claims lapse.

Followers of a leader on another replica wait on the store's per-scope signal
and re-read the record at least every lease_ms/2 (a dead leader sends nothing).
Store calls go through `StoreGuard` (guard.py); when the store is unavailable,
on_store_error picks a local-only leader (fail_open: still coalesces on this
replica) or StoreDown (fail_closed). Raw keys are never logged.

With a store that is not in process (Redis), completed records this replica
sees (its own leader's, or one a remote follower read) are kept in a
`ReplayCache` (replay_cache.py, which argues why a kept record is always the
store's current one) until the earliest moment the store's copy can expire;
`begin()` answers a kept scope from it, without a store call. So are the
responses of fail_open leaders while the store is unreachable (`_keep_local`):
retries that reach this replica during an outage replay instead of running again.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from proxy.core import dedup as core
from proxy.core import wire
from proxy.http.messages import Headers, header_value
from proxy.metrics import Metrics
from proxy.policy.dedup import Dedup as DedupPolicy
from proxy.runtime.dedup.coalesce import Events, Recording
from proxy.runtime.dedup.guard import StoreGuard
from proxy.runtime.dedup.outcomes import DedupOutcome, Follower, Identity, Leader, LeaderHandle, StoreDown
from proxy.runtime.dedup.replay_cache import ReplayCache, keep_until
from proxy.runtime.dedup.store import Store, StoreUnavailable

_O = TypeVar("_O")  # a claim outcome, passed through _count
log = logging.getLogger("rampmeter.dedup")

_KEY, _TENANT, _AUTH = wire.IDEMPOTENCY_KEY.encode(), wire.TENANT.encode(), b"authorization"
DECISIONS = ("lead", "follow", "follow_remote", "replay", "mismatch", "conflict", "store_down", "fail_open")
# What a follower on another replica answers when the leader settled without a stored response.
_RELEASE_REASON = {
    core.Verdict.NOT_STORABLE: wire.Reason.UPSTREAM_UNAVAILABLE,
    core.Verdict.TOO_LARGE: wire.Reason.IDEMPOTENCY_KEY_IN_FLIGHT,
}
_STORE_DOWN = core.Failed(wire.Reason.IDEMPOTENCY_STORE_UNAVAILABLE, "the idempotency store is unavailable")


class Deduplicator:
    def __init__(
        self,
        policy: DedupPolicy,
        store: Store,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = trio.current_time,
        rng: random.Random | None = None,
    ) -> None:
        metrics = metrics or Metrics()
        self._store = store
        self._clock = clock
        # The memory store already is memory; in front of Redis, max_memory_bytes bounds this copy instead.
        self._cache = None if store.in_process else ReplayCache(policy.max_memory_bytes, metrics, clock)
        self._guard = StoreGuard(policy, metrics, clock, bounded=not store.in_process)
        self._rng = rng or random.Random()
        self._flights: dict[str, Recording] = {}
        self.policy = policy
        self._decisions = {d: metrics.dedup_decisions.labels(d) for d in DECISIONS}
        self._verdicts = {v: metrics.dedup_finishes.labels(v) for v in [*(x.value for x in core.Verdict), "lost"]}
        self._in_flight = metrics.dedup_in_flight
        self._counts = dict.fromkeys(DECISIONS, 0)

    @property
    def policy(self) -> DedupPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: DedupPolicy) -> None:
        """Swap on reload; the store kind and address apply at the next start."""
        self._policy = self._guard.policy = policy
        self._fp_headers = tuple(name.encode() for name in policy.fingerprint_headers)
        if hasattr(self._store, "max_memory_bytes"):
            self._store.max_memory_bytes = policy.max_memory_bytes
        if self._cache is not None:
            self._cache.max_bytes = policy.max_memory_bytes

    # --- the request path's calls ---

    def identify(self, method: bytes, target: bytes, headers: Headers, body: bytes) -> Identity | None:
        """None without an idempotency-key (or dedup off); HeaderError (400) when it is malformed."""
        raw = header_value(headers, _KEY)
        if raw is None or not self._policy.enabled:
            return None
        key = wire.validate_idempotency_key(raw)
        trust = self._policy.trust_tenant_header
        tenant = core.tenant_of(header_value(headers, _TENANT), header_value(headers, _AUTH), trust)
        path, _, query = target.partition(b"?")
        values = tuple(header_value(headers, name) for name in self._fp_headers)
        return Identity(core.scope_key(tenant, method, path, key), core.fingerprint(body, query, values))

    async def begin(self, scope: str, fingerprint: str) -> DedupOutcome:
        flight = self._flights.get(scope)
        if flight is not None:
            return self._join(flight, fingerprint)
        if self._cache is not None and (kept := self._cache.get(scope)) is not None:
            return self._answer(core.decide(kept, fingerprint, self._policy.on_in_flight))  # Replay or Mismatch
        asked_at = self._clock()  # the scope's state below is what the store held at or after this moment
        token = f"{self._rng.getrandbits(128):032x}"
        try:
            record = await self._guard.call(
                "claim", self._store.claim, scope, fingerprint, token, self._policy.lease_ms
            )
        except StoreUnavailable:
            if (flight := self._flights.get(scope)) is not None:
                return self._join(flight, fingerprint)  # a local leader started while we waited: coalesce
            if self._policy.on_store_error == "fail_closed":
                return self._count("store_down", StoreDown())
            return self._lead(scope, fingerprint, token, degraded=True)
        if record is not None and (flight := self._flights.get(scope)) is not None:
            return self._join(flight, fingerprint)  # a local leader claimed while we waited: follow it live
        decision = core.decide(record, fingerprint, self._policy.on_in_flight)
        if isinstance(decision, core.Lead):
            return self._lead(scope, fingerprint, token, degraded=False)
        if isinstance(decision, core.Follow):
            events = Events(produce=lambda: self._await_remote(scope, fingerprint, asked_at))
            return self._count("follow_remote", Follower(events, remote=True))
        return self._answer(decision)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The store's connections and the lease keeper; runs until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self._store.run)
            if self._cache is not None:
                nursery.start_soon(self._cache.run)
            nursery.start_soon(self._keep_leases)
            task_status.started()

    # --- deciding ---

    def _join(self, flight: Recording, fingerprint: str) -> DedupOutcome:
        record = core.Record(core.State.IN_FLIGHT, flight.fingerprint, flight.token)
        decision = core.decide(record, fingerprint, self._policy.on_in_flight)
        if isinstance(decision, core.Follow):
            sub = flight.subscribe(mark_replayed=True)
            if sub is not None:
                return self._count("follow", Follower(sub))
            decision = core.InFlightConflict()  # its start is no longer kept: cannot be served whole
        return self._answer(decision)

    def _answer(self, decision: core.Decision) -> DedupOutcome:
        """A decision that is its own answer: the core's value is the outcome."""
        if isinstance(decision, core.Replay):
            return self._count("replay", decision)
        if isinstance(decision, core.Mismatch):
            return self._count("mismatch", decision)
        if isinstance(decision, core.InFlightConflict):
            return self._count("conflict", decision)
        raise core.DedupStateError(f"{decision!r} needs a leader or a follower, not an answer")

    def _lead(self, scope: str, fingerprint: str, token: str, degraded: bool) -> Leader:
        flight = Recording(scope, fingerprint, token, self._policy.max_entry_bytes, claimed=not degraded)
        self._flights[scope] = flight
        self._in_flight.set(len(self._flights))
        return self._count("fail_open" if degraded else "lead", Leader(LeaderHandle(self._finish, flight, degraded)))

    def _count(self, decision: str, outcome: _O) -> _O:
        self._decisions[decision].inc()
        self._counts[decision] += 1
        return outcome

    # --- settling ---

    async def _finish(self, handle: LeaderHandle, ok: bool, reason: wire.Reason, message: str) -> core.Verdict:
        if handle.finished:
            raise core.DedupStateError("finish: a leader finishes exactly once")
        handle.finished = True
        flight, policy = handle.recording, self._policy
        verdict = core.settle(ok, flight.status, flight.size, policy.max_entry_bytes, flight.overflowed)
        if verdict is core.Verdict.FAILED:
            flight.fail(reason, message)
            self._forget(flight)  # the next arrival leads rather than joining a failure
        else:
            flight.end()  # a stored flight stays joinable until the store has it
        label = verdict.value
        try:
            if handle.degraded:
                self._keep_local(flight, verdict)
            elif self._store.in_process:  # never suspends: nothing for a cancel to interrupt
                label = label if await self._settle_store(flight, verdict, reason) else "lost"
            else:
                with trio.CancelScope(shield=True):  # cleanup: runs even when the caller is cancelled
                    label = label if await self._settle_store(flight, verdict, reason) else "lost"
        finally:
            self._forget(flight)
            self._verdicts[label].inc()
        return verdict

    async def _settle_store(self, flight: Recording, verdict: core.Verdict, reason: wire.Reason) -> bool:
        """Complete or release the claim; False when a response to keep was not kept."""
        call, ttl_s = self._guard.call, self._policy.ttl_s
        try:
            if verdict is core.Verdict.STORED:
                stored, asked_at = flight.stored(), self._clock()
                # False: the lease lapsed and the key moved on to another leader.
                kept: bool = await call(
                    "complete", self._store.complete, flight.scope, flight.token, flight.fingerprint, stored, ttl_s
                )
                if kept:  # unknown (StoreUnavailable) or lost: another replica may store a different record
                    self._remember(
                        flight.scope, core.Record(core.State.COMPLETE, flight.fingerprint, "", stored), asked_at
                    )
                return kept
            why = reason if verdict is core.Verdict.FAILED else _RELEASE_REASON[verdict]
            await call("release", self._store.release, flight.scope, flight.token, flight.fingerprint, why.value)
            return True
        except StoreUnavailable:
            return verdict is not core.Verdict.STORED  # an unreleased claim lapses with its lease

    def _keep_local(self, flight: Recording, verdict: core.Verdict) -> None:
        """A fail_open leader's response (the store was unreachable): kept in this replica's replay cache.

        The store holds nothing for the scope, so only retries that reach this replica can
        replay it; without it every retry during an outage ran again here too. Another
        replica may run the key again and keep its own response: fail_open's bargain,
        narrowed to "once per replica" (see replay_cache.py).
        """
        if verdict is core.Verdict.STORED:
            record = core.Record(core.State.COMPLETE, flight.fingerprint, "", flight.stored())
            self._remember(flight.scope, record, self._clock())

    def _remember(self, scope: str, record: core.Record, written_after: float) -> None:
        """Keep a complete record the store wrote at or after `written_after`, for as long as it surely keeps it."""
        if self._cache is not None:
            self._cache.put(scope, record, keep_until(written_after, self._policy.ttl_s))

    def _forget(self, flight: Recording) -> None:
        if self._flights.get(flight.scope) is flight:
            del self._flights[flight.scope]
            self._in_flight.set(len(self._flights))

    # --- following another replica, keeping leases ---

    async def _await_remote(self, scope: str, fingerprint: str, asked_at: float) -> list[core.Event]:
        """Wake on the leader's notification; re-check at half a lease in case it died.

        The claim that sent us here saw the scope in flight at or after `asked_at`: a complete
        record read now was written after it.
        """
        recheck_s = self._policy.lease_ms / 2000
        try:
            signal = await self._guard.call("watch", self._store.watch, scope)
        except StoreUnavailable:
            return [_STORE_DOWN]
        try:
            while True:
                wake = signal.event  # before the read: a notification landing after it still wakes us
                record = await self._guard.call("get", self._store.get, scope)
                if record is None:
                    return [_released(signal.message)]
                if record.state is core.State.COMPLETE:
                    self._remember(scope, record, asked_at)
                if record.fingerprint != fingerprint:
                    return [
                        core.Failed(
                            wire.Reason.IDEMPOTENCY_KEY_REUSED, "idempotency-key was reused with a different request"
                        )
                    ]
                if record.state is core.State.COMPLETE:
                    assert record.stored is not None
                    return core.replay_events(record.stored)
                with trio.move_on_after(recheck_s):
                    await wake.wait()
        except StoreUnavailable:
            return [_STORE_DOWN]
        finally:
            # Not through the guard: the local bookkeeping must happen even while its breaker is open.
            with trio.CancelScope(shield=True), trio.move_on_after(self._policy.store_timeout_ms / 1000):
                try:
                    await self._store.unwatch(scope, signal)
                except StoreUnavailable:
                    pass

    async def _keep_leases(self) -> None:
        while True:
            await trio.sleep(self._policy.lease_ms / 3000)
            claims = [
                (f.scope, f.token, f.fingerprint) for f in self._flights.values() if f.claimed and f.terminal is None
            ]
            if not claims:
                continue
            try:
                lost = await self._guard.call("refresh", self._store.refresh, claims, self._policy.lease_ms)
            except StoreUnavailable:
                continue
            if lost:
                log.warning("dedup: %d in-flight claims lapsed before their refresh", lost)

    def statistics(self) -> dict[str, Any]:
        return {
            "in_flight": len(self._flights),
            "followers": sum(f.subscribers for f in self._flights.values()),
            "decisions": dict(self._counts),
            "guard": self._guard.statistics(),
            "store": self._store.statistics(),
            "replay_cache": None if self._cache is None else self._cache.statistics(),
        }

    def __repr__(self) -> str:
        return (
            f"<Deduplicator in_flight={len(self._flights)} store={self._store!r} cache={self._cache!r} "
            f"on_in_flight={self._policy.on_in_flight}>"
        )


def _released(message: bytes | None) -> core.Failed:
    """The leader's failure, as its replica announced it (or a lapse: no announcement)."""
    reason = wire.Reason.UPSTREAM_UNAVAILABLE
    if message and message.startswith(b"R"):
        try:
            reason = wire.Reason(message[1:].decode())
        except ValueError:
            pass
    if reason is wire.Reason.IDEMPOTENCY_KEY_IN_FLIGHT:
        return core.Failed(reason, "the response was too large to share; retrying runs the request again")
    return core.Failed(
        reason, "the request holding this idempotency-key ended without a stored response; retrying runs it again"
    )
