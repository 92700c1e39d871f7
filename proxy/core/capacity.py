"""Per-upstream slot accounting: what is in flight, against the limit and reserved slots.

Theory of operation: each upstream has a Limit (proxy/core/limits.py) scaled by a
capacity factor (1.0 normally; slow start after warm-up multiplies it, 0 closes
the upstream). Usage is counted in the limit's unit, per class. Reserved slots:
class c may hold up to R_c units that no other class can use; everything a
class holds beyond its own reservation comes out of the general pool of
L - sum(R) units. A placement of `units` for class c fits upstream i iff

    used_i + charge <= L_i                                  (never above the limit)
    general_i - over_c(before) + over_c(after) <= L_i - sum(R)   (the general pool)

where over_c(u) = max(0, u - R_c). With `reserve_only` (the general pool is held
for an earlier request that did not fit) only c's own reservation may be used.

Reservations never take the whole limit: while sum(R) <= L - 1 they apply as
written, else they are scaled down (floor) to fit in L - 1, and at L = 1 there
are none. A serial server (limit 1) with { realtime = 2 } reserved therefore
serves every class from its one slot instead of failing the policy check (issue
12) or starving the others; a gradient limit that shrinks takes the
reservations down with it. The general pool is computed from the per-class
counts under the reservations in force, so accounting stays exact when they
change.

A request larger than anything class c could ever hold here (L - sum of other
classes' reservations) is charged that maximum instead, so it runs alone rather
than waiting forever; the charge is what `give` returns, so accounting stays
exact whatever the limit does meanwhile.

Pure bookkeeping; the controller decides, the balancer picks among fitting upstreams.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

    from proxy.core.balancer import Balancer
    from proxy.core.limits import Limit


class Capacity:
    __slots__ = (
        "_scaled",
        "by_class",
        "factors",
        "limits",
        "requests",
        "reserved",
        "reserved_total",
        "used",
    )

    def __init__(self, limits: list[Limit], reserved: dict[str, int]) -> None:
        n = len(limits)
        self.limits = limits
        self.factors = [1.0] * n
        self.reserved = dict(reserved)
        self.reserved_total = sum(reserved.values())
        self.used = [0] * n  # units in flight
        self._scaled: dict[int, dict[str, int]] = {}  # limit -> reservations in force at that limit
        self.requests = [0] * n  # leases in flight (for the balancer)
        self.by_class: list[dict[str, int]] = [{} for _ in range(n)]

    def __len__(self) -> int:
        return len(self.limits)

    def limit(self, i: int) -> int:
        factor = self.factors[i]
        value = self.limits[i].value
        if factor == 1.0:
            return value
        # 0: the upstream is not ready; a ramp that admits nothing observes nothing, so >= 1 otherwise.
        return 0 if factor <= 0.0 else max(1, int(value * factor))

    def has_room(self) -> bool:
        """Some upstream has a unit free (cheap pre-check before trying candidates)."""
        used = self.used
        return any(used[i] < self.limit(i) for i in range(len(used)))

    def reservations(self, i: int) -> dict[str, int]:
        """The reservations in force on upstream i (see the module docstring)."""
        total = self.reserved_total
        if not total:
            return self.reserved
        limit = self.limit(i)
        room = limit - 1
        if total <= room:
            return self.reserved
        scaled = self._scaled.get(limit)
        if scaled is None:
            scaled = self._scaled[limit] = {c: r * room // total for c, r in self.reserved.items()} if room > 0 else {}
        return scaled

    def general_of(self, i: int, reserved: dict[str, int] | None = None) -> int:
        """Units in flight on upstream i beyond their class's reservation (the general pool's use)."""
        res = self.reservations(i) if reserved is None else reserved
        return sum(_over(held, res.get(c, 0)) for c, held in self.by_class[i].items())

    @property
    def general(self) -> list[int]:
        return [self.general_of(i) for i in range(len(self.limits))]

    def fits(self, i: int, klass: str, units: int, reserve_only: bool = False) -> int | None:
        """Units to charge for placing `units` of `klass` on upstream i, or None if it does not fit."""
        if not self.reserved_total:  # no reservations (the usual policy): the general pool is all of it
            limit = self.limits[i].value if self.factors[i] == 1.0 else self.limit(i)  # limit(i), its fast case inline
            if limit <= 0:
                return None
            charge = min(units, limit)
            # _fits_reserved with nothing reserved: the general pool's use is used[i] (take/give keep
            # it the sum of by_class[i]), and any charge grows it, which reserve_only forbids.
            if self.used[i] + charge > limit or (charge > 0 and reserve_only):
                return None
            return charge
        return self._fits_reserved(i, klass, units, reserve_only)

    def _fits_reserved(self, i: int, klass: str, units: int, reserve_only: bool = False) -> int | None:
        limit = self.limit(i)
        res = self.reservations(i)
        res_total = sum(res.values()) if res is not self.reserved else self.reserved_total
        own = res.get(klass, 0)
        ceiling = limit - res_total + own
        if ceiling <= 0:
            return None
        charge = min(units, ceiling)
        if self.used[i] + charge > limit:
            return None
        mine = self.by_class[i].get(klass, 0)
        grow = _over(mine + charge, own) - _over(mine, own)
        if grow and (reserve_only or self.general_of(i, res) + grow > limit - res_total):
            return None
        return charge

    def place(
        self, klass: str, units: int, now: float, balancer: Balancer, reserve_only: bool = False
    ) -> tuple[int, int] | None:
        """(upstream, units charged) with room, the balancer choosing among those that fit; or None."""
        if len(self.limits) == 1:  # nothing to choose; a lone cooling upstream is still the best one
            charge = self.fits(0, klass, units, reserve_only)
            return None if charge is None else (0, charge)
        fit = {i: c for i in range(len(self.limits)) if (c := self.fits(i, klass, units, reserve_only)) is not None}
        i = balancer.choose(now, fit, self.requests) if fit else None
        return None if i is None else (i, fit[i])

    def ceiling(self, i: int, klass: str) -> int:
        """The most class `klass` could ever hold on upstream i (what an oversized request is charged)."""
        res = self.reservations(i)
        return self.limit(i) - sum(res.values()) + res.get(klass, 0)

    def take(self, i: int, klass: str, charge: int) -> None:
        mine = self.by_class[i].get(klass, 0)
        self.by_class[i][klass] = mine + charge
        self.used[i] += charge
        self.requests[i] += 1

    def give(self, i: int, klass: str, charge: int) -> None:
        mine = self.by_class[i][klass]
        if mine == charge:
            del self.by_class[i][klass]
        else:
            self.by_class[i][klass] = mine - charge
        self.used[i] -= charge
        self.requests[i] -= 1

    def recount(self, leases: Iterable[tuple[int, int, str, int]]) -> dict[int, int]:
        """Charge in-flight work afresh (a reload changed the unit or reservations):
        `leases` yields (lease id, upstream, class, units); returns lease id -> charge."""
        charges: dict[int, int] = {}
        for lease_id, i, klass, units in leases:
            charges[lease_id] = charge = min(units, max(1, self.ceiling(i, klass)))
            self.take(i, klass, charge)
        return charges

    def statistics(self) -> list[dict[str, Any]]:
        return [
            {
                "inflight": self.used[i],
                "requests": self.requests[i],
                "limit": self.limit(i),
                "factor": self.factors[i],
                "by_class": dict(self.by_class[i]),
                **{f"limit_{k}": v for k, v in self.limits[i].statistics().items() if k != "limit"},
            }
            for i in range(len(self.limits))
        ]

    def __repr__(self) -> str:
        return (
            f"<Capacity used={self.used} limits={[self.limit(i) for i in range(len(self))]} reserved={self.reserved}>"
        )


def _over(held: int, reserved: int) -> int:
    """Units of `held` beyond the class's reservation, i.e. out of the general pool."""
    return held - reserved if held > reserved else 0
