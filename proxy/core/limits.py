"""Concurrency limit algorithms: compute a number, never enforce it.

Theory of operation (after Netflix concurrency-limits `Limit.onSample` and Envoy
adaptive concurrency): a Limit is fed one sample per finished request,
`on_sample(now, rtt_ms, inflight, dropped)`, and answers the new limit; the
admission controller enforces it. Each change records its reason
(`last_reason`), which the runtime counts.

- `FixedLimit`: always `initial_limit`.
- `GradientLimit` (Gradient2 style): a short decayed mean of recent latency is
  compared with a reference, either `target_latency_ms` or the long-term decayed
  mean x `tolerance` (the long mean is pulled down when it runs > 2x the short
  one, so it recovers after an overload episode, as in Gradient2).
      gradient  = clamp(reference / short, 0.5, 1.0)
      estimate  = limit * gradient + allowance,  allowance = max(1, ratio * limit)
      limit     = limit * (1 - smoothing) + estimate * smoothing, within [min, max]
  With latency on target the allowance grows the limit; latency above it pulls
  the limit down by at most half per sample. A dropped request (upstream
  overload, timeout) multiplies the limit by `backoff_ratio`. While less than
  half the limit is in use the limit is not raised (an idle upstream proves
  nothing about a bigger batch).

- `EngineQueueLimit` (`kind = "engine_queue"`): follows the engine's own queue,
  read from its gauges (vLLM `num_requests_waiting` / `num_requests_running`,
  Triton `nv_inference_pending_request_count`) through `on_engine(running,
  waiting, inflight, now)`. Order only matters for what waits in rampmeter;
  what waits inside the engine is served first come, first served. So the
  limit follows the engine: what it runs, plus what the server's front end
  holds of ours (HTTP, tokenizing, answers being written: outside its gauges),
  plus `engine_target_waiting` requests kept waiting inside it (the next to
  take a free sequence, where one held in the sidecar would first cross the
  front end). Each reading moves it by half the target less what stands in the
  engine's queue, the same gain up and down (so that queue averages the
  target, not more), and a reading of
  another client's load never cuts it below what the sidecar has in flight
  (see `EngineQueue`). Every other queued request is ordered by rampmeter.
- The gradient limit takes the same reading as a ceiling (`on_engine`): it
  never climbs above what the engine runs without queueing (issue 12: the
  shipped llm-chat policy's gradient limit climbed to 21-36 over vLLM's 8
  sequences, so 12-20 requests waited inside vLLM where no order applies).

Units: whatever the controller counts (requests or tokens); the limit is a float
internally and `int()` for enforcement, at least 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from proxy.policy.admission import Limits


class Limit(Protocol):
    value: int
    last_reason: str

    def on_sample(self, now: float, rtt_ms: float, inflight: float, dropped: bool) -> int: ...

    def on_engine(self, running: float | None, waiting: float, inflight: int, now: float) -> int: ...

    def statistics(self) -> dict[str, Any]: ...


WAITING_ALPHA = 0.3  # decay of the engine's waiting count over readings (shown in statistics)

# How many requests the engine_queue limit keeps waiting inside the engine by default
# (`[limits] engine_target_waiting`): the next ones to take a free sequence at once, where one held in
# the sidecar first crosses the server's front end (vLLM's CPU build: 100s of ms on a busy machine).
# A toy of 8 sequences behind a front end of 0.1-0.6 s (tests/core/test_engine_follow.py) ran 7.2-7.5
# of the 8 while the sidecar queued with 1 kept waiting, 7.3-7.9 with 2, 7.5-8.0 with 3 (at 0.9-1.1x
# its capacity); every one beyond the first adds a request served first come, first served.
TARGET_WAITING = 2.0
# Each reading moves the limit by this share of (target - standing), up and down alike. The same gain both
# ways is what makes the engine's queue average the target: realcal4 grew by the whole shortfall and cut
# half the excess, so the limit settled where E[shortfall] = E[excess] / 2, above the target (the timed toy
# of tests/core/test_engine_follow.py: 2.5-2.7 waiting at a target of 2 with a front end of 0.15-0.6 s;
# CI once 3.46 over 4 sequences). Half, not all: one reading catches the front end at a random moment,
# and what the sidecar admits after a reading shows in the engine's gauges only after the front end's
# transit, up to a reading later (with the whole gap a reading, that delay makes the limit ring).
GAIN = 0.5
PEAK_DECAY = 0.999  # the most the engine was seen running fades by this per reading (~700 to halve)


class EngineQueue:
    """The limit that follows the engine: what it runs (and its front end holds) plus a target waiting.

    Theory of operation. At a reading the sidecar has `inflight` requests upstream; the engine
    reports `running` and `waiting` (Triton: pending only; running is then inflight less waiting).
    While the engine's load is ours (it holds no more than we have in flight), our requests that do
    not wait inside it are running or in the server's front end (HTTP, tokenizing, answers being
    written), and the limit that leaves `target` waiting inside it is

        follow = inflight - standing + target

    where `standing` is what waits beyond the sequences that are idle at that moment (a request that
    arrived between two engine steps waits a moment below capacity: no queue). While the sidecar
    uses its whole limit, inflight is the limit, so each reading moves it by `GAIN x (target -
    standing)`: up when the engine's queue runs short (the engine needs the next request ready when
    a sequence ends), down when more than the target waits, by the same share both ways so that the
    engine's queue averages the target. Below its limit the sidecar proves nothing about more room
    (app-limited), so the limit only comes down then, towards what it has in flight.
    Everything beyond the limit waits in rampmeter, where it is ordered (SJF, classes, aging).

    Load that is not ours (issue 12: the direct runs of bench/real_servers filled vLLM beside the
    sidecar and cut its limit to the batch before every run through it): when the engine holds
    more than the sidecar has in flight, some of its queue is another client's, and a reading never
    lowers the limit below what the sidecar has in flight; holding nothing, a reading changes
    nothing (what waits there is none of ours).
    """

    __slots__ = ("limit", "peak_running", "reason", "target", "waiting_mean")

    def __init__(self, initial: float, target: float = TARGET_WAITING) -> None:
        self.limit = float(initial)
        self.target = float(target)
        self.waiting_mean = 0.0
        self.peak_running = 0.0
        self.reason = "initial"

    def reading(self, running: float | None, waiting: float, inflight: int, lo: int, hi: int) -> float:
        self.waiting_mean += WAITING_ALPHA * (waiting - self.waiting_mean)
        runs = running if running is not None else max(0.0, inflight - waiting)  # Triton: pending only
        self.peak_running = max(runs, self.peak_running * PEAK_DECAY)
        if inflight <= 0:
            self.reason = "engine_not_ours"  # another client's load, or none: nothing to follow
            return self.limit
        standing = max(0.0, waiting - max(0.0, self.peak_running - runs))
        # Using its whole limit, the sidecar has the limit in flight, its fraction below int() included
        # (int(limit) there instead would cut the fraction off at every reading: a bias down), or more
        # while a cut drains.
        full = inflight >= int(self.limit)
        follow = (max(float(inflight), self.limit) if full else float(inflight)) + self.target - standing
        if standing > self.target:
            if runs + waiting > inflight + 0.5:  # the engine holds others' requests: ours are not all queued
                follow = float(inflight)
            if follow < self.limit:
                self.limit, self.reason = max(float(lo), self.limit + GAIN * (follow - self.limit)), "engine_queue"
        elif standing < self.target and full and follow > self.limit and self.limit < hi:
            # The engine's queue is short of the target: what the sidecar holds back would be its next request.
            self.limit, self.reason = min(float(hi), self.limit + GAIN * (follow - self.limit)), "engine_idle"
        return self.limit


class FixedLimit:
    __slots__ = ("last_reason", "value")

    def __init__(self, limit: int) -> None:
        self.value = max(1, int(limit))
        self.last_reason = "initial"

    def on_sample(self, now: float, rtt_ms: float, inflight: float, dropped: bool) -> int:
        return self.value

    def on_engine(self, running: float | None, waiting: float, inflight: int, now: float) -> int:
        return self.value  # the SRE's number: the engine's gauges are shown, not followed

    def statistics(self) -> dict[str, Any]:
        return {"kind": "fixed", "limit": self.value, "last_reason": self.last_reason}

    def __repr__(self) -> str:
        return f"<FixedLimit {self.value}>"


class GradientLimit:
    __slots__ = (
        "_allowance",
        "_backoff",
        "_ceiling",
        "_engine_target",
        "_limit",
        "_long_a",
        "_max",
        "_min",
        "_short_a",
        "_smoothing",
        "_target",
        "_tolerance",
        "changed_at",
        "last_reason",
        "long_ms",
        "samples",
        "short_ms",
        "value",
    )

    def __init__(
        self,
        initial: int,
        min_limit: int,
        max_limit: int,
        *,
        target_latency_ms: float = 0.0,
        tolerance: float = 1.5,
        smoothing: float = 0.2,
        queue_allowance_ratio: float = 0.1,
        backoff_ratio: float = 0.9,
        short_window_samples: int = 10,
        long_window_samples: int = 600,
        engine_target_waiting: float = TARGET_WAITING,
    ) -> None:
        self._min, self._max = min_limit, max_limit
        self._engine_target = engine_target_waiting
        self._limit = float(min(max(initial, min_limit), max_limit))
        self.value = int(self._limit)
        self.last_reason = "initial"
        self._target = target_latency_ms
        self._tolerance = tolerance
        self._smoothing = smoothing
        self._allowance = queue_allowance_ratio
        self._backoff = backoff_ratio
        self._short_a = 2.0 / (short_window_samples + 1)
        self._long_a = 2.0 / (long_window_samples + 1)
        self.short_ms: float | None = None
        self.long_ms: float | None = None
        self.changed_at: float | None = None
        self.samples = 0
        self._ceiling: EngineQueue | None = None  # from the engine's gauges, once there are any

    def on_engine(self, running: float | None, waiting: float, inflight: int, now: float) -> int:
        """The engine's queue caps the gradient: never above what it runs without queueing."""
        if self._ceiling is None:
            self._ceiling = EngineQueue(max(self._limit, self._min), self._engine_target)
        self._ceiling.reading(running, waiting, inflight, self._min, self._max)
        return self._set(self._limit, "engine_queue", now)

    def on_sample(self, now: float, rtt_ms: float, inflight: float, dropped: bool) -> int:
        self.samples += 1
        if dropped:
            return self._set(self._limit * self._backoff, "drop", now)
        short = self.short_ms = (
            rtt_ms if self.short_ms is None else self.short_ms + self._short_a * (rtt_ms - self.short_ms)
        )
        long = self.long_ms = rtt_ms if self.long_ms is None else self.long_ms + self._long_a * (rtt_ms - self.long_ms)
        if short > 0 and long / short > 2.0:
            self.long_ms = long = long * 0.95
        reference = self._target if self._target > 0 else long * self._tolerance
        gradient = 1.0 if short <= 0 else max(0.5, min(1.0, reference / short))
        if gradient >= 1.0 and inflight < self._limit / 2:
            return self.value  # app-limited: no evidence for a bigger limit
        estimate = self._limit * gradient + max(1.0, self._allowance * self._limit)
        new = self._limit * (1.0 - self._smoothing) + estimate * self._smoothing
        return self._set(new, "latency" if gradient < 1.0 else "probe", now)

    def _set(self, new: float, reason: str, now: float) -> int:
        top = self._max if self._ceiling is None else max(self._min, min(self._max, self._ceiling.limit))
        bounded = min(max(new, self._min), top)
        if bounded != new:
            reason = "min_limit" if new < self._min else ("max_limit" if top == self._max else "engine_queue")
        self._limit = bounded
        value = max(1, int(bounded))
        if value != self.value:
            self.value, self.last_reason, self.changed_at = value, reason, now
        return self.value

    def statistics(self) -> dict[str, Any]:
        return {
            "kind": "gradient",
            "limit": self.value,
            "estimate": self._limit,
            "last_reason": self.last_reason,
            "short_ms": self.short_ms,
            "long_ms": self.long_ms,
            "samples": self.samples,
            "engine_ceiling": None if self._ceiling is None else self._ceiling.limit,
        }

    def __repr__(self) -> str:
        return f"<GradientLimit {self.value} [{self._min}..{self._max}] last={self.last_reason} short={self.short_ms} long={self.long_ms}>"


