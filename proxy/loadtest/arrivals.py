"""Arrival schedules: when each request of an open-loop step is meant to leave.

Theory of operation: a schedule is an `array('d')` of offsets in seconds from the
start of its step, ascending, all in [0, duration_s). The runner adds the step's
absolute start time; latency is then measured from these *intended* times, so a
server that slows the generator down cannot hide behind it (no coordinated
omission).

- constant: t_k = k / rate, exactly floor-ish(rate * duration) arrivals, no jitter.
- poisson: exponential gaps with mean 1 / rate drawn from an injected
  `random.Random`, so a seed reproduces the schedule bit for bit.

Closed-loop think times come from `think_gaps`: constant, or exponential around
the mean. Pure: no clock, no module-level random state.
"""

from __future__ import annotations

import math
import random
from array import array

ARRIVALS = ("poisson", "constant")
THINK = ("constant", "exponential")


def constant_offsets(rate_rps: float, duration_s: float) -> array:
    """Evenly spaced arrivals at `rate_rps`, the first at offset 0."""
    _check(rate_rps, duration_s)
    gap = 1.0 / rate_rps
    n = math.ceil(duration_s * rate_rps - 1e-9)  # offsets k*gap < duration_s
    return array("d", (k * gap for k in range(n)))


def poisson_offsets(rate_rps: float, duration_s: float, rng: random.Random) -> array:
    """A Poisson process at `rate_rps`: i.i.d. exponential gaps, mean 1/rate."""
    _check(rate_rps, duration_s)
    out = array("d")
    expo = rng.expovariate
    t = expo(rate_rps)
    while t < duration_s:
        out.append(t)
        t += expo(rate_rps)
    return out


def offsets(kind: str, rate_rps: float, duration_s: float, rng: random.Random) -> array:
    if kind == "poisson":
        return poisson_offsets(rate_rps, duration_s, rng)
    if kind == "constant":
        return constant_offsets(rate_rps, duration_s)
    raise ValueError(f"unknown arrival process {kind!r}; choose from {', '.join(ARRIVALS)}")


def think_gap(kind: str, mean_s: float, rng: random.Random) -> float:
    """One closed-loop user's pause between a response and its next request."""
    if mean_s <= 0:
        return 0.0
    if kind == "constant":
        return mean_s
    if kind == "exponential":
        return rng.expovariate(1.0 / mean_s)
    raise ValueError(f"unknown think-time distribution {kind!r}; choose from {', '.join(THINK)}")


def _check(rate_rps: float, duration_s: float) -> None:
    if not rate_rps > 0 or not duration_s > 0 or math.isinf(rate_rps):
        raise ValueError(f"need rate > 0 and duration > 0, got rate={rate_rps} duration={duration_s}")
