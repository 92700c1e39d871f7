"""Decayed event rates (completions, queue arrivals and departures per second).

Theory of operation: an exponentially decayed event count with time constant
`tau_s`: each event adds 1, the count decays by exp(-dt / tau_s), and
rate = count / tau_s, so a steady r events/s reads r after a few tau_s and an
old burst fades smoothly. O(1) per event and per read; time is an argument.
"""

from __future__ import annotations

import math


class DecayedRate:
    __slots__ = ("_at", "_count", "tau_s")

    def __init__(self, tau_s: float) -> None:
        self.tau_s = tau_s
        self._count = 0.0
        self._at = 0.0

    def _decayed(self, now: float) -> float:
        dt = now - self._at
        return self._count if dt <= 0 else self._count * math.exp(-dt / self.tau_s)

    def add(self, now: float, events: float = 1.0) -> None:
        # _decayed(now) + events, inline: a rate is added to twice per request
        dt = now - self._at
        self._count = (self._count if dt <= 0 else self._count * math.exp(-dt / self.tau_s)) + events
        if dt > 0:
            self._at = now

    def rate(self, now: float) -> float:
        """Events per second around `now`."""
        return self._decayed(now) / self.tau_s

    def __repr__(self) -> str:
        return f"<DecayedRate tau={self.tau_s}s count={self._count:.2f}>"
