"""Windowed latency quantiles: a ring of log-bucket histograms, and a bounded family of them.

Theory of operation: `LogBuckets` maps a value in ms to bucket i covering
(min_ms * g**(i-1), min_ms * g**i], g = (1 + a) / (1 - a); the bucket's
representative value 2 * min_ms * g**i / (g + 1) is within relative error `a` of every
value in it (the DDSketch / HdrHistogram idea). With a = 2% and 0.1 ms .. 10 min that is
about 390 buckets. Values at or below min_ms land in bucket 0 (reported as min_ms);
values above max_ms saturate into the top bucket.

`WindowedQuantiles` keeps `sub_windows` slots of `window_s / sub_windows` seconds each,
slot = floor(now / sub_s) mod n. A slot is a sparse {bucket: count} dict (latencies
cluster, so a slot holds few buckets), and one dense `_total` list holds the sum of the
live slots. Invariant: `_total[i] == sum(slot.get(i, 0) for live slots)`, once the pending
samples are folded. Recording is O(1) and cheap: a sample within the newest sub-window (the
usual case) is appended to `_pending` and folded (one log, two increments each) in batches of
FOLD_EVERY, or before anything reads the buckets: a query that computes, a move to a new
sub-window. Answers are exactly the unbatched ones: `count` adds the pending samples (they all
belong to the newest slot), and a query served from its cache (`refresh_s`) reads no buckets,
as before. When time enters a new sub-window the slots older than
the window are subtracted from `_total` and dropped (O(buckets in the slot), once per
sub-window). A query is a prefix sum and a bisection over `_total` (C loops over ~390
ints); `refresh_s` > 0 caches answers for that long, so the arrival path pays it rarely.
The window therefore covers between window_s - sub_s and window_s seconds of samples.

`LatencyFamily` holds one tracker per key (route, cost bucket), at most `max_keys`,
evicting the least recently recorded key: memory stays bounded whatever keys arrive.

Hand-written rather than `hdrhistogram` / `ddsketch` from PyPI: neither offers the
ring of sub-windows with a merged view, both record through heavier code paths, and the
bucket math here is a dozen lines.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate


class LogBuckets:
    """Geometry of a log-bucket histogram; immutable, shared by many trackers."""

    __slots__ = ("_inv_log_gamma", "_rep", "gamma", "max_ms", "min_ms", "relative_error", "size")

    def __init__(self, min_ms: float = 0.1, max_ms: float = 600_000.0, relative_error: float = 0.02) -> None:
        if not (0 < min_ms < max_ms and 0 < relative_error < 0.5):
            raise ValueError("need 0 < min_ms < max_ms and 0 < relative_error < 0.5")
        self.min_ms, self.max_ms, self.relative_error = min_ms, max_ms, relative_error
        self.gamma = (1 + relative_error) / (1 - relative_error)
        self._inv_log_gamma = 1.0 / math.log(self.gamma)
        self.size = math.ceil(math.log(max_ms / min_ms) * self._inv_log_gamma) + 1
        # Representative of bucket i (i >= 1): the point equidistant, relatively, from both edges.
        scale = 2.0 / (self.gamma + 1.0)
        self._rep = [min_ms] + [min_ms * self.gamma**i * scale for i in range(1, self.size)]

    def index(self, value_ms: float) -> int:
        if not value_ms > self.min_ms:  # also NaN: time differences never produce it
            return 0
        if value_ms >= self.max_ms:
            return self.size - 1
        return min(self.size - 1, math.ceil(math.log(value_ms / self.min_ms) * self._inv_log_gamma))

    def value(self, index: int) -> float:
        return self._rep[index]

    def __repr__(self) -> str:
        return f"LogBuckets({self.min_ms}..{self.max_ms} ms, ±{self.relative_error:.1%}, {self.size} buckets)"


DEFAULT_BUCKETS = LogBuckets()
# Samples of the newest sub-window kept as plain values before they are bucketed (module doc).
FOLD_EVERY = 16


@dataclass(frozen=True, slots=True)
class QuantileStatistics:
    count: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    window_s: float


class WindowedQuantiles:
    """Quantiles of the values recorded over roughly the last `window_s` seconds."""

    def __init__(
        self,
        window_s: float = 60.0,
        sub_windows: int = 6,
        buckets: LogBuckets = DEFAULT_BUCKETS,
        refresh_s: float = 0.0,
    ) -> None:
        if window_s <= 0 or sub_windows < 1 or refresh_s < 0:
            raise ValueError("need window_s > 0, sub_windows >= 1, refresh_s >= 0")
        self.window_s, self.buckets, self.refresh_s = window_s, buckets, refresh_s
        self._n = sub_windows
        self._sub_s = window_s / sub_windows
        self._slots: list[dict[int, int]] = [{} for _ in range(sub_windows)]
        self._slot_epoch: list[int | None] = [None] * sub_windows
        self._total = [0] * buckets.size
        self._count = 0
        self._head: int | None = None  # newest epoch seen; time never runs backwards past it
        self._head_until = -math.inf  # _advance's fast path (see there)
        self._head_slot: dict[int, int] = {}
        self._cache: dict[float, float | None] = {}
        self._cache_until = -math.inf
        self._pending: list[float] = []  # samples of the head slot not yet bucketed (module doc)

    def _fold(self) -> None:
        """Bucket the pending samples into the head slot and the total."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        slot, total, b = self._head_slot, self._total, self.buckets
        # LogBuckets.index, inline: a fold buckets every sample of every window (four windows a request)
        lo, hi, top, inv, log, ceil = b.min_ms, b.max_ms, b.size - 1, b._inv_log_gamma, math.log, math.ceil
        for value in pending:
            if not value > lo:
                i = 0
            elif value >= hi:
                i = top
            else:
                i = ceil(log(value / lo) * inv)
                if i > top:
                    i = top
            slot[i] = slot.get(i, 0) + 1
            total[i] += 1
        self._count += len(pending)

    def _advance(self, now: float) -> dict[int, int]:
        """The slot for `now`, after dropping slots that left the window."""
        if now < self._head_until:  # fast path, no division: surely within the newest sub-window (or late)
            return self._head_slot
        self._fold()  # the pending samples belong to the head slot as it is now
        epoch = math.floor(now / self._sub_s)
        head = self._head
        if head is not None and epoch <= head:  # late samples count as current
            return self._slots[head % self._n]
        oldest_live = epoch - self._n + 1
        for i, slot_epoch in enumerate(self._slot_epoch):
            if slot_epoch is not None and slot_epoch < oldest_live:
                self._expire(i)
        self._head = epoch
        self._slot_epoch[epoch % self._n] = epoch
        self._cache.clear()
        slot = self._head_slot = self._slots[epoch % self._n]
        # Below this, floor(now / sub_s) <= epoch for certain (the margin covers the division's
        # rounding); at or above it the exact test above decides.
        self._head_until = (epoch + 1) * self._sub_s * (1.0 - 1e-9)
        return slot

    def _expire(self, i: int) -> None:
        total, slot = self._total, self._slots[i]
        for bucket, n in slot.items():
            total[bucket] -= n
            self._count -= n
        self._slots[i] = {}
        self._slot_epoch[i] = None

    def record(self, value_ms: float, now: float) -> None:
        if now < self._head_until:  # within the newest sub-window: bucketed later, in a batch
            pending = self._pending
            pending.append(value_ms)
            if len(pending) >= FOLD_EVERY:
                self._fold()
            return
        slot = self._advance(now)
        i = self.buckets.index(value_ms)
        slot[i] = slot.get(i, 0) + 1
        self._total[i] += 1
        self._count += 1

    def count(self, now: float) -> int:
        self._advance(now)
        return self._count + len(self._pending)

    def quantile(self, q: float, now: float) -> float | None:
        """The q-quantile (0 < q <= 1) within the bucket error, or None with no samples.

        Rank-based: the value of the ceil(q * count)-th smallest sample.
        """
        if not now < self._head_until:  # _advance's own fast path, tested here: queries run per request
            self._advance(now)
        if self.refresh_s and now < self._cache_until and q in self._cache:
            return self._cache[q]
        return self._computed(q, now)

    def quantile_if_counted(self, q: float, now: float, min_samples: int) -> float | None:
        """`quantile`, or None while fewer than `min_samples` are in the window (one advance for both)."""
        if not now < self._head_until:  # as in quantile
            self._advance(now)
        if self._count + len(self._pending) < min_samples:
            return None
        if self.refresh_s and now < self._cache_until and q in self._cache:
            return self._cache[q]
        return self._computed(q, now)

    def _computed(self, q: float, now: float) -> float | None:
        self._fold()
        result = None
        if self._count:
            rank = max(1, math.ceil(q * self._count))
            result = self.buckets.value(bisect_left(list(accumulate(self._total)), rank))
        if self.refresh_s:
            if now >= self._cache_until:
                self._cache.clear()
                self._cache_until = now + self.refresh_s
            self._cache[q] = result
        return result

    def statistics(self, now: float) -> QuantileStatistics:
        return QuantileStatistics(
            self.count(now), self.quantile(0.5, now), self.quantile(0.9, now), self.quantile(0.99, now), self.window_s
        )

    def __repr__(self) -> str:
        return (
            f"WindowedQuantiles(window_s={self.window_s}, sub_windows={self._n}, "
            f"count={self._count + len(self._pending)}, head_epoch={self._head})"
        )


