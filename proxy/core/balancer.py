"""Which upstream gets the next request: least outstanding, random ties, cooldowns.

Theory of operation: the caller says which upstreams could take the request now
(`eligible`: those with free capacity under their limit; default all) and how
many requests each has outstanding; the balancer picks the eligible one with the
fewest outstanding (least connections beat random/round-robin for uneven GPU
work), breaking ties with the injected `random.Random` so that equal upstreams
share load without a hidden order and tests stay exact.

An upstream that refused a connection is set aside for its `cooldown_s`
(`mark_refused(index, now)`): while any upstream is not cooling down, only
those are chosen (a cooling one with free slots is not worth a quick 502; the
request waits for a healthy one instead). When every upstream is cooling down
there is nothing better, so the eligible one whose cooldown ends first is used.

Pure: time is the `now` argument (seconds), randomness is injected.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import random


class Balancer:
    __slots__ = ("_cooldown_s", "_refusals", "_rng", "_until", "count")

    def __init__(self, count: int, cooldown_s: float | Sequence[float] = 5.0, *, rng: random.Random) -> None:
        if count < 1:
            raise ValueError("a balancer needs at least one upstream")
        self.count = count
        self._until = [float("-inf")] * count  # cooldown end per upstream (seconds)
        self._refusals = [0] * count
        self._rng = rng
        self.set_cooldowns(cooldown_s)

    def set_cooldowns(self, cooldown_s: float | Sequence[float]) -> None:
        """Cooldown length per upstream (one number applies to all); used from the next refusal."""
        values = [float(cooldown_s)] * self.count if isinstance(cooldown_s, int | float) else list(cooldown_s)
        if len(values) != self.count:
            raise ValueError(f"{len(values)} cooldowns for {self.count} upstreams")
        self._cooldown_s = values

    def mark_refused(self, index: int, now: float) -> None:
        """`index` refused a connection at `now`: set it aside for its cooldown."""
        self._until[index] = now + self._cooldown_s[index]
        self._refusals[index] += 1

    def cooling(self, index: int, now: float) -> bool:
        return now < self._until[index]

    def choose(
        self,
        now: float,
        eligible: Iterable[int] | None = None,
        outstanding: Sequence[int] | None = None,
    ) -> int | None:
        """The upstream for the next request, or None when no eligible one may be used."""
        candidates = range(self.count) if eligible is None else eligible
        until = self._until
        if any(now >= t for t in until):
            pool = [i for i in candidates if now >= until[i]]
        else:  # all cooling down: the one that comes back first
            pool = list(candidates)
            if pool:
                first = min(until[i] for i in pool)
                pool = [i for i in pool if until[i] == first]
        if not pool:
            return None
        if outstanding is not None and len(pool) > 1:
            least = min(outstanding[i] for i in pool)
            pool = [i for i in pool if outstanding[i] == least]
        return pool[0] if len(pool) == 1 else pool[self._rng.randrange(len(pool))]

    def statistics(self, now: float | None = None) -> dict[str, Any]:
        return {
            "upstreams": self.count,
            "cooldown_until": [t if t != float("-inf") else None for t in self._until],
            "cooling": None if now is None else [self.cooling(i, now) for i in range(self.count)],
            "refusals": list(self._refusals),
        }

    def __repr__(self) -> str:
        return f"<Balancer upstreams={self.count} refusals={self._refusals}>"
