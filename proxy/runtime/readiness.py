"""Readiness of the sidecar: every upstream's lifecycle, and what the app asks of them.

Theory of operation: `UpstreamLifecycles` builds one `proxy.runtime.warmup.UpstreamWarmer`
per upstream, runs them under one httpx client, and derives the sidecar's readiness:
ready while at least one upstream is ramping or warm. It is what the app holds:

- `ready` / `is_ready()`: a plain attribute, cheap on the request path;
- `await wait_ready()`: returns once ready; bound it with `trio.move_on_at(deadline)`;
- `await hold_until_ready(deadline)`: `readiness.before_warm` applied ("reject":
  False at once; "hold": wait within the deadline and `max_hold_ms`), False means
  answer 503 not_ready with Retry-After `readiness.retry_after_ms`;
- `report_result(i, ok)`: passive failure detection from the request path;
- `limit_factor(i)`: slow-start multiplier of upstream i's admission limit;
- `readiness()`: (ready, one line per upstream) for /readyz, and `not_ready_reason()`
  the same for the message of a not_ready rejection (which health paths were
  tried and what they answered, so a client is not left guessing);
- `statistics()` for /admin/stats, `update_policy()` on reload.

Waking readiness waiters: one `trio.Event`, set when the sidecar becomes ready and
replaced by a fresh one when it stops being ready, so `wait_ready` never misses a
transition and never spins.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import trio

from proxy.metrics import Metrics
from proxy.policy.schema import Policy
from proxy.runtime.probes import new_client
from proxy.runtime.warmup import UpstreamWarmer, UpstreamWarmupStatistics, now_or_zero


@dataclass(frozen=True)
class ReadinessStatistics:
    ready: bool
    upstreams: tuple[UpstreamWarmupStatistics, ...]


class UpstreamLifecycles:
    """Every upstream's lifecycle, and the sidecar's readiness derived from them."""

    def __init__(
        self, policy: Policy, *, metrics: Metrics | None = None, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.policy = policy
        self.metrics = metrics if metrics is not None else Metrics()
        self._transport = transport  # tests pass httpx.MockTransport; production: real sockets
        self.warmers = [
            UpstreamWarmer(i, u.url, policy, self.metrics, self._recount) for i, u in enumerate(policy.upstreams)
        ]
        self.ready = False  # at least one upstream ramping or warm
        self._ready_event = trio.Event()
        self.metrics.upstreams_ready.set(0)

    def __repr__(self) -> str:
        states = ", ".join(w.lifecycle.state.value for w in self.warmers)
        return f"<UpstreamLifecycles ready={self.ready} [{states}]>"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every upstream's loops; `started()` at once: readiness is `ready`, not this."""
        connections = sum(self.policy.warmup.concurrency + 2 for _ in self.warmers)
        async with new_client(connections, self._transport) as client, trio.open_nursery() as nursery:
            for warmer in self.warmers:
                nursery.start_soon(warmer.run, client)
            task_status.started()

    def is_ready(self) -> bool:
        return self.ready

    def upstream_ready(self, index: int) -> bool:
        return self.warmers[index].lifecycle.ready

    async def wait_ready(self) -> None:
        """Return once some upstream is ready; the caller bounds it (trio.move_on_at(deadline))."""
        while not self.ready:
            await self._ready_event.wait()

    async def hold_until_ready(self, deadline: float) -> bool:
        """Per `readiness.before_warm`: True to go ahead, False to answer 503 not_ready."""
        if self.ready:
            return True
        readiness = self.policy.readiness
        if readiness.before_warm != "hold":
            return False
        with trio.move_on_at(min(deadline, trio.current_time() + readiness.max_hold_ms / 1000)):
            await self.wait_ready()
        return self.ready

    def report_result(self, index: int, ok: bool, now: float | None = None) -> None:
        """From the request path: ok=False for a connect failure or a 5xx from upstream `index`
        (`now`: the trio time the caller read already, else read here)."""
        warmer = self.warmers[index]
        if ok and not warmer.lifecycle.request_failures:  # per request: a success with no streak to end
            return  # changes nothing (UpstreamLifecycle.request_result), so it is not asked
        warmer.report_result(ok, now)

    def limit_factor(self, index: int) -> float:
        return self.warmers[index].limit_factor(trio.current_time())

    def update_policy(self, policy: Policy) -> None:
        """On reload (same upstream list; a changed one needs a restart, as the app says)."""
        self.policy = policy
        for warmer in self.warmers:
            warmer.update_policy(policy)

    def readiness(self) -> tuple[bool, str]:
        """For /readyz: (ready, one line saying why, per upstream)."""
        now = now_or_zero()
        detail = "; ".join(f"upstream {w.index} {w.describe(now)}" for w in self.warmers)
        return self.ready, ("ready: " if self.ready else "not ready: ") + detail

    def not_ready_reason(self) -> str:
        """The message of a not_ready rejection: what each upstream is doing, or what its health check found."""
        return "the model server is not warm yet: " + self.readiness()[1].removeprefix("not ready: ")

    def statistics(self) -> ReadinessStatistics:
        now = now_or_zero()
        return ReadinessStatistics(self.ready, tuple(w.statistics(now) for w in self.warmers))

    def _recount(self) -> None:
        count = sum(w.lifecycle.ready for w in self.warmers)
        self.metrics.upstreams_ready.set(count)
        ready = count > 0
        if ready and not self.ready:
            self._ready_event.set()
        elif self.ready and not ready:
            self._ready_event = trio.Event()
        self.ready = ready
