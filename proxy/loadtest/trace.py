"""The load plan and its seeded trace: a value that several targets can replay alike.

Theory of operation: a `Plan` is the sweep (open loop: a rate per step; closed
loop: a number of users per step), each step held `duration_s` of which the
first `warmup_s` is excluded from the figures. `build_trace(plan, mix, seed)`
renders it into a `Trace`: per step the intended arrival offsets (open loop),
the shape each request uses and its idempotency key number. Nothing in it
depends on the target, so a benchmark runs A, B, A, B on one trace and both see
the very same requests at the very same intended times.

Each step draws from its own `random.Random` seeded by (seed, step index), so
`trace.subset([i])` (one step, for interleaving) equals that step of the full
trace. Closed-loop steps have no schedule; their requests take shapes from a
seeded cycle of CLOSED_CYCLE choices, in order of sending.

Idempotency keys: "none", or "unique" (key number = request number in the run);
with `dup_fraction` > 0 that share of requests repeats an earlier request of the
same step (same shape, same key), which is what dedup benchmarks need.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import random
from array import array
from dataclasses import dataclass

from proxy.loadtest import arrivals
from proxy.loadtest.shapes import Mix

MODES = ("open", "closed")
IDEMPOTENCY = ("none", "unique")
CLOSED_CYCLE = 8192
_DUP_WINDOW = 64  # a duplicate repeats one of the last 64 distinct requests


@dataclass(frozen=True)
class Step:
    load: float  # requests/s (open loop) or concurrent users (closed loop)
    duration_s: float
    warmup_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.load > 0 or not self.duration_s > 0 or not 0 <= self.warmup_s < self.duration_s:
            raise ValueError(
                f"bad step (load {self.load:g}, {self.duration_s:g} s, warm-up {self.warmup_s:g} s): "
                "need load > 0, duration > 0 and 0 <= warm-up < duration (--warmup-s < --step-s)"
            )

    @property
    def measured_s(self) -> float:
        return self.duration_s - self.warmup_s


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    mode: str = "open"
    arrival: str = "poisson"  # open loop: poisson | constant
    think_ms: float = 0.0  # closed loop: mean pause between a response and the next request
    think: str = "exponential"  # closed loop: constant | exponential

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose from {', '.join(MODES)}")
        if self.arrival not in arrivals.ARRIVALS:
            raise ValueError(f"unknown arrival process {self.arrival!r}; choose from {', '.join(arrivals.ARRIVALS)}")
        if self.think not in arrivals.THINK:
            raise ValueError(f"unknown think-time distribution {self.think!r}")
        if not self.steps:
            raise ValueError("a plan needs at least one step")
        if self.mode == "closed" and any(s.load != int(s.load) for s in self.steps):
            raise ValueError("closed-loop steps are whole numbers of users")

    @property
    def unit(self) -> str:
        return "rps" if self.mode == "open" else "users"

    @classmethod
    def sweep(cls, loads: list[float], *, step_s: float, warmup_s: float = 0.0, **kw: object) -> Plan:
        return cls(tuple(Step(float(x), step_s, warmup_s) for x in loads), **kw)  # type: ignore[arg-type]


def parse_loads(spec: str) -> list[float]:
    """ "100,200,400" or "START:STOP:STEP" (inclusive of STOP when it lands on it) -> loads."""
    spec = spec.strip()
    try:
        if ":" in spec:
            start, stop, step = (float(x) for x in spec.split(":"))
            if not step > 0 or stop < start:
                raise ValueError
            n = int((stop - start) / step + 1e-9)
            return [round(start + i * step, 9) for i in range(n + 1)]
        loads = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"bad load list {spec!r}: want 'A,B,C' or 'START:STOP:STEP'") from None
    if not loads or any(not x > 0 for x in loads):
        raise ValueError(f"bad load list {spec!r}: loads must be > 0")
    return loads


@dataclass(frozen=True, eq=False)
class StepTrace:
    index: int  # position in the full plan (stable under subset())
    step: Step
    offsets: array  # open loop: intended send times from the step start, ascending; closed: empty
    choices: array  # shape index per request (closed loop: a cycle, used in sending order)
    keys: array  # idempotency key number per request, -1 for none

    def __len__(self) -> int:
        return len(self.offsets)

    def closed_request(self, k: int) -> tuple[int, int]:
        """Shape index and key number of the k-th request a closed-loop step sends."""
        cycle = len(self.choices)
        key = self.keys[k % cycle]
        return self.choices[k % cycle], key if key < 0 else key + (k // cycle << 40)


@dataclass(frozen=True, eq=False)
class Trace:
    plan: Plan
    mix: Mix
    seed: int
    steps: tuple[StepTrace, ...]
    idempotency: str = "none"

    def key(self, number: int) -> bytes | None:
        return None if number < 0 else b"lt-%x-%x" % (self.seed & 0xFFFFFFFF, number)

    def subset(self, indices: list[int]) -> Trace:
        """The same trace restricted to some steps (interleaving targets step by step)."""
        return dataclasses.replace(self, steps=tuple(s for s in self.steps if s.index in set(indices)))

    @property
    def requests(self) -> int:
        return sum(len(s) for s in self.steps)


def _choices(rng: random.Random, mix: Mix, n: int) -> array:
    if len(mix.shapes) == 1:
        return array("I", bytes(4 * n))
    cum = list(itertools.accumulate(mix.weights))
    total = cum[-1]
    rand = rng.random
    return array("I", (bisect.bisect_right(cum, rand() * total) for _ in range(n)))


def _keys(rng: random.Random, choices: array, first: int, idempotency: str, dup_fraction: float) -> array:
    n = len(choices)
    if idempotency == "none":
        return array("q", [-1]) * n
    keys = array("q", range(first, first + n))
    if dup_fraction > 0:
        for i in range(1, n):
            if rng.random() < dup_fraction:
                j = rng.randrange(max(0, i - _DUP_WINDOW), i)
                keys[i], choices[i] = keys[j], choices[j]
    return keys


def build_trace(plan: Plan, mix: Mix, seed: int = 0, *, idempotency: str = "none", dup_fraction: float = 0.0) -> Trace:
    """Render `plan` with `mix` under `seed` (see the module doc)."""
    if idempotency not in IDEMPOTENCY:
        raise ValueError(f"unknown idempotency mode {idempotency!r}; choose from {', '.join(IDEMPOTENCY)}")
    if not 0 <= dup_fraction < 1 or (dup_fraction and idempotency == "none"):
        raise ValueError("dup_fraction must be in [0, 1) and needs idempotency='unique'")
    steps, first = [], 0
    for i, step in enumerate(plan.steps):
        rng = random.Random(f"rampmeter-loadtest/{seed}/{i}")
        open_loop = plan.mode == "open"
        offs = arrivals.offsets(plan.arrival, step.load, step.duration_s, rng) if open_loop else array("d")
        choices = _choices(rng, mix, len(offs) if plan.mode == "open" else CLOSED_CYCLE)
        keys = _keys(rng, choices, first, idempotency, dup_fraction)
        first += len(choices)
        steps.append(StepTrace(i, step, offs, choices, keys))
    return Trace(plan, mix, seed, tuple(steps), idempotency)
