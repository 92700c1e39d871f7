"""The request path, top to bottom.

Theory of operation: `RequestPath.__call__` is the data listener's handler and
reads like the path itself:

    served path? (listen.served_paths, else 404) -> read the bounded body
    -> classify (class, cost, tenant, one absolute deadline)
    -> dedup claim (leader / follower / replay) -> readiness -> shed check and
    admission queue (SJF with aging), waiting for a slot under the deadline ->
    forward upstream with the remaining budget (alone, or merged with others by
    the batcher on a batchable route) -> stream the response back ->
    record latency, resolve dedup, release the slot exactly once

Each step is a call into the module that owns it; this file only sequences them
and answers per the wire contract (proxy/core/wire.py). The parts it calls are typed
and named (`Collaborators`: scheduler, dedup, readiness, pool, observatory, metrics,
batcher, the policy), built by `App`; a policy reload hands over a whole new, immutable set
(`RequestPath.update`), and each request uses the one set it started with. A request whose deadline
passes is answered 504 deadline_expired, and its upstream exchange is cancelled,
freeing the GPU. How the deadline is applied depends on whether the request can
wait anywhere that only a cancel scope bounds:

- the common case (ready, HTTP/1.1 or HTTP/2, not a batching route, not a background
  dedup leader): no scope. A queued wait ends at the controller's expiry (never later
  than the deadline); the upstream exchange is bounded by the pool (relay.forward with
  scoped=False: no scope per request for HTTP/1.1 upstreams); a client that does not
  read its answer is given up at the deadline by the h1 server (`Request.deadline`); an
  HTTP/2 client's answer is checked against the deadline on the clock before its one
  write, and only a streamed answer gets a scope (relay._relay `write_by`). Entering and
  leaving a scope costs ~17 us a request (proxy/http/deadlines.py), most of a "plain"
  request's wait-free path.
- otherwise (warming up, a batching route, a background leader): one `trio.move_on_at`
  around readiness, queueing and the upstream call.

Request bodies are read whole (bounded by listen.max_body_bytes) before anything
else: admission needs them to estimate cost and dedup to fingerprint them, the
same choice the Gateway API inference extension makes. Responses always stream.

Idempotent requests: the dedup leader's exchange writes into a recording that its
own client, coalesced followers and later replays all read (proxy/runtime/sinks.py).
With dedup.continue_on_disconnect (default) the exchange runs in a task of the
app's nursery, so a client that disconnects and retries attaches to the work
already running instead of paying the GPU twice. On an upstream that keeps
computing after a disconnect (`Scheduler.keeps_computing`: stops_on_cancel =
false, or learned by "auto"), such a background
leader is not cut at its deadline once it is upstream: the work runs anyway, so
it is let finish (within `upstreams[i].timeout_s`) and its answer serves the
client's retry, and its lease ends when the server is really done.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from proxy.core import wire
from proxy.core.decisions import ExpiredAt, Outcome, Reject, Ticket, deadline_expired
from proxy.core.grpc_wire import is_grpc
from proxy.core.served_paths import ServedPaths
from proxy.errors import ResponseCut, UpstreamTimeout
from proxy.http.h2stream import PassingBody
from proxy.http.messages import Request, ResponseSink
from proxy.http.pool import UpstreamPool
from proxy.http.ratelog import RateLimitedLog
from proxy.metrics import Metrics
from proxy.policy.schema import Policy
from proxy.runtime import edge, grpc_answers, passthrough, relay
from proxy.runtime.batcher import Batcher
from proxy.runtime.classify import classify
from proxy.runtime.dedup import Deduplicator, Follower, Leader, LeaderHandle, Replay, answer, events_of
from proxy.runtime.fields import Fields
from proxy.runtime.observe import Observatory
from proxy.runtime.scheduler import Scheduler, Slot
from proxy.runtime.sinks import RecordingSink, TeeSink, play

log = logging.getLogger("rampmeter.request")
_events = RateLimitedLog(log)

_QUEUE_MS = wire.QUEUE_MS.encode()
_FAILED = (Outcome.ERROR, Outcome.REFUSED)
_JSON = [(b"content-type", b"application/json")]
_NOT_SERVED = (
    b'{"error": {"type": "invalid_request_error", "code": "not_found", '
    b'"message": "this path is not served here (listen.served_paths)"}}'
)


class ResponseAborted(ResponseCut):
    """The response had started when the deadline passed: the client's stream is cut."""