class EngineQueueLimit:
    """`kind = "engine_queue"`: the limit the engine's own queue allows (see the module doc)."""

    __slots__ = ("_backoff", "_max", "_min", "_queue", "changed_at", "last_reason", "readings", "value")

    def __init__(
        self,
        initial: int,
        min_limit: int,
        max_limit: int,
        *,
        backoff_ratio: float = 0.9,
        target_waiting: float = TARGET_WAITING,
    ) -> None:
        self._min, self._max, self._backoff = min_limit, max_limit, backoff_ratio
        self._queue = EngineQueue(min(max(initial, min_limit), max_limit), target_waiting)
        self.value = int(self._queue.limit)
        self.last_reason = "initial"
        self.changed_at: float | None = None
        self.readings = 0

    def on_engine(self, running: float | None, waiting: float, inflight: int, now: float) -> int:
        self.readings += 1
        self._queue.reading(running, waiting, inflight, self._min, self._max)
        return self._set(self._queue.limit, self._queue.reason, now)

    def on_sample(self, now: float, rtt_ms: float, inflight: float, dropped: bool) -> int:
        if dropped:  # the upstream said it is overloaded (503/429, timeout)
            self._queue.limit = max(float(self._min), self._queue.limit * self._backoff)
            return self._set(self._queue.limit, "drop", now)
        return self.value

    def _set(self, limit: float, reason: str, now: float) -> int:
        value = max(1, int(limit))
        if value != self.value:
            self.value, self.last_reason, self.changed_at = value, reason, now
        return self.value

    def statistics(self) -> dict[str, Any]:
        return {
            "kind": "engine_queue",
            "limit": self.value,
            "estimate": self._queue.limit,
            "last_reason": self.last_reason,
            "engine_waiting_mean": self._queue.waiting_mean,
            "engine_peak_running": self._queue.peak_running,
            "engine_target_waiting": self._queue.target,
            "readings": self.readings,
        }

    def __repr__(self) -> str:
        return f"<EngineQueueLimit {self.value} [{self._min}..{self._max}] last={self.last_reason}>"


def make_limit(policy: Limits) -> FixedLimit | GradientLimit | EngineQueueLimit:
    """Build the Limit a `[limits]` section describes."""
    if policy.kind == "fixed":
        return FixedLimit(policy.initial_limit)
    if policy.kind == "engine_queue":
        return EngineQueueLimit(
            policy.initial_limit,
            policy.min_limit,
            policy.max_limit,
            backoff_ratio=policy.backoff_ratio,
            target_waiting=policy.engine_target_waiting,
        )
    return GradientLimit(
        policy.initial_limit,
        policy.min_limit,
        policy.max_limit,
        target_latency_ms=policy.target_latency_ms,
        tolerance=policy.tolerance,
        smoothing=policy.smoothing,
        queue_allowance_ratio=policy.queue_allowance_ratio,
        backoff_ratio=policy.backoff_ratio,
        short_window_samples=policy.short_window_samples,
        long_window_samples=policy.long_window_samples,
        engine_target_waiting=policy.engine_target_waiting,
    )
