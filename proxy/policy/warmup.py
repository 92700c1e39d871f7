"""Policy for cold start: warm-up probes, readiness, slow start, and GPU signals.

Theory of operation: four tables, composed into `proxy.policy.schema.Policy`:

- `[warmup]`: how the sidecar tells that its model server is up (active health
  checks on an interval, passive failure streaks, restart detection by identity
  keys in the health answer) and how it warms it (`[[warmup.probes]]`: request
  shapes sent up to `count` times each with `concurrency` in flight, until the
  success criterion holds for every shape, or a count or timeout runs out).
- `[readiness]`: what happens to requests that arrive before the model is warm.
- `[slow_start]`: the ramp after warm-up (Envoy slow_start semantics).
- `[gpu]`: the NVML sampler and the optional read of the model server's own
  vLLM-style /metrics.

Cross-field rules are in `check_warmup`, registered with
`proxy.policy.base.cross_check` and run by the loader with every other rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
from msgspec import Meta

from proxy.policy.base import Section, cross_check

if TYPE_CHECKING:
    from proxy.policy.schema import Policy

UrlPath = Annotated[str, Meta(pattern=r"^/[^\s#]*$", description="An absolute request path, e.g. /v1/completions")]


class Probe(Section, frozen=True):
    """One warm-up request shape; use several (short and long prompts, small and large
    outputs) so the kernels for several sizes are compiled before real traffic arrives."""

    name: Annotated[str, Meta(max_length=64, description="Label for logs and /admin/stats; default probe<index>.")] = ""
    method: Annotated[Literal["GET", "POST", "PUT"], Meta(description="HTTP method of the probe.")] = "POST"
    path: Annotated[UrlPath, Meta(description="Request path, appended to the upstream URL.")] = "/v1/completions"
    body: Annotated[
        str, Meta(max_length=16_777_216, description="Inline request body (e.g. JSON). Exclusive with body_file.")
    ] = ""
    body_file: Annotated[
        str,
        Meta(
            max_length=4096,
            description="File holding the request body, read at each warm-up (absolute, or relative to the working directory). Exclusive with body.",
        ),
    ] = ""
    content_type: Annotated[str, Meta(max_length=256, description="Content-Type sent with a body.")] = (
        "application/json"
    )
    grpc: Annotated[
        bool,
        Meta(
            description="A unary gRPC call over h2c instead of an HTTP/1.1 request: path is the method (/inference.GRPCInferenceService/ModelInfer), body_file holds the serialized request message (the sidecar frames it), success is grpc-status 0; method and content_type are not used."
        ),
    ] = False
    count: Annotated[
        int,
        Meta(
            ge=1,
            le=10_000,
            description="Most probes of this shape per warm-up; the success criterion must hold within them.",
        ),
    ] = 8


class Warmup(Section, frozen=True):
    """Health checks, restart detection and warm-up probes, per upstream."""

    health_check: Annotated[
        Literal["http", "grpc"],
        Meta(
            description="http: a GET of health_path (or the discovered one) on HTTP/1.1, healthy on a 2xx; grpc: the standard gRPC health protocol (grpc.health.v1.Health/Check over h2c), healthy when it answers SERVING for grpc_health_service (docs/grpc.md)."
        ),
    ] = "http"
    grpc_health_service: Annotated[
        str,
        Meta(
            max_length=256,
            description="Service name asked by the gRPC health check (health_check = grpc), e.g. inference.GRPCInferenceService; empty: the server as a whole.",
        ),
    ] = ""
    health_port: Annotated[
        int,
        Meta(
            ge=0,
            le=65_535,
            description="Port the health check goes to on the upstream's host when it is not the upstream's own (Triton: HTTP /v2/health/ready on 8000 beside gRPC on 8001); 0: the upstream's port.",
        ),
    ] = 0
    health_path: Annotated[
        str,
        Meta(
            pattern=r"^(/[^\s#]*)?$",
            description="Active health check path; any 2xx is healthy (vLLM and the sim-pod answer 503 while loading). Empty: discover it, trying health_candidates in order (/readyz says which answered).",
        ),
    ] = ""
    health_candidates: Annotated[
        list[UrlPath],
        Meta(
            min_length=1,
            max_length=16,
            description="With health_path empty, the paths tried in order until one answers 2xx (then only it is asked); a 404/405/401/403 moves on, another 4xx or a 5xx means not ready yet.",
        ),
    ] = msgspec.field(
        default_factory=lambda: ["/health", "/healthz", "/v2/health/ready", "/ping", "/v1/models", "/models"]
    )
    health_interval_s: Annotated[float, Meta(ge=0.05, le=3600, description="Seconds between active health checks.")] = (
        2.0
    )
    health_timeout_ms: Annotated[int, Meta(ge=1, le=600_000, description="A health check slower than this failed.")] = (
        1000
    )
    unhealthy_after: Annotated[
        int,
        Meta(
            ge=1,
            le=1000,
            description="Consecutive failed health checks that turn a probing or ready upstream unhealthy (not ready).",
        ),
    ] = 3
    failure_streak: Annotated[
        int,
        Meta(
            ge=1,
            le=100_000,
            description="Consecutive failed requests (connect failure, 5xx) reported by the request path that turn an upstream unhealthy.",
        ),
    ] = 5
    identity_keys: Annotated[
        list[Annotated[str, Meta(min_length=1, max_length=64)]],
        Meta(
            max_length=8,
            description="Keys of the health answer's JSON object that identify the process; a change means a restart, so cold again. Absent keys are ignored.",
        ),
    ] = msgspec.field(default_factory=lambda: ["instance_id", "started_at"])
    probes: Annotated[
        list[Probe], Meta(max_length=64, description="Warm-up request shapes; none: ready as soon as healthy.")
    ] = msgspec.field(default_factory=list)
    concurrency: Annotated[int, Meta(ge=1, le=1024, description="Probes in flight at once during warm-up.")] = 2
    probe_timeout_ms: Annotated[
        int, Meta(ge=1, le=3_600_000, description="One probe slower than this failed (first compiles can be slow).")
    ] = 60_000
    overall_timeout_s: Annotated[
        float,
        Meta(
            gt=0, le=86_400, description="A warm-up not passed within this long failed; the upstream goes back to cold."
        ),
    ] = 600.0
    success: Annotated[
        Literal["stable", "count"],
        Meta(
            description="stable: per shape, the last stable_last_n probes all succeeded and their latencies are within stable_within_pct of each other; count: per shape, min_successes probes succeeded."
        ),
    ] = "stable"
    stable_last_n: Annotated[
        int, Meta(ge=2, le=10_000, description="Probes per shape whose latencies must agree (success = stable).")
    ] = 3
    stable_within_pct: Annotated[
        float,
        Meta(ge=0, le=10_000, description="Greatest allowed spread of those latencies, (max - min) / min, in percent."),
    ] = 25.0
    min_successes: Annotated[
        int, Meta(ge=1, le=10_000, description="Successful probes needed per shape (success = count).")
    ] = 1
    retry_interval_s: Annotated[
        float, Meta(ge=0, le=3600, description="Pause after a failed warm-up before the next attempt.")
    ] = 10.0


class Readiness(Section, frozen=True):
    """What requests get while no upstream is warm."""

    before_warm: Annotated[
        Literal["reject", "hold"],
        Meta(
            description="reject: answer 503 not_ready with Retry-After at once; hold: wait for readiness within the request's deadline and max_hold_ms, then reject."
        ),
    ] = "reject"
    retry_after_ms: Annotated[
        int, Meta(ge=1, le=3_600_000, description="Retry-After sent with not_ready rejections.")
    ] = 5000
    max_hold_ms: Annotated[
        int,
        Meta(ge=0, le=3_600_000, description="Longest a request is held waiting for readiness (before_warm = hold)."),
    ] = 30_000


class SlowStart(Section, frozen=True):
    """Ramp of the admission limit after warm-up: limit x max(min_weight, (t/window)^(1/aggression))."""

    window_s: Annotated[float, Meta(ge=0, le=3600, description="Length of the ramp; 0 turns slow start off.")] = 10.0
    aggression: Annotated[
        float, Meta(gt=0, le=100, description="1: linear; > 1 opens faster early; < 1 holds back longer (as Envoy).")
    ] = 1.0
    min_weight: Annotated[
        float,
        Meta(
            gt=0,
            le=1,
            description="Smallest fraction of the limit allowed during the ramp. Higher than Envoy's 0.1: with one upstream there is no other host to take the traffic, so a low start only queues it (warm-up probes already warmed the model).",
        ),
    ] = 0.5


class Gpu(Section, frozen=True):
    """GPU signals: NVML sampling and the model server's own saturation gauges."""

    enabled: Annotated[
        bool, Meta(description="Sample GPUs with NVML. Without a driver this turns itself off with one log line.")
    ] = True
    sample_interval_s: Annotated[float, Meta(ge=0.05, le=3600, description="Seconds between NVML samples.")] = 2.0
    devices: Annotated[
        list[Annotated[int, Meta(ge=0, le=1023)]],
        Meta(max_length=64, description="GPU indices to watch; empty: every visible GPU."),
    ] = msgspec.field(default_factory=list)
    upstream_metrics_path: Annotated[
        str,
        Meta(
            pattern=r"^(/[^\s#]*)?$",
            description="Path of the upstream's Prometheus metrics (vLLM: /metrics), read for waiting requests and KV-cache usage; empty: off.",
        ),
    ] = ""
    upstream_metrics_interval_s: Annotated[
        float, Meta(ge=0.05, le=3600, description="Seconds between reads of the upstream's metrics.")
    ] = 2.0
    upstream_metrics_timeout_ms: Annotated[
        int, Meta(ge=1, le=600_000, description="A metrics read slower than this failed.")
    ] = 1000


@cross_check
def check_warmup(policy: Policy) -> list[str]:
    """Rules relating [warmup] keys to each other, one message per violation."""
    w: Warmup = policy.warmup
    problems = []
    if w.grpc_health_service and w.health_check != "grpc":
        problems.append('warmup.grpc_health_service is only asked by health_check = "grpc"; set that, or drop it')
    for i, probe in enumerate(w.probes):
        where = f"warmup.probes[{i}]"
        if probe.body and probe.body_file:
            problems.append(f"{where}: body and body_file are exclusive; set one")
        if w.success == "stable" and probe.count < w.stable_last_n:
            problems.append(
                f"{where}.count = {probe.count} can never give warmup.stable_last_n = {w.stable_last_n} stable latencies"
            )
        if w.success == "count" and probe.count < w.min_successes:
            problems.append(f"{where}.count = {probe.count} can never give warmup.min_successes = {w.min_successes}")
    return problems
