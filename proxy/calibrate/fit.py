"""What calibration concludes from its measurements: service-time priors, the knee, cancel habit, budgets.

Theory of operation: every function here is pure arithmetic over figures the
driver (`measure.py`) collected, so each rule is tested with numbers by hand.

- `fit_service(points)`: least squares of ms = base + b * prompt + c * output
  over one route's shapes (their median latencies, measured one at a time),
  with every coefficient kept >= 0 (a negative slope is noise or HTTP overhead
  leaking in: the issue saw -0.1 ms per prompt token on vLLM): a coefficient
  that comes out negative is fixed at 0 and the rest refitted.
- `knee(steps)`: the smallest concurrency whose throughput is within
  KNEE_WITHIN (5 %) of the best step's: past it, more requests in flight only queue
  inside the engine (out of the sidecar's order) for no more throughput.
  `limit_for(steps)` caps it at the engine's own batch where its gauges show
  one (running at most N while others waited inside it).
  `sweep_done(steps)`: the sweep stops once FLAT_STEPS steps in a row gained
  less than GAIN over the one before, or a step failed too many requests.
- `cancel_verdict(trials)`: does the server stop working on a request whose
  client went away? From trials that each filled the engine with long
  requests, dropped their connections, and then either timed a short request
  (its extra delay against its own time alone, compared with the work the
  dropped requests had left) or watched the engine's running gauge drain.
  True / False when the trials agree clearly, None ("auto") otherwise.
- `turn(knee, alone, loaded)`: one "turn", the time the slowest request
  calibration measured takes where the sidecar will keep the server: the
  longest of the short shape's p99 at the knee, each shape's median alone, and
  each shape's p99 in a mixed closed loop with the limit's worth in flight
  (`Loaded`). A budget from the shapes alone was too tight for a long answer
  under load: vLLM's CPU build served 256 tokens in 0.85 s alone but 1.7-2.6 s
  with 8 in flight, so a 1.7-2.2 s budget turned a closed loop the server
  serves into 31-39 `deadline_unmeetable` rejections (and the same requests
  sent direct ran out at that budget too).
- `budgets(turn_ms)`: class deadline budgets in turns (CLASS_TURNS): the
  default class has 4, so a request may wait up to three turns for a slot.
  With `default_ms` (`--budget-ms`) the default class's budget is fixed by
  hand and the turn is a quarter of it: a budget measured at a quiet moment
  meets the load of another (round 1 on vLLM: 4 s budgets, 2-6 s answers).
- `engine_queue_ceiling(steps)`: the `max_limit` for `kind = "engine_queue"`:
  the first sweep step at which requests stood in the engine's own queue (the
  knee, if later). Between the engine's batch and there, the limit finds by
  itself how many the server holds in flight outside its batch (HTTP front
  end, tokenizing, writing the answer): with the cap at the batch (8 on vLLM's
  CPU build) the engine ran 3.5-5 sequences on average while requests queued
  in the sidecar.
- `metrics_interval_s(step)`: how often the sidecar reads the engine's gauges:
  two short requests' time at the limit (`at_limit`), within METRICS_INTERVAL_S; the
  engine_queue limit moved one request per reading (before branch realcal4), so the default 2 s let it
  move 5 in a 10 s run (a read costs the server's front end CPU: not below 1 s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Knee: throughput within 5 % of the best. 10 % picked 16 on PyTriton (67.6/s against 75), where
# through the sidecar 16 in flight gave 38/s: it forwards a batch's requests one after another,
# past Triton's 20 ms batching window, so two half batches ran; 32 keeps the next batch queued.
KNEE_WITHIN = 0.95
GAIN = 1.15  # a step that adds less than 15 % throughput is flat
FLAT_STEPS = 2
MAX_FAILED = 0.1  # a sweep step failing more than this ends the sweep
KEEPS_COMPUTING_DELAY = 0.5  # extra delay >= this share of the dropped work left: it kept computing
STOPS_DELAY = 0.2  # extra delay <= this share: it stopped
GAUGE_STOPS = 0.3  # running gauge empty within this share of the work left: it stopped
GAUGE_KEEPS = 0.6  # still running after this share: it kept computing


@dataclass(frozen=True)
class Point:
    prompt_tokens: float
    output_tokens: float
    ms: float


@dataclass(frozen=True)
class Coefficients:
    base_ms: float
    ms_per_prompt_token: float
    ms_per_output_token: float

    def predict_ms(self, prompt_tokens: float, output_tokens: float) -> float:
        return self.base_ms + self.ms_per_prompt_token * prompt_tokens + self.ms_per_output_token * output_tokens


def fit_service(points: Sequence[Point]) -> Coefficients:
    """Non-negative least squares of ms ~ base + b*prompt + c*output (see the module doc)."""
    if not points:
        raise ValueError("no points to fit")
    free = [0, 1, 2]
    # A feature that never varies cannot be told from the base: leave it at 0.
    for j, attr in ((1, "prompt_tokens"), (2, "output_tokens")):
        if len({getattr(p, attr) for p in points}) < 2:
            free.remove(j)
    while True:
        theta = _least_squares(points, free)
        negative = [j for j in free if theta[j] < 0]
        if not negative:
            return Coefficients(*theta)
        free.remove(min(negative, key=lambda j: theta[j]))


def _least_squares(points: Sequence[Point], free: list[int]) -> list[float]:
    rows = [(1.0, p.prompt_tokens, p.output_tokens) for p in points]
    theta = [0.0, 0.0, 0.0]
    if not free:
        return theta
    n = len(free)
    a = [[sum(r[i] * r[j] for r in rows) for j in free] for i in free]
    y = [sum(r[i] * p.ms for r, p in zip(rows, points, strict=True)) for i in free]
    solution = _solve(a, y) if n else []
    for k, j in enumerate(free):
        theta[j] = solution[k]
    return theta


def _solve(a: list[list[float]], y: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting; a singular system answers its least-norm-ish guess (0s)."""
    n = len(y)
    m = [row[:] + [y[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            continue
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * yv for x, yv in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] if abs(m[i][i]) >= 1e-12 else 0.0 for i in range(n)]


@dataclass(frozen=True)
class SweepStep:
    concurrency: int
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    failed: int
    engine_running_max: float | None = None  # the engine's running gauge, highest read during the step
    engine_waiting_max: float | None = None  # its waiting gauge: > 0 means requests queued inside the engine

    @property
    def failed_fraction(self) -> float:
        return self.failed / self.requests if self.requests else 1.0


def sweep_done(steps: Sequence[SweepStep]) -> bool:
    """Stop the concurrency sweep: throughput flat for FLAT_STEPS steps, or the last step failing."""
    if steps and steps[-1].failed_fraction > MAX_FAILED:
        return True
    if len(steps) <= FLAT_STEPS:
        return False
    tail = steps[-(FLAT_STEPS + 1) :]
    return all(b.throughput_rps < GAIN * a.throughput_rps for a, b in zip(tail, tail[1:], strict=False))


def knee(steps: Sequence[SweepStep]) -> SweepStep:
    """The smallest concurrency within KNEE_WITHIN of the best throughput (steps that mostly failed do not count)."""
    usable = [s for s in steps if s.failed_fraction <= MAX_FAILED] or list(steps)
    if not usable:
        raise ValueError("no sweep steps")
    best = max(s.throughput_rps for s in usable)
    return min((s for s in usable if s.throughput_rps >= KNEE_WITHIN * best), key=lambda s: s.concurrency)


def _engine_queued(s: SweepStep) -> bool:
    """Requests waited inside the engine while it ran fewer than the users sent: its batch was full.
    (A request that arrives between two engine steps waits a moment while every user runs: no queue.)"""
    return bool(s.engine_waiting_max and s.engine_running_max and s.engine_running_max < s.concurrency)


def engine_batch(steps: Sequence[SweepStep]) -> int | None:
    """The engine's own batch size, where its gauges show it: the most requests it ran at once in a
    step where others waited inside it (vLLM --max-num-seqs). None without such a step."""
    full = [s.engine_running_max for s in steps if _engine_queued(s) and s.engine_running_max]
    return int(max(full)) if full else None


def limit_for(steps: Sequence[SweepStep]) -> int:
    """The concurrency limit: the knee, but never above the engine's own batch (more only waits inside it).

    Throughput seen by a client can keep growing past the engine's batch while the
    server's HTTP front end overlaps its per-request overhead with the engine's queue;
    that queue is FCFS, out of the sidecar's order."""
    k = knee(steps).concurrency
    batch = engine_batch(steps)
    return k if batch is None else max(1, min(k, batch))


@dataclass(frozen=True)
class CancelTrial:
    """One cancel trial. method "latency": a short request's extra delay after the drop; "gauge": time for the
    engine's running gauge to read 0 (None: it never did while watched)."""

    method: str
    work_left_ms: float  # what the dropped requests had left to compute, at least
    delay_ms: float | None = None  # latency: short request's latency minus its latency alone
    drained_ms: float | None = None  # gauge: drop to running == 0
    watched_ms: float = 0.0  # gauge: how long it was watched

    def verdict(self) -> bool | None:
        left = max(self.work_left_ms, 1e-9)
        if self.method == "gauge":
            if self.drained_ms is not None and self.drained_ms <= GAUGE_STOPS * left:
                return True
            if (self.drained_ms is None and self.watched_ms >= GAUGE_KEEPS * left) or (
                self.drained_ms is not None and self.drained_ms >= GAUGE_KEEPS * left
            ):
                return False
            return None
        assert self.delay_ms is not None
        if self.delay_ms >= KEEPS_COMPUTING_DELAY * left:
            return False
        if self.delay_ms <= STOPS_DELAY * left:
            return True
        return None

    def describe(self) -> str:
        if self.method == "gauge":
            drained = "never" if self.drained_ms is None else f"after {self.drained_ms:.0f} ms"
            return f"engine running gauge empty {drained} (work left >= {self.work_left_ms:.0f} ms)"
        return f"next short request +{self.delay_ms:.0f} ms (work left >= {self.work_left_ms:.0f} ms)"


def cancel_verdict(trials: Sequence[CancelTrial]) -> bool | None:
    """True: stops on cancel; False: keeps computing; None: undecided ("auto"). Gauge trials outrank latency ones."""
    for method in ("gauge", "latency"):
        votes = [t.verdict() for t in trials if t.method == method]
        decided = [v for v in votes if v is not None]
        if decided and len(set(decided)) == 1 and len(decided) * 2 > len(votes):
            return decided[0]
    return None


@dataclass(frozen=True)
class Loaded:
    """One shape's latency in a mixed closed loop with `concurrency` users (the server as the sidecar keeps it)."""

    label: str
    concurrency: int
    p50_ms: float
    p99_ms: float
    samples: int  # answers that came back 2xx
    output_tokens: float = 0.0  # as asked (the longest answer calibration measured, for the comment)


def turn(knee: SweepStep, sweep_label: str, alone: Sequence[tuple[str, float]], loaded: Sequence[Loaded]):
    """(ms, what it is) of one turn: the longest of the figures in the module doc. A loaded shape
    with no 2xx answer is left out (its alone figure still counts)."""
    candidates = [(knee.p99_ms, f"p99 of {sweep_label} at the knee ({knee.concurrency} in flight)")]
    candidates += [(ms, f"{label} alone") for label, ms in alone]
    candidates += [(s.p99_ms, f"p99 of {s.label} with {s.concurrency} in flight") for s in loaded if s.samples]
    finite = [c for c in candidates if math.isfinite(c[0])] or [(float(MIN_BUDGET_MS), "no figure")]
    return max(finite, key=lambda c: c[0])


def engine_queue_ceiling(steps: Sequence[SweepStep]) -> int:
    """`max_limit` for the engine_queue limit (see the module doc): the first step with a standing engine queue."""
    k = knee(steps).concurrency
    queued = [s.concurrency for s in steps if _engine_queued(s) and s.failed_fraction <= MAX_FAILED]
    return max(k, min(queued)) if queued else k


# vLLM renders /metrics in Python in its HTTP front end, on the CPU build the same CPU as the engine's:
# not more than once a second (with the sidecar reading every 0.5 s and the benchmark's sampler too,
# vLLM's CPU build ran 4.5-5.2 of its 8 sequences on average, against 5.6-6.7 at 1.15 s).
METRICS_INTERVAL_S = (1.0, 2.0)


def at_limit(steps: Sequence[SweepStep], limit: int) -> SweepStep:
    """The sweep step with the most users not above `limit` (the first step if every one is)."""
    below = [s for s in steps if s.concurrency <= limit]
    return max(below, key=lambda s: s.concurrency) if below else steps[0]


def metrics_interval_s(step: SweepStep) -> float:
    """Seconds between reads of the engine's gauges (see the module doc), to 0.05 s; `step` is the
    sweep's step at the limit (`at_limit`): a p50 at the knee past the engine's batch counts its queue."""
    lo, hi = METRICS_INTERVAL_S
    want = 2.0 * step.p50_ms / 1000.0 if math.isfinite(step.p50_ms) else hi
    return round(min(hi, max(lo, want)) * 20) / 20


CLASS_TURNS = {"realtime": 2.0, "interactive": 4.0, "batch": 30.0}  # default budget, in turns
DEFAULT_CLASS = "interactive"  # the class the written policy makes the default
MIN_BUDGET_MS = 100


def budgets(turn_ms: float, default_ms: int | None = None) -> dict[str, int]:
    """Default deadline budget per class: CLASS_TURNS turns, two significant digits, at least MIN_BUDGET_MS.
    `default_ms`: the default class's budget fixed by hand (`--budget-ms`), exactly; the other classes
    keep their turns of the turn it makes (a quarter of it)."""
    if default_ms is not None:
        turn_ms = default_ms / CLASS_TURNS[DEFAULT_CLASS]
    out = {name: max(MIN_BUDGET_MS, round_up(turns * turn_ms)) for name, turns in CLASS_TURNS.items()}
    if default_ms is not None:
        out[DEFAULT_CLASS] = default_ms
    return out


def round_up(ms: float, digits: int = 2) -> int:
    """Up to `digits` significant digits: 1234 -> 1300, 87.1 -> 88."""
    if ms <= 0:
        return 0
    scale = 10 ** max(0, math.floor(math.log10(ms)) + 1 - digits)
    return int(math.ceil(ms / scale - 1e-9) * scale)
