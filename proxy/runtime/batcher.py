"""The trio driver of micro-batching: admitted requests wait here, go upstream together, come back split.

Theory of operation: the request path hands every admitted request to
`Batcher.forward(...)`, which has `proxy.runtime.relay.forward`'s signature
(plus the ticket) and, for a path `[[batching.routes]]` does not name (or a body
its codec cannot take apart: proxy/core/batch_bodies.py), is exactly that call.
A batchable request becomes a member of the lane (route, upstream) its slot
chose: its task parks on an Event while the pure `BatchFormer`
(proxy/core/batching.py) decides when its batch leaves; the decisions come back
as `Batch` values, and each is sent by a task in the batcher's nursery. That
task merges the bodies, makes one upstream call, splits the answer and wakes
every member with its own; each member writes its answer to its own client and
returns a `Forwarded` to the request path, which ends the member's admission
lease as for any request (so a batch holds the slots of all its members' cost
until it returns, and SJF, classes, deadlines and shedding applied to each member
before it got here). One timer task wakes at the earliest time a gathering batch
falls due (autojump_clock exact).

Members only share a call when the codec's key (model, parameters), the tenant,
the request target and the route's `match_headers` (and content-type, accept)
are equal. The merged call carries those headers, not the members' others;
budget headers are not forwarded (members' deadlines differ).

A member whose client leaves (its task cancelled, deadline included) leaves its
batch if it was not sent (`BatchFormer.leave`); once sent, its share of the
answer is discarded, and when every member of a sent batch has left the call is
cancelled, so a server that stops on cancel stops computing.

Errors: a connection failure, timeout or unreadable answer gives every member
the sidecar's answer (502 / 504, as relay does); 429 and 503 go to every member
as the upstream gave them. Another 4xx/5xx: when it names one input
(`input[3]`), that member alone gets it (renumbered) and the others are sent
again once; otherwise, with `on_batch_error = "split"`, the batch is sent again
once as two halves, whose answers are final; else every member gets it.

Latency: each member's lease ends with the call's own time (the service the
member saw upstream); the lane's latency curve learns from whole batches.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from proxy.core import wire
from proxy.core.batch_bodies import Part, SplitError, Unbatchable, codec_for
from proxy.core.batching import Batch, BatchFormer, Bounds, LatencyCurve, Member
from proxy.core.cost import CostEstimator
from proxy.core.decisions import Observed, Outcome, Ticket
from proxy.errors import UpstreamConnectError, UpstreamError
from proxy.http import forward as fwd
from proxy.http.messages import Headers, Request, ResponseSink
from proxy.runtime import relay
from proxy.runtime.relay import Forwarded

if TYPE_CHECKING:
    from proxy.http.pool import Upstreams
    from proxy.metrics import Metrics
    from proxy.policy.batching import BatchRoute
    from proxy.policy.schema import Policy

log = logging.getLogger("rampmeter.batcher")

_POST = b"POST"
_CONTENT_LENGTH = b"content-length"
_ALWAYS_MATCHED = (b"content-type", b"accept")
_PRIOR_SCALE = 0.25  # the latency prior's slope weighs at a quarter of max_batch_tokens


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    headers: Headers
    body: bytes
    outcome: Outcome
    service_ms: float | None = None
    observed: Observed | None = None
    reason: wire.Reason | None = None


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    headers: Headers
    body: bytes
    service_ms: float


class _Route:
    """One `[[batching.routes]]` entry made ready to use."""

    def __init__(self, cfg: BatchRoute, estimator: CostEstimator, metrics: Metrics | None) -> None:
        self.cfg = cfg
        self.path = cfg.path.encode()
        self.codec = codec_for(cfg.kind, cfg.chars_per_token)
        self.bounds = Bounds(
            cfg.max_batch_items,
            cfg.max_batch_tokens,
            cfg.max_wait_ms / 1000.0,
            tuple(cfg.length_buckets),
            cfg.max_concurrent_batches,
            cfg.adaptive,
        )
        self.headers = _ALWAYS_MATCHED + tuple(h.encode() for h in cfg.match_headers)
        cost = estimator.route_for(cfg.path)
        self.prior = (cost.base_ms, cost.ms_per_prompt_token)
        self.m = _RouteMetrics(metrics, cfg.path)

    def curve(self) -> LatencyCurve:
        return LatencyCurve(*self.prior, scale_tokens=self.bounds.max_tokens * _PRIOR_SCALE)


class _Lane:
    __slots__ = ("former", "route", "upstream")

    def __init__(self, route: _Route, upstream: int) -> None:
        self.route, self.upstream = route, upstream
        self.former = BatchFormer(route.bounds, route.curve())


class _Flight:
    """A sent batch: the scope of its upstream call and how many members still wait for it."""

    __slots__ = ("live", "scope")

    def __init__(self, live: int) -> None:
        self.live = live
        self.scope = trio.CancelScope()


class _Waiter:
    __slots__ = ("answer", "body", "event", "flight", "gone", "headers", "part", "pool", "target", "timeout_s")

    def __init__(
        self, part: Part, body: bytes, pool: Upstreams, target: bytes, headers: Headers, timeout_s: float
    ) -> None:
        self.part, self.body, self.pool, self.target = part, body, pool, target
        self.headers, self.timeout_s = headers, timeout_s
        self.event = trio.Event()
        self.answer: _Answer | None = None
        self.flight: _Flight | None = None  # set when its batch is sent
        self.gone = False

    def deliver(self, answer: _Answer) -> None:
        if self.answer is None and not self.gone:
            self.answer = answer
            self.event.set()


class Batcher:
    """Micro-batching for the routes of `policy.batching`; `forward` is the request path's call."""

    def __init__(self, policy: Policy, metrics: Metrics | None = None) -> None:
        self._metrics = metrics
        self._routes: dict[bytes, _Route] = {}
        self.enabled = False
        self._lanes: dict[tuple[bytes, int], _Lane] = {}
        self._waiters: dict[int, _Waiter] = {}
        self._ids = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self._wake = trio.Event()
        self._armed_at = math.inf
        self.max_open = 0
        self.configure(policy)

    def configure(self, policy: Policy) -> None:
        """Take a (reloaded) policy: routes rebuilt; lanes keep their gathering batches and latency curves."""
        estimator = CostEstimator(policy.routes, policy.scheduling.parse_max_bytes)
        self.max_open = policy.batching.max_open_batches
        self._routes = {r.path.encode(): _Route(r, estimator, self._metrics) for r in policy.batching.routes}
        self.enabled = bool(self._routes)  # some route batches: `batches()` is worth asking (the request path)
        for (path, _), lane in self._lanes.items():
            route = self._routes.get(path)
            if route is not None:
                lane.route = route
                lane.former.bounds = route.bounds
        self._wake.set()

    # --- the request path's call ---------------------------------------------

    async def forward(
        self,
        pool: Upstreams,
        upstream: int,
        timeout_s: float,
        request: Request,
        body: bytes | AsyncIterable[bytes],
        sink: ResponseSink,
        extra_headers: Headers,
        ticket: Ticket,
        on_complete: Callable[[Forwarded], None] | None = None,
        *,
        scoped: bool = True,
    ) -> Forwarded:
        """relay.forward's contract (`on_complete` before the last write); a batched member needs the
        caller's deadline scope (`batches()` says which requests may be batched)."""
        route = self._route(request)
        part = None if route is None or not isinstance(body, bytes) else route.codec.parse(body)
        why = None if route is None or part is None else self._alone(route, part)
        if route is None or part is None or why is not None:
            if route is not None and why is not None:
                route.m.alone(why)
            return await relay.forward(
                pool,
                upstream,
                timeout_s,
                request,
                body,
                sink,
                extra_headers,
                ticket.deadline,
                on_complete,
                scoped=scoped,
            )
        assert scoped, "a batched request runs under its deadline's scope"
        assert isinstance(part, Part)  # an Unbatchable went alone above (_alone names why)
        assert isinstance(body, bytes)  # a streamed body (runtime/passthrough.py) never batches
        answer = await self._gather(route, upstream, pool, timeout_s, request, body, part, ticket)
        result = Forwarded(answer.outcome, answer.status, answer.service_ms, answer.observed, answer.reason)
        if on_complete is not None:
            on_complete(result)
        await sink.respond(answer.status, answer.headers + extra_headers, answer.body)
        return result

    def batches(self, request: Request) -> bool:
        """Whether `request` may be batched (its route batches): the request path then keeps its scope."""
        return self._route(request) is not None

    def _route(self, request: Request) -> _Route | None:
        route = self._routes.get(request.path) if self._routes else None
        if route is None or self._nursery is None or request.method != _POST:
            return None
        return route

    def _alone(self, route: _Route, part: Part | Unbatchable) -> str | None:
        """Why this request goes alone, unbatched (a metrics label), or None."""
        if isinstance(part, Unbatchable):
            return part.reason
        if not route.bounds.fits(part.count, part.tokens):
            return "too_large"
        if sum(lane.former.open_groups for lane in self._lanes.values()) >= self.max_open:
            return "max_open_batches"
        return None

    async def _gather(
        self,
        route: _Route,
        upstream: int,
        pool: Upstreams,
        timeout_s: float,
        request: Request,
        body: bytes,
        part: Part,
        ticket: Ticket,
    ) -> _Answer:
        lane = self._lanes.get((route.path, upstream))
        if lane is None:
            lane = self._lanes[(route.path, upstream)] = _Lane(route, upstream)
        headers = [(name, value) for name, value in request.headers if name in route.headers]
        key = (part.key, ticket.tenant, request.target, tuple(sorted(headers)))
        headers.insert(0, (b"host", pool.authority(upstream)))
        member_id = next(self._ids)
        now = trio.current_time()
        waiter = self._waiters[member_id] = _Waiter(part, body, pool, request.target, headers, timeout_s)
        try:
            self._act(
                lane,
                lane.former.add(
                    Member(member_id, key, part.count, part.tokens, part.longest, now, ticket.deadline), now
                ),
            )
            await waiter.event.wait()
        except BaseException:
            self._abandon(lane, member_id, waiter)
            raise
        finally:
            self._waiters.pop(member_id, None)
        assert waiter.answer is not None  # _Waiter.deliver sets it before the event
        return waiter.answer

    def _abandon(self, lane: _Lane, member_id: int, waiter: _Waiter) -> None:
        """The member's task is leaving by an exception (its client left, or its deadline passed)."""
        if waiter.answer is not None:
            return
        waiter.gone = True
        if waiter.flight is None:
            lane.former.leave(member_id, trio.current_time())
            lane.route.m.dropped("gathering")
            self._rearm(lane)
            return
        lane.route.m.dropped("sent")
        waiter.flight.live -= 1
        if waiter.flight.live <= 0:  # nobody waits for this call any more: stop the upstream's work
            waiter.flight.scope.cancel()

    # --- sending ---------------------------------------------------------------

    def _act(self, lane: _Lane, batches: list[Batch]) -> None:
        nursery = self._nursery
        assert nursery is not None  # lanes act only while run() is serving
        now = trio.current_time()
        for batch in batches:
            waiters = [self._waiters[m.id] for m in batch.members]
            flight = _Flight(len(waiters))
            for w in waiters:
                w.flight = flight
            lane.route.m.sent(batch, now)
            nursery.start_soon(self._send, lane, batch, waiters, flight)
        self._rearm(lane)

    def _rearm(self, lane: _Lane) -> None:
        at = lane.former.wake_at(trio.current_time())
        if at is not None and at < self._armed_at:
            self._wake.set()

    async def _send(self, lane: _Lane, batch: Batch, waiters: list[_Waiter], flight: _Flight) -> None:
        rtt_ms = None
        try:
            with flight.scope:
                rtt_ms = await self._attempt(lane, waiters, retry=True)
        except Exception:  # a bug here must not take the batcher down with it
            log.exception("batch %d failed", batch.id)
        finally:
            gone = wire.rejection(wire.Reason.UPSTREAM_UNAVAILABLE, "the batch ended without an answer")
            for w in waiters:  # nobody may wait forever
                w.deliver(_Answer(gone[0], gone[1], gone[2], Outcome.ERROR, reason=wire.Reason.UPSTREAM_UNAVAILABLE))
            self._act(lane, lane.former.finished(batch, trio.current_time(), rtt_ms))

    async def _attempt(self, lane: _Lane, waiters: list[_Waiter], *, retry: bool) -> float | None:
        """One upstream call for the members still waiting; the call's time when it answered 2xx whole."""
        live = [w for w in waiters if not w.gone]
        if not live:
            return None
        route, first = lane.route, live[0]
        parts = [w.part for w in live]
        # A batch of one goes as its client sent it, and its answer comes back untouched.
        body = first.body if len(live) == 1 else route.codec.merge(parts)
        reply = await self._call(first.pool, lane.upstream, first.target, first.headers, route, body, first.timeout_s)
        if isinstance(reply, _Answer):  # the sidecar answers for a failed call
            for w in live:
                w.deliver(reply)
            return None
        status = reply.status
        if 200 <= status < 300:
            return self._split(route, reply, live)
        outcome = Outcome.DROPPED if status in (429, 503) else Outcome.ERROR if status >= 500 else Outcome.SUCCESS
        if retry and len(live) > 1 and outcome is not Outcome.DROPPED:
            blamed = route.codec.blame(reply.body, parts) if status < 500 else None
            if blamed is not None:
                j, body = blamed
                live[j].deliver(_Answer(status, reply.headers, body, outcome, reply.service_ms))
                route.m.retried("blamed")
                await self._attempt(lane, live[:j] + live[j + 1 :], retry=False)
                return None
            if route.cfg.on_batch_error == "split":
                route.m.retried("split")
                half = len(live) // 2
                await self._attempt(lane, live[:half], retry=False)
                await self._attempt(lane, live[half:], retry=False)
                return None
        for w in live:
            w.deliver(_Answer(status, reply.headers, reply.body, outcome, reply.service_ms))
        return None

    def _split(self, route: _Route, reply: _Reply, live: list[_Waiter]) -> float | None:
        try:
            bodies = [reply.body] if len(live) == 1 else route.codec.split(reply.body, [w.part for w in live])
        except SplitError as exc:
            status, headers, body = wire.rejection(
                wire.Reason.UPSTREAM_UNAVAILABLE, f"batch answer not splittable: {exc}"
            )
            for w in live:
                w.deliver(_Answer(status, headers, body, Outcome.ERROR, reason=wire.Reason.UPSTREAM_UNAVAILABLE))
            return None
        for w, body in zip(live, bodies, strict=True):
            observed = Observed(prompt_tokens=w.part.tokens)
            w.deliver(_Answer(reply.status, reply.headers, body, Outcome.SUCCESS, reply.service_ms, observed))
        return reply.service_ms

    async def _call(
        self,
        pool: Upstreams,
        upstream: int,
        target: bytes,
        headers: Headers,
        route: _Route,
        body: bytes,
        timeout_s: float,
    ) -> _Reply | _Answer:
        """The merged upstream call, read whole (bounded): a _Reply, or the _Answer the sidecar gives instead."""
        started = trio.current_time()
        cap = route.cfg.max_response_bytes
        try:
            with trio.fail_after(timeout_s):
                async with pool.request(upstream, _POST, target, list(headers), body) as resp:
                    chunks, size = [], 0
                    while chunk := await resp.receive():
                        size += len(chunk)
                        if size > cap:
                            return _failed(
                                Outcome.ERROR, wire.Reason.UPSTREAM_UNAVAILABLE, f"batch answer over {cap} bytes"
                            )
                        chunks.append(chunk)
                    out = [h for h in fwd.response_headers(resp.headers, resp.http_version) if h[0] != _CONTENT_LENGTH]
                    service_ms = (trio.current_time() - started) * 1000.0
                    return _Reply(resp.status, out, b"".join(chunks), service_ms)
        except UpstreamConnectError as exc:
            return _failed(Outcome.REFUSED, wire.Reason.UPSTREAM_UNAVAILABLE, f"upstream {upstream} unavailable: {exc}")
        except UpstreamError as exc:
            return _failed(Outcome.ERROR, wire.Reason.UPSTREAM_UNAVAILABLE, f"upstream {upstream} failed: {exc}")
        except trio.TooSlowError:
            return _failed(
                Outcome.DROPPED, wire.Reason.UPSTREAM_TIMEOUT, f"upstream {upstream} took longer than {timeout_s:g}s"
            )

    # --- timers ----------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                while True:
                    self._wake = trio.Event()
                    now = trio.current_time()
                    times = [lane.former.wake_at(now) for lane in self._lanes.values()]
                    self._armed_at = min((t for t in times if t is not None), default=math.inf)
                    with trio.move_on_at(self._armed_at):
                        await self._wake.wait()
                    now = trio.current_time()
                    for lane in list(self._lanes.values()):
                        self._act(lane, lane.former.poll(now))
            finally:
                self._nursery = None

    # --- introspection ---------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        now = trio.current_time()
        return {
            "routes": [r.cfg.path for r in self._routes.values()],
            "lanes": {f"{path.decode()}#{up}": lane.former.statistics(now) for (path, up), lane in self._lanes.items()},
            "waiting": len(self._waiters),
        }

    def __repr__(self) -> str:
        return f"<Batcher routes={len(self._routes)} lanes={len(self._lanes)} waiting={len(self._waiters)}>"


