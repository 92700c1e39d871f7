"""Injected faults: a slowdown factor and an error rate over a time window.

Theory of operation: a `Fault` is a frozen value active on [start_s, end_s) of
the pod's clock. `Faults` holds the windows in force: the one from the command
line (`--fault-slowdown 3 --fault-start-s 10 --fault-duration-s 10`, relative to
process start) and whatever `POST /sim/faults` set, which REPLACES all windows
(`{}` or slowdown 1 with error_rate 0 clears them). `at(now)` combines the windows
active at `now`: slowdowns multiply, error rates combine as independent failures.
The driver applies the slowdown to each engine step; the HTTP layer draws the
error with its seeded RNG and answers 500 instead of executing.

Pure: `now` is an argument; no clock, no randomness here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Fault:
    slowdown: float = 1.0
    error_rate: float = 0.0
    start_s: float = 0.0
    end_s: float = math.inf

    def __post_init__(self) -> None:
        if not (self.slowdown > 0 and math.isfinite(self.slowdown)):
            raise ValueError("slowdown must be a finite number > 0")
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError("error_rate must be within [0, 1]")
        if self.end_s < self.start_s:
            raise ValueError("a fault cannot end before it starts")

    @property
    def is_noop(self) -> bool:
        return self.slowdown == 1.0 and self.error_rate == 0.0

    def active(self, now: float) -> bool:
        return self.start_s <= now < self.end_s


@dataclass(frozen=True, slots=True)
class FaultState:
    slowdown: float = 1.0
    error_rate: float = 0.0


HEALTHY = FaultState()


def fault_from_json(body: object, now: float) -> Fault | None:
    """The window a `POST /sim/faults` body asks for, starting at `now`; None clears.

    Body: {"slowdown": 3.0, "error_rate": 0.1, "duration_s": 10} (every key
    optional; no duration_s: until replaced). Raises ValueError/TypeError naming the key.
    """
    if not isinstance(body, dict):
        raise TypeError("the body must be a JSON object")
    unknown = set(body) - {"slowdown", "error_rate", "duration_s"}
    if unknown:
        raise ValueError(f"unknown keys: {', '.join(sorted(unknown))}")
    values = {}
    for key, default in (("slowdown", 1.0), ("error_rate", 0.0), ("duration_s", math.inf)):
        value = body.get(key, default)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{key} must be a number")
        values[key] = float(value)
    if values["duration_s"] < 0:
        raise ValueError("duration_s must be >= 0")
    fault = Fault(values["slowdown"], values["error_rate"], now, now + values["duration_s"])
    return None if fault.is_noop else fault


class Faults:
    def __init__(self, windows: list[Fault] | None = None) -> None:
        self._windows = [w for w in windows or [] if not w.is_noop]

    def replace(self, fault: Fault | None) -> None:
        """Install `fault` as the only window (None: no fault)."""
        self._windows = [] if fault is None else [fault]

    def at(self, now: float) -> FaultState:
        if not self._windows:  # the common case, kept cheap: called every step
            return HEALTHY
        slowdown, ok = 1.0, 1.0
        for w in self._windows:
            if w.active(now):
                slowdown *= w.slowdown
                ok *= 1.0 - w.error_rate
        if slowdown == 1.0 and ok == 1.0:
            return HEALTHY
        return FaultState(slowdown, 1.0 - ok)

    def statistics(self, now: float) -> dict:
        state = self.at(now)
        return {
            "slowdown": state.slowdown,
            "error_rate": state.error_rate,
            "windows": [
                {
                    "slowdown": w.slowdown,
                    "error_rate": w.error_rate,
                    "start_s": w.start_s,
                    "end_s": None if math.isinf(w.end_s) else w.end_s,
                }
                for w in self._windows
            ],
        }

    def __repr__(self) -> str:
        return f"<Faults {len(self._windows)} window(s)>"
