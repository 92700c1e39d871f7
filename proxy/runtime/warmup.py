"""The trio driver of one upstream's lifecycle: health checks, warm-up probes, ramp.

Theory of operation: an `UpstreamWarmer` owns one pure
`proxy.core.lifecycle.UpstreamLifecycle` and two tasks that feed it:

- the health loop: one active check (`proxy.runtime.probes.check_health`)
  every `warmup.health_interval_s`, whatever the state, so a restart (identity
  change) or a dead server is noticed even while warm; while the upstream is
  cold or unhealthy and its checks fail, sooner (`proxy.core.health.next_check_in`:
  from 0.1 s backing off to the interval), so a model that comes up is seen
  within a fraction of a second. The health path is the configured one or the
  one its `HealthDiscovery` found; `describe()` says which, or what was tried;
- the warm loop: waits for PROBING, runs one warm-up attempt under the
  `overall_timeout_s` deadline, reports the verdict, then sleeps through the
  slow-start ramp until RAMPING ends (or waits `retry_interval_s` after a
  failed attempt).

The request path reports outcomes through `report_result(ok)` (synchronous,
cheap): a streak of failures turns the upstream unhealthy.

`on_sample(path, body, latency_ms)`, when the owner sets it, hears every probe
that succeeded: the app seeds the service-time model with them, so the first
real requests are judged by measured latencies rather than by priors.

Every transition goes through `UpstreamWarmer.apply`, the one place that acts
on them: metrics, one log line per state change, and two invariants:
- leaving PROBING cancels the running attempt (so a restart mid-warm-up never
  ends in PROBES_PASSED for the previous process);
- waiters on a state change are woken and the owner's `on_change` runs (the
  readiness of the whole sidecar, `proxy.runtime.readiness`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
import trio

from proxy.core.health import Answer, HealthDiscovery, next_check_in
from proxy.core.lifecycle import Event, LifecycleStatistics, State, Transition, UpstreamLifecycle
from proxy.core.slow_start import slow_start_factor
from proxy.core.warmup import ProbePlan, ProbeResult, ShapeStatistics
from proxy.metrics import Metrics
from proxy.policy.schema import Policy
from proxy.runtime.probes import check_health, plan_for, read_bodies, run_probes

log = logging.getLogger("rampmeter.warmup")

RAMP_GAUGE_STEP_S = 1.0  # how often slow_start_factor is refreshed during a ramp
_LOSABLE = (State.PROBING, State.RAMPING, State.WARM)
_LOSS_EVENTS = (Event.RESTARTED, Event.HEALTH_LOST, Event.FAILURE_STREAK)
_SEARCHING = (State.COLD, State.UNHEALTHY)  # not in service: checked sooner while checks fail


def now_or_zero() -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # built outside trio.run (a test, a tool); the first event corrects it
        return 0.0


@dataclass(frozen=True)
class UpstreamWarmupStatistics:
    index: int
    url: str
    lifecycle: LifecycleStatistics
    slow_start_factor: float
    probes: tuple[ShapeStatistics, ...]  # the running or last warm-up attempt
    last_warmup_s: float | None
    last_problem: str  # last failed health check or warm-up, for /readyz and humans
    health: str  # which health path is used (configured or discovered), or what was tried


class UpstreamWarmer:
    """One upstream's lifecycle and the two tasks that drive it."""

    def __init__(self, index: int, url: str, policy: Policy, metrics: Metrics, on_change: Callable[[], None]) -> None:
        self.index, self.url, self.policy, self.metrics = index, url.rstrip("/"), policy, metrics
        self.lifecycle = UpstreamLifecycle(
            now=now_or_zero(),
            unhealthy_after=policy.warmup.unhealthy_after,
            failure_streak=policy.warmup.failure_streak,
            ramp_window_s=policy.slow_start.window_s,
        )
        self.last_warmup_s: float | None = None
        self.last_problem = ""
        self.discovery = _discovery(policy)
        self._health_failures = 0  # consecutive failed checks, for the backoff while not in service
        self._logged_path: str | None = None  # the discovered health path last logged
        self._warned_none = False  # "no candidate answers 2xx" logged since
        self._label = metrics.upstream(index)  # the address, as dashboards show it
        self._on_change = on_change
        self._changed = trio.Event()
        self._attempt_scope: trio.CancelScope | None = None
        self._plan: ProbePlan | None = None
        self._bodies: list[bytes] = []
        self._probing_since = 0.0
        # Hears each successful probe (path, body, latency ms): the app seeds the service model.
        self.on_sample: Callable[[str, bytes, float], None] | None = None
        metrics.upstream_state.labels(self._label, State.COLD.value).set(1)
        metrics.slow_start_factor.labels(self._label).set(0)

    def __repr__(self) -> str:
        return f"<UpstreamWarmer {self.index} {self.url} {self.lifecycle.state.value}>"

    def update_policy(self, policy: Policy) -> None:
        """Thresholds apply at once; probes and timeouts at the next check or attempt."""
        if _discovery_settings(policy) != _discovery_settings(self.policy):
            self.discovery = _discovery(policy)
        self.policy = policy
        self.lifecycle.unhealthy_after = policy.warmup.unhealthy_after
        self.lifecycle.failure_streak = policy.warmup.failure_streak
        self.lifecycle.ramp_window_s = policy.slow_start.window_s

    async def run(self, client: httpx.AsyncClient) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._health_loop, client)
            nursery.start_soon(self._warm_loop, client)

    # --- the two loops ----------------------------------------------------------

    async def _health_loop(self, client: httpx.AsyncClient) -> None:
        while True:
            warmup = self.policy.warmup
            result = await check_health(client, self.url, warmup, self.discovery)
            self._health_failures = 0 if result.ok else self._health_failures + 1
            if not result.ok:
                self.last_problem = result.detail  # "health /health 503", "health: tried ...", ...
            self._log_discovery(result.ok)
            self.apply(self.lifecycle.health(trio.current_time(), result.ok, result.identity))
            failures = self._health_failures if self.lifecycle.state in _SEARCHING else 0
            await trio.sleep(next_check_in(failures, warmup.health_interval_s))

    def _log_discovery(self, ok: bool) -> None:
        """One line when a health path is found, one when no candidate is one (until one is found)."""
        d = self.discovery
        if d.configured:
            return
        if ok and d.found != self._logged_path:
            log.info("upstream %d (%s): %s", self.index, self.url, d.describe())
            self._logged_path, self._warned_none = d.found, False
        elif not ok and not self._warned_none and d.last_round and all(t.answer is Answer.ABSENT for t in d.last_round):
            log.warning("upstream %d (%s): %s", self.index, self.url, d.describe())
            self._warned_none = True

    async def _warm_loop(self, client: httpx.AsyncClient) -> None:
        while True:
            while self.lifecycle.state is not State.PROBING:
                await self._changed.wait()
            passed = await self._attempt(client)
            if passed is None:
                continue  # the upstream left PROBING under us (restart, health lost)
            self.apply(self.lifecycle.probes_finished(trio.current_time(), passed))
            if passed:
                await self._ramp()
            else:
                await trio.sleep(self.policy.warmup.retry_interval_s)

    async def _attempt(self, client: httpx.AsyncClient) -> bool | None:
        """One warm-up; None when it was cancelled because the state left PROBING."""
        warmup = self.policy.warmup
        plan = self._plan = plan_for(warmup)
        with trio.CancelScope() as attempt:
            self._attempt_scope = attempt
            try:
                with trio.move_on_after(warmup.overall_timeout_s) as overall:
                    bodies = self._bodies = await read_bodies(warmup.probes)
                    verdict = await run_probes(client, self.url, warmup, plan, bodies, self._on_probe)
            except OSError as exc:  # a body_file that cannot be read: fail the attempt, say why
                self.last_problem = f"warm-up: cannot read probe body: {exc}"
                log.warning("upstream %d: %s", self.index, self.last_problem)
                return False
            finally:
                self._attempt_scope = None
        if attempt.cancel_called:
            return None
        if overall.cancelled_caught:
            self.last_problem = (
                f"warm-up: not passed within overall_timeout_s = {warmup.overall_timeout_s:g} ({plan!r})"
            )
        elif not verdict.passed:
            self.last_problem = f"warm-up: {verdict.reason}"
        if overall.cancelled_caught or not verdict.passed:
            log.warning("upstream %d: %s; next attempt in %gs", self.index, self.last_problem, warmup.retry_interval_s)
            return False
        return True

    async def _ramp(self) -> None:
        while self.lifecycle.state is State.RAMPING:
            now = trio.current_time()
            self.metrics.slow_start_factor.labels(self._label).set(self.limit_factor(now))
            with trio.move_on_at(min(self.lifecycle.ramp_ends_at(), now + RAMP_GAUGE_STEP_S)):
                await self._changed.wait()
            self.apply(self.lifecycle.tick(trio.current_time()))

    def _on_probe(self, result: ProbeResult) -> None:
        outcome = "ok" if result.ok else ("timeout" if result.detail == "timeout" else "error")
        self.metrics.warmup_probes.labels(self._label, outcome).inc()
        self.metrics.warmup_probe_duration_seconds.labels(self._label, str(result.shape)).observe(result.latency_s)
        if result.ok and self.on_sample is not None and result.shape < len(self._bodies):
            probe = self.policy.warmup.probes[result.shape]
            self.on_sample(probe.path, self._bodies[result.shape], result.latency_s * 1000.0)

    # --- acting on transitions --------------------------------------------------------

    def report_result(self, ok: bool, now: float | None = None) -> None:
        transitions = self.lifecycle.request_result(trio.current_time() if now is None else now, ok)
        if transitions:  # per request: a success changes no state, nothing to apply
            self.apply(transitions)

    def apply(self, transitions: Sequence[Transition]) -> None:
        changed = False
        for t in transitions:
            if t.after is t.before:
                continue
            changed = True
            self._record(t)
            if t.before is State.PROBING and self._attempt_scope is not None:
                self._attempt_scope.cancel()
        if changed:
            self._changed.set()
            self._changed = trio.Event()
            self._on_change()

    def _record(self, t: Transition) -> None:
        m, label = self.metrics, self._label
        log.info("upstream %d (%s): %s -> %s on %s", self.index, self.url, t.before.value, t.after.value, t.event.value)
        m.upstream_state.labels(label, t.before.value).set(0)
        m.upstream_state.labels(label, t.after.value).set(1)
        m.upstream_transitions.labels(label, t.after.value).inc()
        m.slow_start_factor.labels(label).set(self.limit_factor(t.at))
        if t.before in _LOSABLE and t.event in _LOSS_EVENTS:
            m.upstream_losses.labels(label, t.event.value).inc()
        if t.after is State.PROBING:
            self._probing_since = t.at
        elif t.after is State.RAMPING:
            self.last_warmup_s = t.at - self._probing_since
            m.warmup_duration_seconds.labels(label).set(self.last_warmup_s)
            self.last_problem = ""

    # --- introspection ------------------------------------------------------------------

    def limit_factor(self, now: float) -> float:
        """Slow-start multiplier of the admission limit: 1 warm, ramping in (0, 1], 0 not ready."""
        state = self.lifecycle.state
        if state is State.WARM:
            return 1.0
        if state is not State.RAMPING:
            return 0.0
        s = self.policy.slow_start
        return slow_start_factor(
            now - self.lifecycle.since,
            window_s=self.lifecycle.ramp_window_s,
            aggression=s.aggression,
            min_weight=s.min_weight,
        )

    def describe(self, now: float) -> str:
        state = self.lifecycle.state
        if state is State.PROBING and self._plan is not None:
            shapes = self._plan.statistics()
            done = sum(s.completed for s in shapes)
            return f"probing ({done}/{sum(self._plan.counts)} probes, {sum(s.met for s in shapes)}/{len(shapes)} shapes warm)"
        if state is State.RAMPING:
            return f"ramping (slow start {self.limit_factor(now):.2f}; {self.discovery.describe()})"
        if state in (State.COLD, State.UNHEALTHY) and self.last_problem:
            return f"{state.value} ({self.last_problem})"
        if state is State.WARM:
            return f"warm ({self.discovery.describe()})"
        return state.value

    def statistics(self, now: float) -> UpstreamWarmupStatistics:
        return UpstreamWarmupStatistics(
            index=self.index,
            url=self.url,
            lifecycle=self.lifecycle.statistics(),
            slow_start_factor=self.limit_factor(now),
            probes=self._plan.statistics() if self._plan else (),
            last_warmup_s=self.last_warmup_s,
            last_problem=self.last_problem,
            health=self.discovery.describe(),
        )


def _discovery_settings(policy: Policy) -> tuple:
    w = policy.warmup
    return w.health_path, tuple(w.health_candidates), w.health_check, w.grpc_health_service


def _discovery(policy: Policy) -> HealthDiscovery:
    w = policy.warmup
    if w.health_check == "grpc":  # nothing to discover: the check is named, /readyz says which
        return HealthDiscovery(f"grpc.health.v1 {w.grpc_health_service or '(server)'}", w.health_candidates)
    return HealthDiscovery(w.health_path, w.health_candidates)
