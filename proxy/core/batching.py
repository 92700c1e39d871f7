"""Dynamic batch formation, pure: which requests share an upstream call, and when it leaves.

Theory of operation: one `BatchFormer` per lane (a batchable route on one
upstream). Admitted requests arrive as `Member`s: a compatibility `key` (model,
parameters, tenant, headers: only equal keys may share a call), a size in
`items` (inputs, the engine's rows) and estimated `tokens`, the tokens of its
longest input, its arrival time and absolute deadline. Every method takes `now`
and returns the `Batch`es to send now (decisions as values); the trio driver
(proxy/runtime/batcher.py) sends them and calls `finished` when each returns.

- Grouping: a member joins the gathering group of its (key, length bucket), the
  bucket of its longest input among `Bounds.buckets`, so members of one call have
  similar lengths and a padding server pads little. A group never exceeds
  `max_items` / `max_tokens`; a member that would overflow it starts the next.
- A group is due (ready to leave) when it is full (`size`, `tokens`), when its
  oldest member has waited the window (`time`), or when the deadline of one of
  its members leaves no more room (`deadline`): a member's latest departure is
  its deadline minus DEADLINE_SAFETY x the expected time of the call (the
  latency curve, for the group's tokens). A member that cannot absorb any wait joins a group only if
  nobody there is made late by it, and that group leaves at once ("first");
  otherwise it leaves alone, at once. Due groups go ahead of the others.
- Sending: due groups leave while fewer than `max_concurrent` batches of the lane
  are in flight, the most urgent (earliest latest departure) first, then the
  shortest expected call, aged by one ms per ms its oldest member has waited (so
  a batch of short inputs need not wait behind a long one, and a long one waits
  at most about the difference of their calls). A due group that must wait for a free call keeps taking members up to
  its bounds: the wait happens anyway, and a busy upstream so gets larger calls.
- Adaptive (`Bounds.adaptive`): `LatencyCurve` fits rtt_ms = a + b * tokens to
  the lane's calls (decayed least squares, held near the route's service-time
  prior until samples outweigh it). Throughput per unit of latency, tokens /
  rtt^2, peaks at tokens = a / b: the knee, where the per-call overhead equals
  the per-token work. The target size is the knee, or, when fewer members are
  expected to arrive during one call of the batch (arrival rate x expected
  rtt), that many: waiting pays while the members it gains outnumber those
  already waiting, and past that point newcomers are served as well by the next
  call. A group is due by size at the target (the bounds stay caps), or by time
  when the members it misses have not come by the time the arrival rate says
  they should have (counted from the latest member), and at the latest when its
  oldest member has waited `max_wait_s`; at low load (less than one arrival per
  call) a request leaves at once.
- Leaving: `leave(member_id)` takes a member whose client left out of a group
  not yet sent (an empty group disappears); once sent, the runtime discards its
  share.

Padding (for the metrics): a batch's `padding_tokens` = longest x items - tokens,
what a padding server computes for nothing; `padding_saved_tokens` = (longest
input among everything gathering under the same key, any bucket, and this batch
- this batch's longest) x items, what grouping by length saved against one mixed
call.

Invariants (tests/core/test_batching.py, Hypothesis): no batch exceeds its
bounds; with a free call, no member waits past its window or latest departure;
every member leaves in exactly one batch or by `leave`; one batch holds one key
and one bucket; in flight <= max_concurrent.
Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from proxy.core.rates import DecayedRate

CLOSED_BY = ("size", "tokens", "time", "deadline")
_RATE_TAU_S = 2.0  # arrival rate memory for the adaptive window
# A member leaves by deadline - SAFETY x the expected call: the curve is a mean, and a call that
# lands exactly on the deadline answers 504.
DEADLINE_SAFETY = 1.5


@dataclass(frozen=True, slots=True)
class Bounds:
    max_items: int
    max_tokens: int
    max_wait_s: float
    buckets: tuple[int, ...] = ()  # token edges: bucket i holds longest inputs in (edge[i-1], edge[i]]
    max_concurrent: int = 1
    adaptive: bool = False

    def fits(self, items: int, tokens: int) -> bool:
        """Whether a request of this size may be batched at all (a larger one goes alone, unbatched)."""
        return 1 <= items <= self.max_items and tokens <= self.max_tokens

    def bucket(self, longest: int) -> int:
        return bisect.bisect_left(self.buckets, longest)


@dataclass(frozen=True, slots=True)
class Member:
    id: int
    key: Hashable
    items: int
    tokens: int
    longest: int  # tokens of its longest input
    arrived_at: float
    deadline: float | None = None  # absolute: the answer must be back by then


@dataclass(frozen=True, slots=True)
class Batch:
    id: int
    key: Hashable
    bucket: int
    members: tuple[Member, ...]
    closed_by: str  # one of CLOSED_BY
    sent_at: float
    padding_saved_tokens: int = 0

    @property
    def items(self) -> int:
        return sum(m.items for m in self.members)

    @property
    def tokens(self) -> int:
        return sum(m.tokens for m in self.members)

    @property
    def longest(self) -> int:
        return max(m.longest for m in self.members)

    @property
    def padding_tokens(self) -> int:
        return self.longest * self.items - self.tokens


class LatencyCurve:
    """rtt_ms ~ a + b * tokens of one lane's calls: decayed least squares pulled towards a prior.

    The prior (base_ms, ms_per_token) weighs `prior_weight` samples at first and
    fades as samples come; each sample decays by 1 - 1/memory per newer one, so
    the fit follows a server that changes. Coefficients are held non-negative (physical: time never shrinks
    with more work).
    """

    __slots__ = ("_a0", "_b0", "_decay", "_prior", "_s", "_scale")

    def __init__(
        self, base_ms: float, ms_per_token: float, *, scale_tokens: float, memory: int = 200, prior_weight: float = 3.0
    ) -> None:
        self._a0, self._b0 = max(0.0, base_ms), max(0.0, ms_per_token)
        self._scale = max(1.0, scale_tokens)  # tokens of a typical call: the prior's slope weighs at this size
        self._decay = 1.0 - 1.0 / memory
        self._prior = prior_weight
        self._s = [0.0, 0.0, 0.0, 0.0, 0.0]  # weight, sum x, sum y, sum xx, sum xy

    def observe(self, tokens: float, rtt_ms: float) -> None:
        s, d = self._s, self._decay
        x, y = float(tokens), float(rtt_ms)
        for i, v in enumerate((1.0, x, y, x * x, x * y)):
            s[i] = s[i] * d + v

    @property
    def samples(self) -> float:
        return self._s[0]

    def coefficients(self) -> tuple[float, float]:
        """(a, b): fixed ms per call, ms per token."""
        w, sx, sy, sxx, sxy = self._s
        # The prior fades as samples come (worth p with none, ~p^2/w with w), yet still fixes what the
        # samples cannot tell: a slope, when every call so far had the same size.
        p = self._prior * self._prior / (self._prior + w)
        px2 = p * self._scale * self._scale
        # Normal equations of the decayed squared error + p*(a-a0)^2 + p*X^2*(b-b0)^2.
        m11, m12, m22 = w + p, sx, sxx + px2
        r1, r2 = sy + p * self._a0, sxy + px2 * self._b0
        det = m11 * m22 - m12 * m12
        if det <= 0:
            return self._a0, self._b0
        a = (r1 * m22 - m12 * r2) / det
        b = (m11 * r2 - m12 * r1) / det
        if b < 0:  # no per-token cost seen: all of it is per call
            return max(0.0, r1 / m11), 0.0
        if a < 0:
            return 0.0, max(0.0, r2 / m22)
        return a, b

    def expected_ms(self, tokens: float) -> float:
        a, b = self.coefficients()
        return a + b * tokens

    def knee_tokens(self) -> float:
        """Tokens per call where tokens / rtt^2 peaks: a / b (infinite when tokens cost nothing)."""
        a, b = self.coefficients()
        return math.inf if b <= 0 else a / b

    def __repr__(self) -> str:
        a, b = self.coefficients()
        return f"<LatencyCurve {a:.2f} ms + {b:.4f} ms/token, {self.samples:.0f} samples>"


class _Group:
    """A batch still gathering (mutable; only the former touches it)."""

    __slots__ = ("bucket", "id", "items", "key", "members", "tokens", "urgent")

    def __init__(self, gid: int, key: Hashable, bucket: int) -> None:
        self.id, self.key, self.bucket = gid, key, bucket
        self.members: dict[int, Member] = {}
        self.items = self.tokens = 0
        self.urgent = False  # holds a member that could not wait: leaves as soon as a call is free

    def put(self, m: Member) -> None:
        self.members[m.id] = m
        self.items += m.items
        self.tokens += m.tokens

    def take(self, member_id: int) -> None:
        m = self.members.pop(member_id)
        self.items -= m.items
        self.tokens -= m.tokens

    def oldest(self) -> float:
        return min(m.arrived_at for m in self.members.values())

    def newest(self) -> float:
        return max(m.arrived_at for m in self.members.values())


class BatchFormer:
    """Batch formation for one lane; see the module doc."""

    def __init__(self, bounds: Bounds, curve: LatencyCurve) -> None:
        self.bounds = bounds
        self.curve = curve
        self.in_flight = 0
        self._groups: dict[int, _Group] = {}  # every group gathering, oldest first
        self._gathering: dict[tuple[Hashable, int], _Group] = {}  # the group a new member of (key, bucket) joins
        self._where: dict[int, _Group] = {}  # member id -> its group
        self._rates: dict[int, DecayedRate] = {}  # per bucket: items arriving per second
        self._ids = 0
        self.counts = dict.fromkeys(CLOSED_BY, 0) | {"members": 0, "left": 0}

    # --- events ------------------------------------------------------------

    def add(self, member: Member, now: float) -> list[Batch]:
        """A member arrives; the batches to send now."""
        b = self.bounds
        if not b.fits(member.items, member.tokens):
            raise ValueError(f"a member of {member.items} items / {member.tokens} tokens exceeds the bounds")
        if member.id in self._where:
            raise ValueError(f"member {member.id} is already gathering")
        bucket = b.bucket(member.longest)
        self._rate(bucket).add(now, member.items)
        self.counts["members"] += 1
        group = self._gathering.get((member.key, bucket))
        if group is not None and not self._can_join(group, member, now):
            group = None
        hurried = self._latest_departure(member, member.tokens) <= now
        if group is None:
            group = self._open(member.key, bucket)
        group.put(member)
        self._where[member.id] = group
        group.urgent = group.urgent or hurried
        if group.items >= b.max_items or group.tokens >= b.max_tokens:
            self._gathering.pop((group.key, group.bucket), None)  # full: the next member starts another
        return self._dispatch(now)

    def leave(self, member_id: int, now: float) -> bool:
        """A member whose client left before its batch was sent; False when it is not gathering."""
        group = self._where.pop(member_id, None)
        if group is None:
            return False
        group.take(member_id)
        self.counts["left"] += 1
        if not group.members:
            self._drop(group)
        return True

    def poll(self, now: float) -> list[Batch]:
        """Timers: the batches due by `now` that a free call can take."""
        return self._dispatch(now)

    def finished(self, batch: Batch, now: float, rtt_ms: float | None = None) -> list[Batch]:
        """A sent batch returned (rtt_ms when it succeeded: a latency sample); the batches to send now."""
        if self.in_flight <= 0:
            raise ValueError("finished() without a batch in flight")
        self.in_flight -= 1
        if rtt_ms is not None:
            self.curve.observe(batch.tokens, rtt_ms)
        return self._dispatch(now)

    # --- timing ------------------------------------------------------------

    def wake_at(self, now: float) -> float | None:
        """When a gathering group next falls due, if a call is free to take it (None: nothing to time)."""
        if self.in_flight >= self.bounds.max_concurrent or not self._groups:
            return None
        return min(self._due(g, now)[0] for g in self._groups.values())

    def _due(self, g: _Group, now: float) -> tuple[float, str]:
        """(when g falls due, why), given its members now."""
        b = self.bounds
        if g.items >= b.max_items:
            return -math.inf, "size"
        if g.tokens >= b.max_tokens:
            return -math.inf, "tokens"
        if b.adaptive and g.items >= self._target_items(g, now):
            return -math.inf, "size"
        latest = min((self._latest_departure(m, g.tokens) for m in g.members.values()), default=math.inf)
        if g.urgent:
            return min(latest, now), "deadline"
        window_end = g.oldest() + b.max_wait_s
        if b.adaptive:  # the expected time the missing members arrive by, counted from the latest one
            rate = self._rate(g.bucket).rate(now)  # items per second
            missing = self._target_items(g, now) - g.items
            filled = g.newest() + missing / rate if rate > 0 else -math.inf
            window_end = min(window_end, filled)
        return (latest, "deadline") if latest < window_end else (window_end, "time")

    def _target_items(self, g: _Group, now: float) -> float:
        """Adaptive size: the knee, or fewer when fewer arrive during one call of this batch."""
        b = self.bounds
        per_item = g.tokens / max(1, g.items)
        knee_items = min(self._knee(), b.max_tokens) / max(per_item, 1e-9)
        # Waiting pays while more members are expected during the call than are already here: past that,
        # newcomers are better served by the next call, which they would reach in time anyway.
        balance = self._rate(g.bucket).rate(now) * self.curve.expected_ms(g.tokens) / 1000.0
        return max(1.0, min(float(b.max_items), knee_items, balance))

    def _knee(self) -> float:
        return max(1.0, self.curve.knee_tokens())

    def _latest_departure(self, m: Member, tokens: int) -> float:
        if m.deadline is None:
            return math.inf
        return m.deadline - DEADLINE_SAFETY * self.curve.expected_ms(tokens) / 1000.0

    def _can_join(self, g: _Group, m: Member, now: float) -> bool:
        b = self.bounds
        if g.items + m.items > b.max_items or g.tokens + m.tokens > b.max_tokens:
            return False
        tokens = g.tokens + m.tokens
        # Nobody already there, nor the newcomer (unless it is late alone as well), is made late by joining.
        if any(self._latest_departure(x, tokens) < now for x in g.members.values()):
            return False
        return self._latest_departure(m, tokens) >= now or self._latest_departure(m, m.tokens) < now

    # --- sending -----------------------------------------------------------

    def _dispatch(self, now: float) -> list[Batch]:
        out: list[Batch] = []
        b = self.bounds
        while self.in_flight < b.max_concurrent and self._groups:
            best, best_rank = None, None
            for g in self._groups.values():
                at, why = self._due(g, now)
                if at > now:
                    continue
                if why == "deadline":
                    rank = (0, at)
                else:  # shortest call first, aged one ms per ms its oldest member has waited
                    rank = (1, self.curve.expected_ms(g.tokens) / 1000.0 - (now - g.oldest()))
                if best_rank is None or rank < best_rank:
                    best, best_rank, reason = g, rank, why
            if best is None:
                break
            out.append(self._send(best, reason, now))
        return out

    def _send(self, g: _Group, reason: str, now: float) -> Batch:
        self._drop(g)
        for member_id in g.members:
            del self._where[member_id]
        members = tuple(g.members.values())
        longest = max(m.longest for m in members)
        mixed = max((m.longest for o in self._groups.values() if o.key == g.key for m in o.members.values()), default=0)
        saved = max(0, mixed - longest) * g.items
        self._ids += 1
        self.in_flight += 1
        self.counts[reason] += 1
        return Batch(self._ids, g.key, g.bucket, members, reason, now, saved)

    # --- bookkeeping -------------------------------------------------------

    def _open(self, key: Hashable, bucket: int) -> _Group:
        self._ids += 1
        g = self._groups[self._ids] = _Group(self._ids, key, bucket)
        self._gathering[(key, bucket)] = g
        return g

    def _drop(self, g: _Group) -> None:
        del self._groups[g.id]
        if self._gathering.get((g.key, g.bucket)) is g:
            del self._gathering[(g.key, g.bucket)]

    def _rate(self, bucket: int) -> DecayedRate:
        rate = self._rates.get(bucket)
        if rate is None:
            rate = self._rates[bucket] = DecayedRate(_RATE_TAU_S)
        return rate

    @property
    def open_groups(self) -> int:
        return len(self._groups)

    @property
    def waiting(self) -> int:
        return len(self._where)

    def statistics(self, now: float) -> dict[str, Any]:
        a, b = self.curve.coefficients()
        return {
            "in_flight": self.in_flight,
            "open_groups": len(self._groups),
            "waiting": len(self._where),
            "curve_ms": {"per_call": round(a, 3), "per_token": round(b, 5), "samples": round(self.curve.samples, 1)},
            "knee_tokens": None if math.isinf(self._knee()) else round(self._knee(), 1),
            "counts": dict(self.counts),
        }

    def __repr__(self) -> str:
        return f"<BatchFormer open={len(self._groups)} waiting={len(self._where)} in_flight={self.in_flight}>"