class Readiness(Protocol):
    """What the request path asks of readiness (proxy/runtime/readiness.py UpstreamLifecycles)."""

    @property
    def ready(self) -> bool: ...

    async def hold_until_ready(self, deadline: float) -> bool: ...

    def not_ready_reason(self) -> str: ...

    def report_result(self, index: int, ok: bool, now: float | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class Collaborators:
    """The parts one request uses, built by `App` for one policy; a reload builds a new set."""

    policy: Policy
    scheduler: Scheduler
    dedup: Deduplicator
    readiness: Readiness
    pool: UpstreamPool
    observatory: Observatory
    metrics: Metrics
    batcher: Batcher


class RequestPath:
    """Handler for the data listener; one per sidecar."""

    def __init__(self, parts: Collaborators) -> None:
        self.nursery: trio.Nursery | None = None  # the app's: background dedup leaders run in it (App.run sets it)
        self._rejections: dict[
            tuple[str, wire.Reason], Any
        ] = {}  # folded counters (proxy/metrics.py Tally), bound once
        self._goodput: dict[str, Any] = {}
        self.update(parts)

    def update(self, parts: Collaborators) -> None:
        """Put a new set of parts in force (a reload): requests from now on use it whole."""
        metrics = parts.metrics  # the same registry across reloads: the bound children stay valid
        self._rejections_metric = metrics.rejections
        self._goodput_metric = metrics.goodput
        self._served = ServedPaths(parts.policy.listen.served_paths)
        self._parts = parts

    @property
    def parts(self) -> Collaborators:
        return self._parts

    async def __call__(self, request: Request, sink: ResponseSink, fields: Fields | None = None) -> None:
        """`fields`: the header fields the edge read (proxy/runtime/fields.py); read here without an edge."""
        p = self._parts
        if fields is None:
            fields = Fields.read(request.headers)
        if is_grpc(fields.content_type):  # a gRPC client gets rejections gRPC-shaped
            sink = grpc_answers.for_request(request, sink)
        path = request.path  # split from the target once: the served-paths check and the cost's route
        if self._served.prefixes and not self._served.allows(path):  # none: every path is served
            await sink.respond(404, _JSON, _NOT_SERVED)  # listen.served_paths: not the model's to answer
            return
        upload = passthrough.streamed(request, fields, p.batcher.batches)  # gRPC streams: the body goes up as it comes
        body = b"" if upload is not None else await request.body.read_all()
        now = trio.current_time()  # read once: classify, the ticket and admission all run in this step
        try:
            ticket = classify(path, fields, body, now, p.scheduler, p.policy)
            request.klass = ticket.klass  # the class label of rampmeter_requests_total
            edge.note_ticket(ticket)  # access log, span
            key = fields.idempotency_key
            identity = None if key is None else p.dedup.identify(request.method, request.target, request.headers, body)
        except wire.HeaderError as exc:
            await self.reject(sink, Reject(wire.Reason.BAD_REQUEST, None, str(exc)))
            return
        if identity is None:
            await self.execute(
                request, body if upload is None else upload, ticket, sink, parts=p, restamp=fields.has_budget, now=now
            )
        else:
            await self._idempotent(request, body, ticket, identity, sink, p)

    async def _idempotent(
        self, request: Request, body: bytes, ticket: Ticket, identity: Any, sink: ResponseSink, p: Collaborators
    ) -> None:
        dedup = p.dedup
        # Shielded (the guard bounds it by store_timeout_ms): a client that leaves mid-claim
        # must not cancel it after Redis took the claim but before we heard so; that leaves a
        # claim with no leader, which every retry follows until the lease lapses. Once it
        # returns, a Leader is started (or released by its handle) before the next checkpoint.
        with trio.CancelScope(shield=True):
            outcome = await dedup.begin(identity.scope, identity.fingerprint)
        edge.note_idempotency(outcome)
        if isinstance(outcome, Leader):
            handle = outcome.handle
            if dedup.policy.continue_on_disconnect and self.nursery is not None:
                own = handle.subscribe()  # before anything is recorded
                self.nursery.start_soon(self._lead, request, body, ticket, handle, p)
                await play(own, sink)
            else:
                async with handle:
                    await self.execute(request, body, ticket, TeeSink(sink, RecordingSink(handle)), parts=p)
                    await handle.finish(True)
        elif isinstance(outcome, Follower | Replay):
            await play(events_of(outcome), sink)
        else:  # Mismatch, InFlightConflict, StoreDown
            await sink.respond(*answer(outcome))

    async def _lead(
        self, request: Request, body: bytes, ticket: Ticket, handle: LeaderHandle, p: Collaborators
    ) -> None:
        """The leader's exchange, outliving its client; never lets an error reach the nursery."""
        try:
            async with handle:
                await self.execute(request, body, ticket, RecordingSink(handle), outlive=True, parts=p)
                await handle.finish(True)
        except Exception:  # the handle told its readers; the app must keep serving
            log.debug("idempotent exchange failed", exc_info=True)

    async def execute(
        self,
        request: Request,
        body: bytes | PassingBody,
        ticket: Ticket,
        sink: ResponseSink,
        *,
        outlive: bool = False,
        parts: Collaborators | None = None,
        restamp: bool = True,
        now: float | None = None,
    ) -> None:
        """Readiness, admission and the upstream exchange, all under the ticket's deadline (`outlive`:
        a background leader, which a server that keeps computing may finish past it; `restamp`: the client
        sent a budget header, which the relay rewrites with what remains; `now`: the trio time the caller
        read in this same step, with no checkpoint since, which admission then uses)."""
        p = self._parts if parts is None else parts
        readiness, scheduler = p.readiness, p.scheduler
        if readiness.ready and not outlive and not (p.batcher.enabled and p.batcher.batches(request)):
            # The fast path, no cancel scope: a queued wait ends at the controller's expiry, the pool
            # bounds the exchange by the deadline, the HTTP/1.1 server the client's writes
            # (Request.deadline), and for an HTTP/2 client the relay (a clock check before a single
            # write; a scope only around a streamed answer: relay._relay).
            request.deadline = ticket.deadline
            decided = scheduler.arrive(ticket, trio.current_time() if now is None else now)
            slot = decided if isinstance(decided, Slot) else await scheduler.wait(decided)
            refusal = slot.rejection
            if refusal is None:
                # `async with scheduler.admit(...)` spelled out: two coroutine layers fewer per request
                try:
                    refusal = await self._forward(
                        request, body, ticket, slot, sink, p, scoped=False, restamp=restamp, now=now
                    )
                except BaseException as exc:
                    slot.close(type(exc))
                    raise
                slot.close(None)
            if refusal is not None:
                await self.reject(sink, refusal, ticket.klass)
            return
        refusal = None
        with trio.move_on_at(ticket.deadline) as deadline:
            if not readiness.ready and not await readiness.hold_until_ready(ticket.deadline):
                retry_ms = p.policy.readiness.retry_after_ms
                refusal = Reject(wire.Reason.NOT_READY, retry_ms, readiness.not_ready_reason())
            else:
                async with scheduler.admit(ticket) as slot:
                    if slot.rejection is not None:
                        refusal = slot.rejection
                    else:
                        if outlive and scheduler.keeps_computing(slot.upstream):
                            # The server finishes it whether we wait or not: wait, for the retry's sake.
                            deadline.deadline = trio.current_time() + p.policy.upstreams[slot.upstream].timeout_s
                        refusal = await self._forward(request, body, ticket, slot, sink, p)
        # Refusals are written outside the deadline's scope: a deadline that passes while the
        # answer is being written must not cut it (a 1 ms budget would get a dropped connection).
        if refusal is not None:
            await self.reject(sink, refusal, ticket.klass)
        elif deadline.cancelled_caught:
            if sink.headers_sent:
                _events.event(
                    "deadline_mid_response",
                    "deadline passed while streaming the response to %s for %r; cut",
                    request.client or "?",
                    request,
                )
                raise ResponseAborted("deadline passed while the response was streaming")
            await self.reject(sink, deadline_expired(ExpiredAt.UPSTREAM), ticket.klass)

    async def _forward(
        self,
        request: Request,
        body: bytes | PassingBody,
        ticket: Ticket,
        slot: Slot,
        sink: ResponseSink,
        p: Collaborators,
        scoped: bool = True,
        restamp: bool = True,
        now: float | None = None,
    ) -> Reject | None:
        """Forward and relay, with the queue wait and the timeout hint as headers. Whether the
        deadline still covers the service time was admission's to judge (proxy/core/admission.py).
        `now`: the time admission was asked at; still the time if the lease was granted then (admitted
        at once: no checkpoint since), so no clock read for it."""
        lease = slot.lease
        assert lease is not None  # forwarded only with a lease (slot.rejection is None)
        if now is None or lease.admitted_at != now:
            now = trio.current_time()
        queue_ms, upstream = lease.queue_ms, lease.upstream  # the lease's fields, not the Slot's properties
        edge.note_admitted(upstream, queue_ms)
        key = ticket.key  # (route, cost bucket): the hint, its key header and the latency windows
        hint, hint_key = p.observatory.hint_fields(key, now, lease.service_ms + queue_ms)
        extra = [(_QUEUE_MS, b"%d" % queue_ms), hint, hint_key]
        timeout_s = p.policy.upstreams[upstream].timeout_s
        if not isinstance(body, bytes):  # a streamed body that arrived whole while it queued goes as bytes
            body = await passthrough.settle(body, request)

        # The slot is released when the upstream's part is over, before the last write to the client
        # (Slot.finished: a deadline the pool ended it at is a censored cut, as the scope's cancellation would be).
        release = slot.finished
        try:
            if scoped:  # the batcher forwards it alone (relay.forward) unless its route batches (runtime/batcher.py)
                result = await p.batcher.forward(
                    p.pool, upstream, timeout_s, request, body, sink, extra, ticket, release, scoped=True
                )
            else:  # execute's fast path: not a batching route (Batcher.batches), one coroutine layer fewer
                result = await relay.forward(
                    p.pool,
                    upstream,
                    timeout_s,
                    request,
                    body,
                    sink,
                    extra,
                    ticket.deadline,
                    release,
                    scoped=False,
                    restamp=restamp,
                    started=now,
                )
        except (UpstreamTimeout, trio.TooSlowError) as exc:  # unscoped only: the deadline passed mid-stream
            if not slot.released:
                slot.cut()
            _events.event(
                "deadline_mid_response",
                "deadline passed while streaming the response to %s for %r; cut",
                request.client or "?",
                request,
            )
            raise ResponseAborted("deadline passed while the response was streaming") from exc
        edge.note_service(result.service_ms)  # here, in the request's task (a batch may release from another)
        if result.reason is wire.Reason.DEADLINE_EXPIRED:  # unscoped only: as the scope's cancellation would be
            self._count_rejection(ticket.klass, result.reason)
            return None
        # When the upstream's part ended (the relay read it for the service time, just before the last
        # client write): the request's end for readiness, the latency windows and goodput, no clock read.
        done_at = result.ended_at
        if done_at is None:  # answered for the upstream (a rejection): read now
            done_at = trio.current_time()
        p.readiness.report_result(upstream, result.outcome not in _FAILED, done_at)
        if result.cut:
            raise ResponseCut("the upstream failed mid-response")  # relay logged it
        p.observatory.record(ticket, queue_ms, result.service_ms, done_at, key)
        if result.reason is not None:
            self._count_rejection(ticket.klass, result.reason)
        elif 200 <= result.status < 300 and done_at <= ticket.deadline:
            goodput = self._goodput.get(ticket.klass)  # _count_goodput's bound child, looked up inline
            if goodput is None:
                self._count_goodput(ticket.klass)
            else:
                goodput.inc()
        return None

    def _count_goodput(self, klass: str) -> None:
        child = self._goodput.get(klass)
        if child is None:
            child = self._goodput[klass] = self._goodput_metric.labels(klass)
        child.inc()

    def _count_rejection(self, klass: str, reason: wire.Reason) -> None:
        child = self._rejections.get((klass, reason))
        if child is None:
            child = self._rejections[(klass, reason)] = self._rejections_metric.labels(klass, reason.value)
        child.inc()

    async def reject(self, sink: ResponseSink, reject: Reject, klass: str = "") -> None:
        """Answer for the sidecar; `klass` is "" before classification (a malformed header)."""
        self._count_rejection(klass, reject.reason)
        await sink.respond(*reject.response())
