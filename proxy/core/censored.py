"""What requests that did not finish teach: a lower bound on service time per request shape.

Theory of operation: a request cut after t ms upstream (its deadline passed, its
client left) is a censored sample: its service time is more than t, by an
unknown amount. Completed requests alone teach a survivor's story: when a
backend is slower than the deadlines, nearly every request is cut, the few that
finish are the fast ones, and the model goes on calling every request meetable
(issue 12: 3-4 samples after 2,543 requests on an embeddings server, every
request forwarded, cut and computed anyway).

`CensoredFloors` keeps, per shape bucket (power-of-two prompt and requested
output tokens), a floor under the service model's estimate:

- censored(t) where t exceeds the model's prediction p (t <= p is what the model
  expects anyway: no news): floor = max(floor, t * (1 + INFLATE) ** k), k the
  censorings in a row in that bucket (at most MAX_STREAK). The service time is
  above t; how far above is unknown, so each further cut without a completion
  between them searches higher, geometrically, like a backoff. The estimate after
  the update is therefore never below t.
- completed(ms): a finish inside the bucket ends the streak, and a finish below
  the floor pulls the floor down to it (the shape can take that little).
- time: the floor fades exponentially with a time constant of FADE_MULTIPLE
  times itself (scale-free: a 250 ms floor fades in about a second, a 30 s one
  in minutes). A floor that made every request of its shape unmeetable would
  otherwise never be tested again once the backend recovered; fading lets one
  through now and then, each next try later than the last while cuts go on
  (the floor grows geometrically, its fading time with it). 5x: in a padded
  batch a short request cut because it shared the batch with a long one must
  not wait long to be tried again once the long ones are turned away
  (bench/real_habits: with 20x, FCFS turned every request away for most of a
  20 s step).

Bounded: at most 48 x 48 buckets per route. Pure: `now` is an argument.
"""

from __future__ import annotations

import math
from typing import Any

INFLATE = 0.25  # a cut request is taken to need at least 25% more than it got
MAX_STREAK = 12  # 1.25 ** 12 ~ 14.6: the most one streak multiplies a cut time by
FADE_MULTIPLE = 5.0  # a floor fades with a time constant of 5 x itself
_MAX_BIT = 47


def shape_bucket(prompt_tokens: int, requested_output_tokens: int) -> tuple[int, int]:
    """Power-of-two bucket of a request's shape (prompt, requested output)."""
    return (
        min(max(0, int(prompt_tokens)).bit_length(), _MAX_BIT),
        min(max(0, int(requested_output_tokens)).bit_length(), _MAX_BIT),
    )


class _Floor:
    __slots__ = ("at", "ms", "streak")

    def __init__(self) -> None:
        self.ms = 0.0
        self.at = 0.0
        self.streak = 0

    def value(self, now: float) -> float:
        if self.ms <= 0.0:
            return 0.0
        elapsed = max(0.0, now - self.at)
        return self.ms * math.exp(-elapsed * 1000.0 / (FADE_MULTIPLE * self.ms))


class CensoredFloors:
    __slots__ = ("_floors", "cuts", "informative")

    def __init__(self) -> None:
        self._floors: dict[tuple[int, int], _Floor] = {}
        self.cuts = 0  # censored samples seen
        self.informative = 0  # of them, those longer than the model's prediction

    def floor_ms(self, key: tuple[int, int], now: float) -> float:
        f = self._floors.get(key)
        return 0.0 if f is None else f.value(now)

    def censored(self, key: tuple[int, int], cut_ms: float, predicted_ms: float, now: float) -> bool:
        """A request of this shape was cut after `cut_ms`; True when it taught something."""
        self.cuts += 1
        if not (cut_ms > predicted_ms and math.isfinite(cut_ms)):
            return False
        self.informative += 1
        f = self._floors.get(key)
        if f is None:
            f = self._floors[key] = _Floor()
        current = f.value(now)
        f.streak = min(MAX_STREAK, f.streak + 1)
        f.ms = max(current, cut_ms * (1.0 + INFLATE) ** f.streak)
        f.at = now
        return True

    def completed(self, key: tuple[int, int], ms: float, now: float) -> None:
        f = self._floors.get(key)
        if f is None:
            return
        f.streak = 0
        current = f.value(now)
        if ms < current:
            f.ms, f.at = ms, now
        if f.ms <= 0.0:
            del self._floors[key]

    def statistics(self, now: float) -> dict[str, Any]:
        return {
            "cuts": self.cuts,
            "informative": self.informative,
            "floors_ms": {f"{1 << p >> 1}/{1 << o >> 1}": f.value(now) for (p, o), f in self._floors.items()},
        }

    def __repr__(self) -> str:
        return f"<CensoredFloors {len(self._floors)} buckets cuts={self.cuts} informative={self.informative}>"
