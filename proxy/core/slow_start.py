"""Slow start: after warm-up, let traffic in gradually rather than all at once.

Theory of operation: a model server that just passed its warm-up probes has
compiled kernels for the probe shapes, but its caches and allocator are still
young; sending it the full concurrency limit at once re-creates the cold-start
spike the probes were meant to avoid. For `window_s` after it turns ready, the
admission limit is multiplied by

    factor(t) = max(min_weight, (t / window_s) ** (1 / aggression)),  0 <= t <= window_s

and by 1 afterwards. This is Envoy's slow_start_config
(`slow_start_window`, `aggression`, `min_weight_percent`) applied to a
concurrency limit instead of a load-balancing weight: aggression 1 is a linear
ramp, > 1 opens faster early (concave), < 1 holds back longer (convex).
`min_weight` keeps a trickle flowing from t = 0 so the ramp can observe latency.

Pure: `t` is seconds since the ramp began, given by the caller.
"""

from __future__ import annotations


def slow_start_factor(t_s: float, *, window_s: float, aggression: float, min_weight: float) -> float:
    """The fraction of the full limit allowed `t_s` seconds into the ramp, in [min_weight, 1]."""
    if aggression <= 0 or not 0 < min_weight <= 1:
        raise ValueError("aggression must be > 0 and min_weight in (0, 1]")
    if window_s <= 0 or t_s >= window_s:
        return 1.0
    progress = max(t_s, 0.0) / window_s
    return max(min_weight, float(progress ** (1.0 / aggression)))
