"""The scheduling comparison's workload, policies and per-class figures (pure).

Theory of operation: bench/scheduling.py and proxy/testing/demo_scenario.py replay one
seeded trace of chat requests directly at the simulated pod and through
sidecars that differ only in queue order; this module holds what they share.

- Workload (`chat_mix`): 80% `short_chat` / 20% `long_chat`, the load
  generator's shapes, each in `variants` copies whose bodies differ only in the
  OpenAI `user` field. The pod draws a request's true output length from a hash
  of its body (`--stop-mean-tokens`: generation stops early, as real models
  do), so the variants are what gives each request of a class its own length;
  the sidecar's cost estimate (prompt length and max_tokens) cannot tell them
  apart. Figures are grouped by shape name, so all variants of a class pool.
- Oracle (`with_oracle_hints`): each variant carries `x-cost-hint` = its true
  service time at a full batch of `limit` (simpod.workload.oracle: true steps
  and prompt tokens), in units of the oracle route's `ms_per_prompt_token`.
  The oracle's policy routes every path to a `fixed` route with `fixed_tokens = 0`,
  so a hint becomes all prompt tokens (proxy/core/cost.py) and the expected
  service time is base + slope * hint: ordered exactly like the true time while
  the slope stays positive, and in true milliseconds when it keeps its prior.
  The model still learns from the pod's usage (real tokens), so its priors are
  set to the profile's true cost per token and weighted as 100,000 samples;
  the caller checks the slope after the run (`oracle_slope_ok`).
- Policies (`policy_toml`): one class, a fixed concurrency limit, shedding,
  slow start and deadline rejections off, so FCFS, SJF and the oracle differ
  only in the order they admit. The chat route's service-time priors are the
  pod's true per-token costs at a full batch (what an SRE reads off the model
  server; `true_priors=False` keeps the schema defaults, which the online model
  corrects only slowly: docs/admission.md).
- Figures (`class_figures`): mean and p50/p99 latency and goodput per class
  (`short_chat`, `long_chat`) and overall, per step, from the loadtest analysis;
  a request is good when 2xx within its class's SLA.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import msgspec

from proxy.loadtest import SLA, Mix, RunResult, builtin
from proxy.simpod.profiles import Profile
from proxy.simpod.workload import oracle

SHORT, LONG = "short_chat", "long_chat"
CLASSES = (SHORT, LONG)
# Per-class SLA at profile speed 1 (a short answer alone takes ~0.2 s, a long one up to ~3.2 s); divided by speed.
SLA_MS_AT_SPEED_1 = {SHORT: 1_000.0, LONG: 10_000.0}
# Starvation bound at speed 1 (the default interactive class's 10 s); divided by speed.
MAX_QUEUE_WAIT_MS_AT_SPEED_1 = 10_000.0
ORACLE_PRIOR_SAMPLES = 100_000.0

_decode, _encode = msgspec.json.decode, msgspec.json.Encoder(order="sorted").encode


def chat_mix(variants: int = 64, short_share: float = 0.8) -> Mix:
    """The 80/20 short/long chat mix, `variants` distinct bodies per class (see the module doc)."""
    shapes = []
    for name, share in ((SHORT, short_share), (LONG, 1.0 - short_share)):
        base = builtin(name)
        body = _decode(base.body)
        for k in range(variants):
            shapes.append(base.replace(body=_encode(body | {"user": f"u{k}"}), weight=share / variants))
    return Mix(tuple(shapes))


def full_batch_ms(profile: Profile, limit: int) -> float:
    """Wall ms of one decode step with `limit` sequences running (the profile's formula)."""
    return (profile.base_ms + profile.per_seq_ms * limit) * profile.ms_to_s * 1000.0


def oracle_prior(profile: Profile, limit: int) -> tuple[float, float]:
    """(ms_per_prompt_token, ms_per_output_token): the pod's true costs at a full batch of `limit`."""
    return profile.prefill_ms_per_token * profile.ms_to_s * 1000.0, full_batch_ms(profile, limit)


def oracle_ms(shape, profile: Profile, seed: int, limit: int) -> float:
    """True service time of `shape` at a full batch of `limit`, wall ms."""
    o = oracle(shape.path, shape.body, profile, seed)
    per_prompt, per_step = oracle_prior(profile, limit)
    return o.steps * per_step + o.prompt_tokens * per_prompt


def mean_output_tokens(mix: Mix, profile: Profile, seed: int) -> float:
    """Output tokens a request of `mix` truly generates, on average (weights as the trace draws them)."""
    total = sum(mix.weights)
    return sum(s.weight * oracle(s.path, s.body, profile, seed).output_tokens for s in mix.shapes) / total


def with_oracle_hints(mix: Mix, profile: Profile, seed: int, limit: int) -> Mix:
    """`mix` with x-cost-hint = true service time in units of the oracle route's prompt slope."""
    per_prompt, _ = oracle_prior(profile, limit)
    return Mix(
        tuple(s.replace(cost_hint=max(1, round(oracle_ms(s, profile, seed, limit) / per_prompt))) for s in mix.shapes)
    )


def sla_ms(profile: Profile) -> dict[str, float]:
    return {k: v * profile.ms_to_s * 1000.0 for k, v in SLA_MS_AT_SPEED_1.items()}


def policy_toml(
    order: str,
    limit: int,
    profile: Profile,
    *,
    aging_ms_per_s: float = 250.0,
    max_queue_wait_ms: float | None = None,
    oracle_route: bool = False,
    true_priors: bool = True,
) -> str:
    """A sidecar policy that differs between configurations only in `order` (and the oracle's route).

    `max_queue_wait_ms` defaults to 10 s at profile speed 1, scaled by speed like every service time."""
    wait_ms = (
        max_queue_wait_ms if max_queue_wait_ms is not None else MAX_QUEUE_WAIT_MS_AT_SPEED_1 * profile.ms_to_s * 1000
    )
    lines = [
        "# Generated by proxy.testing.scheduling.policy_toml: only the queue order differs between runs.",
        "[warmup]",
        "health_interval_s = 0.5",
        "[slow_start]",
        "window_s = 0.0  # full limit at once: the comparison starts warm",
        "[gpu]",
        "enabled = false",
        "[shedding]",
        "rules = []  # nobody is turned away: only the order differs",
        "[dedup]",
        "enabled = false",
        "[scheduling]",
        f'order = "{order}"',
        f"aging_ms_per_s = {aging_ms_per_s:g}",
        'default_class = "chat"',
        "[classes.chat]",
        "max_queue_length = 1000000",
        f"max_queue_wait_ms = {max(1, round(wait_ms))}",
        "default_timeout_ms = 600000",
        "max_timeout_ms = 600000",
        'on_unmeetable = "try"',
        "[limits]",
        'kind = "fixed"',
        'unit = "requests"',
        f"initial_limit = {limit}",
        "min_limit = 1",
        f"max_limit = {max(limit, 256)}",
    ]
    per_prompt, per_output = oracle_prior(profile, limit)
    if oracle_route:
        lines[lines.index("[classes.chat]") : lines.index("[classes.chat]")] = [
            f"model_prior_samples = {ORACLE_PRIOR_SAMPLES:g}  # the true costs, so the hint's slope stays",
        ]
        lines += [
            "[[routes]]",
            'path_prefix = "/"',
            'kind = "fixed"',
            "fixed_tokens = 0  # the hint is all prompt",
            "by_shape = false  # not costed as chat: the hint is the whole cost",
        ]
    elif true_priors:
        lines += ["[[routes]]", 'path_prefix = "/v1/chat/completions"', 'kind = "chat"']
    else:
        return "\n".join(lines) + "\n"
    lines += ["base_ms = 0.0", f"ms_per_prompt_token = {per_prompt:.9g}", f"ms_per_output_token = {per_output:.9g}"]
    return "\n".join(lines) + "\n"


def oracle_slope_ok(admin_stats: dict) -> tuple[bool, float | None]:
    """Did the oracle's service model keep a positive prompt slope (so hints order exactly)?"""
    model = admin_stats.get("admission", {}).get("models", {}).get("/")
    slope = None if model is None else model.get("ms_per_prompt_token")
    return slope is not None and slope > 0, slope


def class_figures(result: RunResult, sla: dict[str, float]) -> list[dict]:
    """Per step: load, and per class and overall {requests, mean, p50, p99, goodput_rps, ok}."""
    per_class = {k: result.analyze(SLA(((99.0, ms / 1000.0),))) for k, ms in sla.items()}
    plain = result.analyze(SLA())
    steps = []
    for i, step in enumerate(plain.steps):
        row: dict = {"load": step.load, "valid": step.valid, "invalid_reasons": list(step.invalid_reasons)}
        good = 0.0
        for k in CLASSES:
            f = per_class[k].steps[i].by_shape.get(k)
            row[k] = _figures(f)
            good += row[k]["goodput_rps"] if f else 0.0
        row["all"] = _figures(step.overall) | {"goodput_rps": good}
        steps.append(row)
    return steps


def _figures(f) -> dict:
    if f is None or f.latency is None:
        return {"requests": 0, "ok": 0, "mean_ms": None, "p50_ms": None, "p99_ms": None, "goodput_rps": 0.0}
    lat = f.latency
    return {
        "requests": f.requests,
        "ok": f.ok,
        "mean_ms": lat.mean_ms,
        "p50_ms": lat.p50_ms,
        "p99_ms": lat.p99_ms,
        "goodput_rps": f.goodput_rps,
        "achieved_rps": f.achieved_rps,
    }
