"""Policy sections for admission: `[scheduling]`, `[classes.<name>]`, `[[routes]]`, `[limits]`.

Theory of operation: these tables feed the pure admission core
(proxy/core/{cost,service_model,sjf,limits,admission}.py), which reads them as
plain attributes. Units are in the names; "units" means the limit's unit
(`limits.unit`: requests, or tokens = prompt + output tokens, a proxy for KV
cache). Rules that relate fields (class names referenced elsewhere, limit
bounds, engine_queue's needs) are in `check_admission`, one message per problem,
each naming its key. Reserved slots are not bounded by the limit here: the core
scales them down to what a limit allows (proxy/core/capacity.py), so a policy
with { realtime = 2 } also fits a serial server with a limit of 1.

`[classes]` and `[[routes]]` replace the defaults as a whole when written: a
policy that defines `[classes.gold]` has only that class (and must then name it
as `scheduling.default_class`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
from msgspec import Meta

from proxy.policy.base import Section, cross_check

if TYPE_CHECKING:
    from proxy.policy.schema import Policy

ClassName = Annotated[
    str, Meta(pattern=r"^[a-z][a-z0-9_-]{0,31}$", description="Lower-case class name, as sent in x-priority.")
]


class Scheduling(Section, frozen=True):
    """Queue order and how classes share the upstream."""

    order: Annotated[
        Literal["sjf", "fcfs"],
        Meta(description="sjf: shortest expected service time first, with aging; fcfs: arrival order (the baseline)."),
    ] = "sjf"
    aging_ms_per_s: Annotated[
        float,
        Meta(
            ge=0,
            le=1_000_000,
            description="SJF aging: a queued request's key drops by this many ms of expected service time per second waited (1000: one ms per ms). A ratio, so it is scale-free: 100 lets a request pass one expected to take 0.1 s less for each second it waited longer, in any backend's time scale.",
        ),
    ] = 100.0
    fcfs_wait_multiple: Annotated[
        float,
        Meta(
            ge=0,
            le=1000,
            description="Starvation bound in the backend's own terms: a queued request is overdue (served first, earliest due first) once it has waited this multiple of the wait first-come-first-served would have given it (the work ahead of it at arrival over the parallelism). SJF keeps the short requests' gain while no request waits much more than FCFS makes it wait. 0: off (only max_queue_wait_ms).",
        ),
    ] = 2.0
    class_mode: Annotated[
        Literal["strict", "weighted"],
        Meta(
            description="strict: lower `priority` always first; weighted: classes share admissions by `weight` (smooth weighted round robin)."
        ),
    ] = "strict"
    default_class: Annotated[
        ClassName, Meta(description="Class for requests without x-priority or with an unknown one.")
    ] = "interactive"
    reserved_slots: Annotated[
        dict[ClassName, Annotated[int, Meta(ge=0, le=10_000_000)]],
        Meta(
            description="Per upstream, limit units only this class may use, so it skips the wait (e.g. { realtime = 2 }); idle when that class sends nothing. While the limit is smaller than their sum + 1 they are scaled down to leave one unit to every class (none at a limit of 1)."
        ),
    ] = msgspec.field(default_factory=dict)
    parse_max_bytes: Annotated[
        int,
        Meta(
            ge=0,
            le=67_108_864,
            description="Request bodies up to this size are parsed for cost; larger ones are estimated from their size.",
        ),
    ] = 1_048_576
    model_memory_samples: Annotated[
        int,
        Meta(
            ge=10,
            le=1_000_000,
            description=(
                "Service-time model memory: older samples fade with forgetting factor 1 - 1/this. The models"
                " learn from 200 completions a second at most (an even share above that rate), so the memory"
                " spans at least this / 200 seconds."
            ),
        ),
    ] = 500
    model_prior_samples: Annotated[
        float,
        Meta(
            ge=0.01,
            le=100_000,
            description="How many samples the route's service-time priors are worth before observations outweigh them.",
        ),
    ] = 5.0
    unjudged_in_flight: Annotated[
        int,
        Meta(
            ge=0,
            le=1_000_000,
            description="While a route's service-time model has only its priors (no answer, no request cut at its deadline, no warm-up probe yet), at most this many of its requests with a deadline go upstream at once; the rest wait for the first answer. 0: trust the priors.",
        ),
    ] = 1
    drain_window_s: Annotated[
        float,
        Meta(
            gt=0, le=3600, description="Time constant of the decayed drain and arrival rates (completions per second)."
        ),
    ] = 10.0


class ClassPolicy(Section, frozen=True):
    """One request class (x-priority value)."""

    priority: Annotated[int, Meta(ge=0, le=100, description="Strict mode: lower is served first.")] = 1
    weight: Annotated[
        int, Meta(ge=1, le=1000, description="Weighted mode: share of admissions relative to other classes' weights.")
    ] = 1
    max_queue_length: Annotated[
        int,
        Meta(
            ge=0,
            le=1_000_000,
            description="Requests that may wait; beyond it arrivals get 503 class_queue_full. 0: admit now or reject.",
        ),
    ] = 256
    max_queue_wait_ms: Annotated[
        int,
        Meta(
            ge=1,
            le=86_400_000,
            description="Absolute backstop of the starvation bound (the bound in the backend's terms is scheduling.fcfs_wait_multiple): past this wait a request goes to the front, ahead of SJF order and other classes. Keep it above normal queue waits, or SJF turns into FCFS.",
        ),
    ] = 600_000
    default_timeout_ms: Annotated[
        int,
        Meta(
            ge=1,
            le=86_400_000,
            description="Deadline budget for requests that send no x-request-timeout-ms / grpc-timeout.",
        ),
    ] = 60_000
    max_timeout_ms: Annotated[int, Meta(ge=1, le=86_400_000, description="Caller budgets are capped at this.")] = (
        600_000
    )
    on_unmeetable: Annotated[
        Literal["reject", "try"],
        Meta(
            description="When the estimated completion misses the deadline at arrival: reject (503 deadline_unmeetable) or try anyway."
        ),
    ] = "reject"


def default_classes() -> dict[str, ClassPolicy]:
    return {
        "realtime": ClassPolicy(
            priority=0,
            weight=8,
            max_queue_length=64,
            max_queue_wait_ms=10_000,
            default_timeout_ms=2000,
            max_timeout_ms=10_000,
        ),
        "interactive": ClassPolicy(
            priority=1,
            weight=4,
            max_queue_length=256,
            max_queue_wait_ms=120_000,
            default_timeout_ms=30_000,
            max_timeout_ms=120_000,
        ),
        "batch": ClassPolicy(
            priority=2,
            weight=1,
            max_queue_length=1024,
            max_queue_wait_ms=3_600_000,
            default_timeout_ms=600_000,
            max_timeout_ms=3_600_000,
        ),
    }


class Route(Section, frozen=True):
    """How requests under a path are costed, and the service-time priors for them."""

    path_prefix: Annotated[
        str,
        Meta(pattern=r"^/", max_length=512, description="Requests whose path starts with this (longest prefix wins)."),
    ]
    kind: Annotated[
        Literal["chat", "completions", "embeddings", "fixed"],
        Meta(
            description="Body shape: chat (messages), completions (prompt), embeddings (input), fixed (fixed_tokens, body not read)."
        ),
    ] = "fixed"
    chars_per_token: Annotated[
        float, Meta(gt=0, le=100, description="Characters per token when estimating prompt tokens from text.")
    ] = 4.0
    default_max_tokens: Annotated[
        int,
        Meta(
            ge=0,
            le=10_000_000,
            description="Output tokens assumed when the body has no max_tokens / max_completion_tokens.",
        ),
    ] = 256
    fixed_tokens: Annotated[
        int, Meta(ge=0, le=10_000_000, description="kind = fixed: the cost of every request, in tokens.")
    ] = 1
    base_ms: Annotated[
        float, Meta(ge=0, le=3_600_000, description="Service-time prior: fixed overhead per request.")
    ] = 20.0
    ms_per_prompt_token: Annotated[
        float, Meta(ge=0, le=60_000, description="Service-time prior: prefill time per prompt token.")
    ] = 0.1
    ms_per_output_token: Annotated[
        float, Meta(ge=0, le=60_000, description="Service-time prior: decode time per output token.")
    ] = 20.0
    output_fill_ratio: Annotated[
        float,
        Meta(
            gt=0,
            le=1,
            description="Prior for generated / requested output tokens (learned online from observed usage).",
        ),
    ] = 0.5
    by_shape: Annotated[
        bool,
        Meta(
            description='The catch-all (path_prefix "/", kind fixed) only: a body with messages, prompt or input is costed as chat, completions or embeddings by the first route of that kind (servers differ in prefixes: /embeddings, /completion); false: every unmatched request costs fixed_tokens.'
        ),
    ] = True


def default_routes() -> list[Route]:
    return [
        Route(path_prefix="/v1/chat/completions", kind="chat"),
        Route(path_prefix="/v1/completions", kind="completions"),
        Route(
            path_prefix="/v1/embeddings",
            kind="embeddings",
            base_ms=5.0,
            ms_per_prompt_token=0.02,
            ms_per_output_token=0.0,
        ),
        Route(path_prefix="/", kind="fixed", base_ms=50.0),
    ]


class Limits(Section, frozen=True):
    """Concurrency limit per upstream: how much is let in at once (the engine's effective batch)."""

    kind: Annotated[
        Literal["fixed", "gradient", "engine_queue"],
        Meta(
            description="fixed: initial_limit always; gradient: adapt to latency (Netflix Gradient2 / Envoy adaptive concurrency), never above what the engine runs without queueing once its gauges are read; engine_queue: the largest limit at which the engine's own waiting queue (vLLM num_requests_waiting, Triton nv_inference_pending_request_count) stays near zero, so every queued request waits in rampmeter, where it is ordered. engine_queue needs the engine's gauges (gpu.upstream_metrics_path or upstreams[].metrics_url) and unit = requests."
        ),
    ] = "gradient"
    unit: Annotated[
        Literal["requests", "tokens"],
        Meta(
            description="What the limit counts: requests, or tokens in flight (prompt + output, a proxy for KV-cache use)."
        ),
    ] = "requests"
    initial_limit: Annotated[int, Meta(ge=1, le=100_000_000, description="Limit at start, in the unit.")] = 32
    min_limit: Annotated[int, Meta(ge=1, le=100_000_000, description="The gradient never goes below this.")] = 4
    max_limit: Annotated[int, Meta(ge=1, le=100_000_000, description="The gradient never goes above this.")] = 256
    target_latency_ms: Annotated[
        float,
        Meta(
            ge=0,
            le=3_600_000,
            description="Latency to hold (per latency_measure); 0: hold the long-term average x tolerance instead.",
        ),
    ] = 0.0
    tolerance: Annotated[
        float,
        Meta(
            ge=1,
            le=100,
            description="Without a target: recent latency may exceed the long-term average by this factor before the limit drops.",
        ),
    ] = 1.5
    smoothing: Annotated[
        float, Meta(gt=0, le=1, description="Fraction of each new estimate taken (lower moves slower).")
    ] = 0.2
    queue_allowance_ratio: Annotated[
        float,
        Meta(
            ge=0,
            le=10,
            description="Growth headroom added each sample, as a fraction of the limit (at least one unit).",
        ),
    ] = 0.1
    backoff_ratio: Annotated[
        float, Meta(gt=0, lt=1, description="Multiplier applied on a dropped request (upstream overload or timeout).")
    ] = 0.9
    short_window_samples: Annotated[int, Meta(ge=1, le=100_000, description="Samples averaged for recent latency.")] = (
        10
    )
    long_window_samples: Annotated[
        int, Meta(ge=2, le=1_000_000, description="Samples averaged for the long-term latency.")
    ] = 600
    engine_target_waiting: Annotated[
        float,
        Meta(
            ge=0,
            le=1024,
            description="engine_queue (and the gradient's ceiling from the engine's gauges): requests kept waiting inside the engine, so it has the next one ready when a sequence ends; the limit follows what the engine runs (and its front end holds) plus this many. Everything beyond waits in rampmeter, where it is ordered.",
        ),
    ] = 2.0
    dispatch_batch: Annotated[
        int,
        Meta(
            ge=1,
            le=4096,
            description="Queued requests leave together, up to this many at a time: while requests wait, freed slots are held until this many are free (or as many as wait, or the whole limit), then all go in one round. Set it to the server's batch size for a batcher that cuts batches by arrival time and runs them one after another (MLServer's adaptive batching: a window from the first arrival, then the batch waits its turn): slots given one by one as answers come back split its batches, and a split never heals, since each fragment's answers let in a fragment of the same size (MLServer behind a limit of 32 fell from batches of 16 to 8, halving throughput). 1: each slot is given as soon as it frees (Triton's dynamic batcher and vLLM form batches when the model is free: leave them at 1). Needs unit = requests.",
        ),
    ] = 1
    latency_measure: Annotated[
        Literal["request_ms", "ms_per_token"],
        Meta(
            description="Latency signal: whole request time, or time per generated token (TPOT-like; per input token for embeddings), which evens out mixed lengths."
        ),
    ] = "ms_per_token"


@cross_check
def check_admission(policy: Policy) -> list[str]:
    """Cross-field rules for the admission sections; one message per problem, naming its key."""
    problems: list[str] = []
    classes = policy.classes
    sched, limits = policy.scheduling, policy.limits
    if sched.default_class not in classes:
        problems.append(
            f"scheduling.default_class: unknown class {sched.default_class!r} (classes: {', '.join(classes)})"
        )
    for name in sched.reserved_slots:
        if name not in classes:
            problems.append(f"scheduling.reserved_slots.{name}: unknown class {name!r} (classes: {', '.join(classes)})")
    if limits.kind == "engine_queue":
        if limits.unit != "requests":
            problems.append("limits.kind: engine_queue follows the engine's request queue; it needs unit = requests")
        if not policy.gpu.upstream_metrics_path and not any(u.metrics_url for u in policy.upstreams):
            problems.append(
                "limits.kind: engine_queue needs the engine's gauges: set gpu.upstream_metrics_path (e.g. /metrics) or upstreams[].metrics_url"
            )
    if limits.dispatch_batch > 1 and limits.unit != "requests":
        problems.append("limits.dispatch_batch: counts requests; it needs unit = requests")
    if limits.min_limit > limits.max_limit:  # the bounds themselves; initial_limit is not the one to blame
        problems.append(
            f"limits.min_limit: {limits.min_limit} is above limits.max_limit ({limits.max_limit}); the gradient moves between them"
        )
    elif not limits.min_limit <= limits.initial_limit <= limits.max_limit:
        problems.append(
            f"limits.initial_limit: must lie within min_limit..max_limit ({limits.min_limit}..{limits.max_limit}), got {limits.initial_limit}"
        )
    for name, cls in classes.items():
        if cls.default_timeout_ms > cls.max_timeout_ms:
            problems.append(
                f"classes.{name}.default_timeout_ms: {cls.default_timeout_ms} exceeds max_timeout_ms ({cls.max_timeout_ms})"
            )
    seen: dict[str, int] = {}
    for i, route in enumerate(policy.routes):
        if route.path_prefix in seen:
            problems.append(f"routes[{i}].path_prefix: {route.path_prefix!r} repeats routes[{seen[route.path_prefix]}]")
        seen.setdefault(route.path_prefix, i)
    return problems