def _failed(outcome: Outcome, reason: wire.Reason, message: str) -> _Answer:
    status, headers, body = wire.rejection(reason, message)
    return _Answer(status, headers, body, outcome, reason=reason)


class _RouteMetrics:
    """The batching metrics of one route (proxy/metrics.py SPECS), children bound once."""

    def __init__(self, metrics: Metrics | None, route: str) -> None:
        self._m = metrics
        self._route = route
        self._children: dict[tuple[str, str], Any] = {}
        if metrics is not None:
            self._items = metrics.batch_items.labels(route)
            self._tokens = metrics.batch_tokens.labels(route)
            self._wait = metrics.batch_wait_seconds.labels(route)
            self._padding = metrics.batch_padding_tokens.labels(route)
            self._saved = metrics.batch_padding_saved_tokens.labels(route)

    def _child(self, name: str, label: str) -> Any:
        key = (name, label)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = getattr(self._m, name).labels(self._route, label)
        return child

    def sent(self, batch: Batch, now: float) -> None:
        if self._m is None:
            return
        self._child("batches", batch.closed_by).inc()
        self._items.observe(batch.items)
        self._tokens.observe(batch.tokens)
        self._padding.inc(batch.padding_tokens)
        self._saved.inc(batch.padding_saved_tokens)
        for m in batch.members:
            self._wait.observe(now - m.arrived_at)

    def alone(self, reason: str) -> None:
        if self._m is not None:
            self._child("batch_unbatched", reason).inc()

    def dropped(self, stage: str) -> None:
        if self._m is not None:
            self._child("batch_members_dropped", stage).inc()

    def retried(self, how: str) -> None:
        if self._m is not None:
            self._child("batch_retries", how).inc()
