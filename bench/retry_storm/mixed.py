"""The mixed workload: 80% short and 20% long chats, no deadline, a healthy sidecar. False failures per 1,000 calls.

Theory of operation: a fault-free companion to the storm. Every chat app mixes short
answers with long generations, and callers mostly set no deadline. Here nothing is
wrong: the simulated pod (llm profile, real time) runs far below capacity behind a
sidecar that rejects nothing (bench/policies/retry_storm_mixed.toml), so every call
should succeed. A call that does not (a timeout, a local refusal, an error) is a
*false failure*: the client's own doing. Before issue 14, client_sdk cut a long
call's attempts at the timeout hint that short calls had set, and failed it.

The trace is open loop, Poisson at `RATE_RPS`, each call short (max_tokens
`SHORT_TOKENS`, ~0.1 s) or long (`LONG_TOKENS`, ~4 s) by a seeded draw, the same for
every population: sdk_nodeadline (client_sdk.AsyncClient), openai_defaults (the plain OpenAI
SDK as it comes) and openai_sdk (the OpenAI SDK over client_sdk's transport, the README's set-up).
Each runs on fresh processes, interleaved within a repeat. Calls released in the
warm-up are not counted.
"""

from __future__ import annotations

import json
import random
import statistics as stats
from array import array
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import trio

from bench.common import cpu_seconds
from bench.retry_storm.populations import MIXED_POPULATIONS, Call, Recorder
from bench.retry_storm.scenario import RunSpec, _own_cpu_s, processes, read_pod, read_rejections

POLICY = Path(__file__).resolve().parents[1] / "policies" / "retry_storm_mixed.toml"
PATH = "/v1/chat/completions"
RATE_RPS = 8.0
LONG_FRACTION = 0.2
SHORT_TOKENS, LONG_TOKENS = 16, 600
PROMPT = "Summarise the plot of a novel you like in a few sentences. " * 3


@dataclass(frozen=True)
class LlmPod:
    """The llm profile in real time: ~6.5 ms a decode step at this load, 64 sequences at once."""

    speed: float = 1.0

    def args(self) -> list[str]:
        return ["--profile", "llm", "--speed", f"{self.speed:g}"]


@dataclass(frozen=True)
class MixedTimeline:
    warmup_s: float
    measure_s: float

    @property
    def total_s(self) -> float:
        return self.warmup_s + self.measure_s


FULL = MixedTimeline(warmup_s=5.0, measure_s=60.0)
QUICK = MixedTimeline(warmup_s=3.0, measure_s=20.0)


def body(max_tokens: int) -> bytes:
    chat = {"model": "sim-llm", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens}
    return json.dumps(chat).encode()


def trace(seed: int, timeline: MixedTimeline) -> list[tuple[float, str]]:
    """(intended offset, "short" | "long") per call: Poisson arrivals, a seeded kind for each."""
    rng = random.Random(seed)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(RATE_RPS)
        if t >= timeline.total_s:
            return out
        out.append((t, "long" if rng.random() < LONG_FRACTION else "short"))


async def drive(spec: RunSpec, url: str, planned: list[tuple[float, str]]) -> tuple[list[Call], dict]:
    recorder = Recorder(trio.current_time() + 0.2)
    bodies = {"short": body(SHORT_TOKENS), "long": body(LONG_TOKENS)}
    population = MIXED_POPULATIONS[spec.population](url, PATH, bodies["short"], recorder)
    calls: list[Call] = []
    lateness = array("d")
    facts: dict = {}
    try:
        async with trio.open_nursery() as nursery:
            for offset, kind in planned:
                await trio.sleep_until(recorder.t0 + offset)
                lateness.append(recorder.now() - offset)
                call = Call(offset, bodies[kind], kind)
                calls.append(call)
                nursery.start_soon(population.call, call)
        ordered = sorted(lateness)
        facts["lateness_p99_s"] = ordered[int(0.99 * (len(ordered) - 1))] if ordered else 0.0
    finally:
        with trio.CancelScope(shield=True):
            if hasattr(population, "statistics"):
                facts["client"] = population.statistics()
            await population.aclose()
    return calls, facts


def _p99(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[int(0.99 * (len(ordered) - 1))] if ordered else None


def figures(calls: list[Call], facts: dict, timeline: MixedTimeline) -> dict:
    measured = [c for c in calls if c.intended >= timeline.warmup_s]
    failed = [c for c in measured if not c.ok]
    by_kind = {}
    for kind in ("short", "long"):
        mine = [c for c in measured if c.kind == kind]
        latencies = [c.end - c.intended for c in mine if c.ok and c.end is not None]
        by_kind[kind] = {
            "calls": len(mine),
            "failed": sum(not c.ok for c in mine),
            "p50_s": stats.median(latencies) if latencies else None,
            "p99_s": _p99(latencies),
            "attempts_per_call": sum(c.attempts for c in mine) / max(1, len(mine)),
        }
    return {
        "calls": len(measured),
        "false_failures": len(failed),
        "false_failures_per_1000": 1000.0 * len(failed) / max(1, len(measured)),
        "attempts_per_call": sum(c.attempts for c in measured) / max(1, len(measured)),
        "by_kind": by_kind,
        "failures": dict(Counter(f"{c.kind}: {c.outcome}" for c in failed).most_common()),
        **facts,
    }


def run(spec: RunSpec, timeline: MixedTimeline, planned, cpus: dict[str, int | None]) -> dict:
    with processes(spec, LlmPod(), cpus, POLICY) as (url, pod_url, admin, pids):
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        before["client"] = _own_cpu_s()
        calls, facts = trio.run(drive, spec, url, planned)
        facts["cpu_s"] = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
        facts["cpu_s"]["client"] = _own_cpu_s() - before["client"]
        facts["pod"] = read_pod(pod_url)
        facts["sidecar_rejections"] = read_rejections(admin)
    fig = figures(calls, facts, timeline)
    fig["spec"] = {"population": spec.population, "sidecar": spec.sidecar}
    return fig
