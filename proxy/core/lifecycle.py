"""Upstream lifecycle: is this model server cold, warming, ramping, warm or failing?

Theory of operation: each upstream moves through

    cold --health ok--> probing --probes passed--> ramping --window over--> warm
      ^                    |                          |                      |
      +--- probes failed --+     health lost / failure streak -> unhealthy --+
      +--------------- restarted (from anywhere) / unhealthy + health ok ----+

`TRANSITIONS` is the whole machine as a `(state, event) -> state` table;
`next_state` raises `UnknownTransition` for any pair not in it, so a driver bug
(say, "probes passed" while warm) is loud instead of silently making a cold model
look warm. Invariants the table encodes (and tests/core/test_lifecycle.py checks
with Hypothesis over event orders):
- WARM and RAMPING are only reachable through PROBES_PASSED from PROBING;
- RESTARTED always lands in COLD, whatever the state;
- UNHEALTHY is left only for COLD, so a recovered upstream is warmed again.

`UpstreamLifecycle` is the bookkeeping around the table for one upstream, pure:
it turns raw observations (one health check, one request outcome, the clock)
into table events. It counts consecutive active-check failures
(`unhealthy_after`) and consecutive request failures reported by the request
path (`failure_streak`), and notices a restart when the upstream's identity
(instance id / start time from its health answer) changes. Every method takes
`now` and returns the transitions it made, as values, for the runtime to act on
(cancel probes, wake waiters, log, count).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass


class State(enum.StrEnum):
    COLD = "cold"
    PROBING = "probing"
    RAMPING = "ramping"
    WARM = "warm"
    UNHEALTHY = "unhealthy"


class Event(enum.StrEnum):
    HEALTH_OK = "health_ok"  # an active health check passed
    HEALTH_LOST = "health_lost"  # `unhealthy_after` active checks failed in a row
    PROBES_PASSED = "probes_passed"
    PROBES_FAILED = "probes_failed"
    RAMP_DONE = "ramp_done"  # the slow-start window has elapsed
    RESTARTED = "restarted"  # the upstream's identity changed: it is a new, cold process
    FAILURE_STREAK = "failure_streak"  # the request path saw `failure_streak` failures in a row


S, E = State, Event
TRANSITIONS: dict[tuple[State, Event], State] = {
    (S.COLD, E.HEALTH_OK): S.PROBING,
    (S.COLD, E.HEALTH_LOST): S.COLD,
    (S.COLD, E.FAILURE_STREAK): S.COLD,
    (S.COLD, E.RESTARTED): S.COLD,
    (S.PROBING, E.HEALTH_OK): S.PROBING,
    (S.PROBING, E.PROBES_PASSED): S.RAMPING,
    (S.PROBING, E.PROBES_FAILED): S.COLD,
    (S.PROBING, E.HEALTH_LOST): S.UNHEALTHY,
    (S.PROBING, E.FAILURE_STREAK): S.UNHEALTHY,
    (S.PROBING, E.RESTARTED): S.COLD,
    (S.RAMPING, E.HEALTH_OK): S.RAMPING,
    (S.RAMPING, E.RAMP_DONE): S.WARM,
    (S.RAMPING, E.HEALTH_LOST): S.UNHEALTHY,
    (S.RAMPING, E.FAILURE_STREAK): S.UNHEALTHY,
    (S.RAMPING, E.RESTARTED): S.COLD,
    (S.WARM, E.HEALTH_OK): S.WARM,
    (S.WARM, E.HEALTH_LOST): S.UNHEALTHY,
    (S.WARM, E.FAILURE_STREAK): S.UNHEALTHY,
    (S.WARM, E.RESTARTED): S.COLD,
    (S.UNHEALTHY, E.HEALTH_OK): S.COLD,
    (S.UNHEALTHY, E.HEALTH_LOST): S.UNHEALTHY,
    (S.UNHEALTHY, E.FAILURE_STREAK): S.UNHEALTHY,
    (S.UNHEALTHY, E.RESTARTED): S.COLD,
}
del S, E

# Traffic may flow in these states (ramping: under the slow-start factor).
READY_STATES = frozenset({State.RAMPING, State.WARM})
_LOSABLE = frozenset({State.PROBING, State.RAMPING, State.WARM})
_LOSS_EVENTS = frozenset({Event.RESTARTED, Event.HEALTH_LOST, Event.FAILURE_STREAK})


_NOTHING: tuple[()] = ()


class UnknownTransition(RuntimeError):
    """A (state, event) pair the table does not define: a bug in the caller."""


def next_state(state: State, event: Event) -> State:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise UnknownTransition(f"no transition from {state.value} on {event.value}") from None


@dataclass(frozen=True)
class Transition:
    before: State
    event: Event
    after: State
    at: float


@dataclass(frozen=True)
class LifecycleStatistics:
    state: State
    since: float
    ready: bool
    health_failures: int  # consecutive failed active checks
    request_failures: int  # consecutive failed requests reported by the request path
    identity: tuple[str, ...] | None
    losses: int  # times a probing/ready upstream was lost (restart, health lost, failure streak)
    warmups: int  # times PROBES_PASSED was reached


class UpstreamLifecycle:
    """The lifecycle of one upstream; pure, driven by `now` and observations."""

    def __init__(self, *, now: float, unhealthy_after: int, failure_streak: int, ramp_window_s: float) -> None:
        if unhealthy_after < 1 or failure_streak < 1 or ramp_window_s < 0:
            raise ValueError("unhealthy_after and failure_streak must be >= 1, ramp_window_s >= 0")
        self.state = State.COLD
        self.since = now
        self.unhealthy_after = unhealthy_after
        self.failure_streak = failure_streak
        self.ramp_window_s = ramp_window_s
        self.ready = False
        self._health_failures = 0
        self.request_failures = 0  # the failure streak so far (public: readiness reads it per request)
        self._identity: tuple[str, ...] | None = None
        self._losses = 0
        self._warmups = 0

    def __repr__(self) -> str:
        return (
            f"<UpstreamLifecycle {self.state.value} since={self.since:.3f} "
            f"health_failures={self._health_failures} request_failures={self.request_failures}>"
        )

    # --- observations -------------------------------------------------------

    def health(self, now: float, ok: bool, identity: tuple[str, ...] | None = None) -> Sequence[Transition]:
        """One active health check. `identity` is what the upstream says it is, if it says."""
        out: list[Transition] = []
        # A new identity is a restart even in a failing answer (a restarted vLLM says
        # 503 while it loads): traffic must stop going to it at once, not after
        # `unhealthy_after` failed checks.
        if identity is not None:
            if self._identity is not None and identity != self._identity:
                out.append(self._fire(now, Event.RESTARTED))
            self._identity = identity
        if ok:
            self._health_failures = 0
            out.append(self._fire(now, Event.HEALTH_OK))
            if out[-1].after is State.COLD:  # unhealthy -> cold: this same check starts the warm-up
                out.append(self._fire(now, Event.HEALTH_OK))
            return out
        self._health_failures += 1
        if self._health_failures >= self.unhealthy_after and self.state not in (State.COLD, State.UNHEALTHY):
            out.append(self._fire(now, Event.HEALTH_LOST))
        return out

    def request_result(self, now: float, ok: bool) -> Sequence[Transition]:
        """A request outcome from the request path (connect failure or 5xx = not ok). A success with
        `request_failures` at 0 changes nothing, and readiness does not report it (the per-request
        shortcut in proxy/runtime/readiness.py relies on this: keep it true or drop the shortcut)."""
        # Hot path (called per request): no allocation unless something happens.
        if ok:
            self.request_failures = 0
            return _NOTHING
        self.request_failures += 1
        if self.request_failures >= self.failure_streak and self.state not in (State.COLD, State.UNHEALTHY):
            return (self._fire(now, Event.FAILURE_STREAK),)
        return _NOTHING

    def probes_finished(self, now: float, passed: bool) -> Sequence[Transition]:
        return (self._fire(now, Event.PROBES_PASSED if passed else Event.PROBES_FAILED),)

    def tick(self, now: float) -> Sequence[Transition]:
        """Ends the slow-start ramp once its window has elapsed."""
        if self.state is State.RAMPING and now >= self.ramp_ends_at():
            return (self._fire(now, Event.RAMP_DONE),)
        return _NOTHING

    def ramp_ends_at(self) -> float:
        """When RAMPING ends (meaningful only while ramping)."""
        return self.since + self.ramp_window_s

    # --- the table ----------------------------------------------------------

    def _fire(self, now: float, event: Event) -> Transition:
        before = self.state
        after = next_state(before, event)
        if after is not before:
            self.state, self.since = after, now
            self.ready = after in READY_STATES
            # A streak belongs to the state it was seen in; a fresh state starts clean.
            self._health_failures = self.request_failures = 0
            if after is State.RAMPING:
                self._warmups += 1
            if event in _LOSS_EVENTS and before in _LOSABLE:
                self._losses += 1
        return Transition(before, event, after, now)

    def statistics(self) -> LifecycleStatistics:
        return LifecycleStatistics(
            state=self.state,
            since=self.since,
            ready=self.ready,
            health_failures=self._health_failures,
            request_failures=self.request_failures,
            identity=self._identity,
            losses=self._losses,
            warmups=self._warmups,
        )