def cost_bucket(cost: int) -> int:
    """Power-of-two cost bucket: 0 -> 0, 1 -> 1, 2..3 -> 2, 4..7 -> 3, ..., capped at 40."""
    bucket = cost.bit_length() if cost > 0 else 0  # per request: no min/max calls
    return bucket if bucket < 40 else 40


@dataclass(frozen=True, slots=True)
class FamilyStatistics:
    keys: int
    max_keys: int
    evictions: int


class LatencyFamily:
    """One `WindowedQuantiles` per key (e.g. (route, cost_bucket(cost))), LRU-bounded."""

    def __init__(
        self,
        max_keys: int = 256,
        *,
        window_s: float = 60.0,
        sub_windows: int = 6,
        buckets: LogBuckets = DEFAULT_BUCKETS,
        refresh_s: float = 0.0,
        min_samples: int = 1,
    ) -> None:
        if max_keys < 1 or min_samples < 1:
            raise ValueError("need max_keys >= 1 and min_samples >= 1")
        self.max_keys, self.min_samples = max_keys, min_samples
        self._make: Callable[[], WindowedQuantiles] = lambda: WindowedQuantiles(
            window_s, sub_windows, buckets, refresh_s
        )
        self._trackers: dict[object, WindowedQuantiles] = {}  # insertion order = recency of record
        self._newest: object = None  # the key recorded last (the dict's last key while it is held)
        self._evictions = 0

    def record(self, key: object, value_ms: float, now: float) -> None:
        trackers = self._trackers
        if key == self._newest:  # already the most recent: no pop and re-insert
            tracker = trackers.get(key)
            if tracker is not None:
                if now < tracker._head_until:  # WindowedQuantiles.record's fast path, inline (3 a request)
                    pending = tracker._pending
                    pending.append(value_ms)
                    if len(pending) >= FOLD_EVERY:
                        tracker._fold()
                else:
                    tracker.record(value_ms, now)
                return
        tracker = trackers.pop(key, None)
        self._newest = key
        if tracker is None:
            tracker = self._make()
            if len(self._trackers) >= self.max_keys:
                del self._trackers[next(iter(self._trackers))]
                self._evictions += 1
        self._trackers[key] = tracker  # re-insert: now the most recent
        tracker.record(value_ms, now)

    def quantile(self, key: object, q: float, now: float) -> float | None:
        """The key's q-quantile, or None while it has fewer than `min_samples` in its window."""
        tracker = self._trackers.get(key)
        if tracker is None:
            return None
        # quantile_if_counted's cached answer, inline (two queries a request): no advance due, enough
        # samples, a cached value still fresh; anything else goes the whole way.
        if (
            now < tracker._head_until
            and now < tracker._cache_until
            and tracker._count + len(tracker._pending) >= self.min_samples
            and q in tracker._cache
        ):
            return tracker._cache[q]
        return tracker.quantile_if_counted(q, now, self.min_samples)

    def tracker(self, key: object) -> WindowedQuantiles | None:
        return self._trackers.get(key)

    def keys(self) -> list[object]:
        """Keys with a tracker, least recently recorded first."""
        return list(self._trackers)

    def statistics(self) -> FamilyStatistics:
        return FamilyStatistics(len(self._trackers), self.max_keys, self._evictions)

    def __repr__(self) -> str:
        return f"LatencyFamily(keys={len(self._trackers)}/{self.max_keys}, min_samples={self.min_samples})"
