"""Policy for load shedding, tenant quotas and latency tracking: `[shedding]`, `[tenants]`, `[latency]`.

Theory of operation: three strict sections with documented defaults; `proxy.policy.schema`
composes them into `Policy`. Every threshold in `[shedding]` is the most important
class's; each class below it gets `(1 - class_step_pct / 100) ** rank` of it, so lower
classes are shed first (docs/shedding.md). The builder functions at the bottom turn a
section into the pure core objects, so the composition root only wires.

Cross-field rules relate keys inside one table each, so they run in `__post_init__`
(msgspec reports the ValueError at the table, e.g. `shedding: ...`) rather than through
`proxy.policy.load.cross_check`: schema.py imports this module at its end and load.py
imports schema, so importing load from here breaks whenever load is imported first
(the same choice as proxy/policy/warmup.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, field

from proxy.core.quantiles import LatencyFamily, LogBuckets
from proxy.core.retry_after import RandomSource, RetryAfter
from proxy.core.shedding import ShedConfig, Shedder, class_weights
from proxy.core.token_bucket import TenantQuota
from proxy.policy.base import Section

Rule = Literal["queue_length", "gpu_memory", "saturation", "codel"]
ALL_RULES: tuple[Rule, ...] = ("queue_length", "gpu_memory", "saturation", "codel")
DEFAULT_RULES: tuple[Rule, ...] = ("queue_length", "gpu_memory", "codel")


class Shedding(Section, frozen=True):
    """Shedding at arrival, before enqueue, lowest class first (docs/shedding.md)."""

    rules: Annotated[
        list[Rule],
        Meta(
            description="Rules in force, evaluated in the fixed order queue_length, gpu_memory, saturation, codel; [] turns shedding off. saturation is off by default: its rates cannot tell a burst (or the slow-start ramp) from overload, and it shed 96% of a 100-request burst on a fresh sidecar; the deadline check and codel catch real overload."
        ),
    ] = field(default_factory=lambda: list(DEFAULT_RULES))
    class_step_pct: Annotated[
        float,
        Meta(
            ge=0,
            le=90,
            description="Each class below the top gets this much less of every threshold (class rank r gets (1 - pct/100)^r of it).",
        ),
    ] = 25.0
    max_queued_requests: Annotated[
        int,
        Meta(
            ge=1,
            le=10_000_000,
            description="queue_length: requests queued at or above a top-class request's priority at which it gets 503 queue_full.",
        ),
    ] = 1024
    gpu_memory_high_water: Annotated[
        float,
        Meta(
            ge=0,
            le=1,
            description="gpu_memory: GPU memory fraction in use at which top-class arrivals get 503 gpu_pressure; lower classes need proportionally more free memory.",
        ),
    ] = 0.95
    saturation_growth_pct: Annotated[
        float,
        Meta(
            ge=0,
            le=10_000,
            description="saturation: with in-flight at the concurrency limit, top-class arrivals get 503 overloaded while the queue grows at this % of the drain rate or more.",
        ),
    ] = 50.0
    codel_target_ms: Annotated[
        float,
        Meta(
            ge=0,
            le=600_000,
            description="codel: the floor of the target; the target in force is the larger of this and codel_target_p50_ratio x the observed p50 service time. A queue whose minimum wait over a whole interval stays above the target is a standing queue (one CoDel per class): its class is shed by CoDel's control law, every class below it wholly; never a request whose deadline the queue ahead of it would drain within.",
        ),
    ] = 5.0
    codel_interval_ms: Annotated[
        float,
        Meta(
            gt=0,
            le=600_000,
            description="codel: the floor of the interval; the interval in force is the larger of this, the target and codel_interval_p99_ratio x the observed p99 service time. Each class's minimum queue wait is taken over it; while a queue stands its class sheds one arrival per interval/sqrt(drops so far); the first interval below target ends it.",
        ),
    ] = 100.0
    codel_target_p50_ratio: Annotated[
        float,
        Meta(
            ge=0,
            le=1000,
            description="codel: the target as a multiple of the observed p50 service time (the backend's own time scale: near capacity a request waits a good fraction of a service time for a slot). 0: codel_target_ms alone.",
        ),
    ] = 0.5
    codel_interval_p99_ratio: Annotated[
        float,
        Meta(
            ge=0,
            le=1000,
            description="codel: the interval as a multiple of the observed p99 service time, so shedding can show its effect before the next interval is judged. 0: codel_interval_ms alone.",
        ),
    ] = 1.0
    retry_after_min_ms: Annotated[
        int, Meta(ge=0, le=3_600_000, description="Smallest Retry-After a rejection carries.")
    ] = 100
    retry_after_max_ms: Annotated[
        int,
        Meta(
            ge=1, le=3_600_000, description="Largest Retry-After a rejection carries (also used when nothing drains)."
        ),
    ] = 30_000
    retry_after_jitter_pct: Annotated[
        float,
        Meta(
            ge=0,
            le=100,
            description="Retry-After is spread up to this % above the drain time, so clients do not return in lockstep.",
        ),
    ] = 20.0

    def __post_init__(self) -> None:
        if self.retry_after_min_ms > self.retry_after_max_ms:
            raise ValueError("retry_after_min_ms must be <= retry_after_max_ms")
        if len(set(self.rules)) != len(self.rules):
            raise ValueError("rules lists a rule twice")


class Tenants(Section, frozen=True):
    """Per-tenant token buckets answering 429 tenant_quota."""

    enabled: Annotated[bool, Meta(description="Charge every request to its tenant's token bucket.")] = False
    trust_x_tenant: Annotated[
        bool,
        Meta(
            description="Take the tenant from x-tenant (only behind a gateway that sets it); otherwise a hash of Authorization; neither: one shared anonymous tenant."
        ),
    ] = False
    rate_per_s: Annotated[
        float, Meta(gt=0, le=1_000_000, description="Requests per second each tenant may sustain.")
    ] = 50.0
    burst: Annotated[
        int, Meta(ge=1, le=10_000_000, description="Requests a tenant may send at once after being idle (bucket size).")
    ] = 100
    max_tenants: Annotated[
        int,
        Meta(
            ge=1,
            le=10_000_000,
            description="Tenants tracked at once; the least recently seen is forgotten (and so starts full again).",
        ),
    ] = 10_000


class Latency(Section, frozen=True):
    """Windowed latency quantiles (service, queue wait, end to end) and the client timeout hint."""

    window_s: Annotated[float, Meta(gt=0, le=3600, description="How far back quantiles look.")] = 60.0
    sub_windows: Annotated[int, Meta(ge=1, le=60, description="The window moves in window_s / sub_windows steps.")] = 6
    relative_error_pct: Annotated[
        float, Meta(ge=0.5, le=10, description="Quantile accuracy: relative error of the log-bucket histograms.")
    ] = 2.0
    max_keys: Annotated[
        int,
        Meta(
            ge=1,
            le=100_000,
            description="(route, cost bucket) keys tracked per family; the least recently recorded is dropped.",
        ),
    ] = 256
    min_samples: Annotated[
        int,
        Meta(
            ge=1,
            le=1_000_000,
            description="Samples a key needs before its p99 replaces the model's expected service time.",
        ),
    ] = 20
    quantile_refresh_ms: Annotated[
        int, Meta(ge=0, le=60_000, description="Quantile answers are reused this long (0: computed on every query).")
    ] = 250
    timeout_hint_factor: Annotated[
        float, Meta(ge=1, le=100, description="x-rampmeter-timeout-hint-ms = p99 end-to-end latency times this.")
    ] = 2.5
    timeout_hint_min_ms: Annotated[int, Meta(ge=1, le=86_400_000, description="Smallest timeout hint.")] = 100
    timeout_hint_max_ms: Annotated[int, Meta(ge=1, le=86_400_000, description="Largest timeout hint.")] = 600_000

    def __post_init__(self) -> None:
        if self.timeout_hint_min_ms > self.timeout_hint_max_ms:
            raise ValueError("timeout_hint_min_ms must be <= timeout_hint_max_ms")
        if self.window_s / self.sub_windows < 0.1:
            raise ValueError("window_s / sub_windows must be >= 0.1 s")


def shed_config(section: Shedding, n_classes: int) -> ShedConfig:
    on = set(section.rules)
    return ShedConfig(
        weights=class_weights(n_classes, section.class_step_pct / 100.0),
        max_queued=section.max_queued_requests if "queue_length" in on else None,
        gpu_memory_high_water=section.gpu_memory_high_water if "gpu_memory" in on else None,
        saturation_growth_ratio=section.saturation_growth_pct / 100.0 if "saturation" in on else None,
        codel_target_ms=section.codel_target_ms if "codel" in on else None,
        codel_interval_ms=section.codel_interval_ms,
        codel_target_p50_ratio=section.codel_target_p50_ratio,
        codel_interval_p99_ratio=section.codel_interval_p99_ratio,
    )


def retry_after(section: Shedding, rng: RandomSource) -> RetryAfter:
    return RetryAfter(
        section.retry_after_min_ms, section.retry_after_max_ms, section.retry_after_jitter_pct / 100.0, rng
    )


def shedder(section: Shedding, n_classes: int, rng: RandomSource) -> Shedder:
    return Shedder(shed_config(section, n_classes), retry_after(section, rng))


def tenant_quota(section: Tenants) -> TenantQuota | None:
    return TenantQuota(section.rate_per_s, section.burst, section.max_tenants) if section.enabled else None


def latency_family(section: Latency) -> LatencyFamily:
    """One family; the composition root makes three (service time, queue wait, end to end)."""
    return LatencyFamily(
        section.max_keys,
        window_s=section.window_s,
        sub_windows=section.sub_windows,
        buckets=LogBuckets(relative_error=section.relative_error_pct / 100.0),
        refresh_s=section.quantile_refresh_ms / 1000.0,
        min_samples=section.min_samples,
    )
