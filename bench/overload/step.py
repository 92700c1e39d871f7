"""One configuration at one load step, the counters around its measured window, and the latency controls.

Theory of operation: a step is warm-up, the measured window, then a cool-down under
the same load (`Timing`). Both classes' open-loop traces run side by side, each as its
own load-generator target whose timeout is the class's deadline (the client gives up
and disconnects then). When the window opens, the pod's counters and the tap are
reset; when it closes, they and the sidecar's /admin/stats are read (the sidecar's as
a difference from the window's start). Requests sent in the cool-down keep the load
on for everything sent in the window, and are not waited for: once the longest
deadline after the window has passed, the runners are stopped.
"""

from __future__ import annotations

import dataclasses

import httpx
import trio

from bench.overload import SHAPES
from proxy import loadtest as lt
from proxy.loadtest.closed import LEAD_S
from proxy.loadtest.shapes import chat_body
from proxy.loadtest.stats import in_window

CONTROL_RPS = 30.0
CONTROL_PROBES = {
    # Always shed at arrival (a 50 ms budget for ~0.4 s of work: 503 deadline_unmeetable), the pod idle.
    "shed_idle": lt.Shape("shed_probe", "/v1/chat/completions", chat_body(100, 32), cls="interactive", deadline_ms=50),
    # The pod's own 404 (no engine work): what this generator on this machine adds by itself.
    "generator_floor": lt.Shape("floor_probe", "/v1/no-such-route", b"{}"),
}


@dataclasses.dataclass(frozen=True)
class Timing:
    """Warm-up, the measured window, then a cool-down as long as the longest deadline (and a margin)."""

    warmup_s: float
    measured_s: float
    cooldown_s: float = max(s.deadline_ms for s in SHAPES) / 1000 + 0.5

    @property
    def duration_s(self) -> float:
        return self.warmup_s + self.measured_s + self.cooldown_s


def class_traces(loads_x: tuple[float, ...], capacity: float, timing: Timing) -> dict[str, lt.Trace]:
    """One seeded open-loop trace per class, each at its share of every step's rate."""
    total = sum(s.weight for s in SHAPES)
    out = {}
    for seed, shape in enumerate(SHAPES, start=1):
        rates = [round(x * capacity * shape.weight / total, 3) for x in loads_x]
        plan = lt.Plan.sweep(rates, step_s=timing.duration_s, warmup_s=timing.warmup_s)
        out[shape.cls] = lt.build_trace(plan, lt.Mix((shape,)), seed=seed)
    return out


async def _json(client: httpx.AsyncClient, method: str, url: str) -> dict:
    resp = await client.request(method, url)
    resp.raise_for_status()
    return resp.json()


async def idle_pod(client: httpx.AsyncClient, pod_url: str) -> dict:
    """The pod's stats once nothing runs or waits (bounded: work for gone clients is cancelled at once)."""
    with trio.move_on_after(15):
        while True:
            stats = await _json(client, "GET", pod_url + "/sim/stats")
            if stats["running"] == 0 and stats["waiting"] == 0:
                break
            await trio.sleep(0.05)
    return stats


async def _counters(client: httpx.AsyncClient, pod_url: str, admin: str | None, reset: bool) -> dict:
    if reset:
        await _json(client, "POST", pod_url + "/sim/reset-stats")
        await _json(client, "POST", pod_url + "/bench/tap")
    return {
        "pod": await _json(client, "GET", pod_url + "/sim/stats"),
        "tap": await _json(client, "GET", pod_url + "/bench/tap"),
        "sidecar": None if admin is None else await _json(client, "GET", admin + "/admin/stats"),
    }


async def run_step(url: str, admin: str | None, pod_url: str, traces: dict[str, lt.Trace], timing: Timing) -> dict:
    """Both classes' traces at `url`, side by side; the pod's, tap's and sidecar's counters over the window."""
    results: dict[str, lt.RunResult] = {}
    window: dict[str, dict] = {}
    runners = {
        k: lt.Runner(t, lt.Target(url, name=k, timeout_s=t.mix.shapes[0].deadline_ms / 1000), precise=True)
        for k, t in traces.items()
    }
    async with httpx.AsyncClient(timeout=10) as client:
        await idle_pod(client, pod_url)

        async def one(klass: str, runner: lt.Runner) -> None:
            results[klass] = await runner.run()

        async def observe() -> None:
            await trio.sleep(LEAD_S + timing.warmup_s)
            window["start"] = await _counters(client, pod_url, admin, reset=True)
            await trio.sleep(timing.measured_s)
            window["end"] = await _counters(client, pod_url, admin, reset=False)
            await trio.sleep(timing.cooldown_s + 0.1)
            for runner in runners.values():  # requests sent in the cool-down do not count: stop waiting for them
                runner.stop()

        async with trio.open_nursery() as nursery:
            for klass, runner in runners.items():
                nursery.start_soon(one, klass, runner)
            nursery.start_soon(observe)
    for result in results.values():
        for run in result.runs:  # the analysis window is [warm-up, duration): end it where the cool-down starts
            run.duration_s = timing.warmup_s + timing.measured_s
    end = window["end"]
    return {
        "results": results,
        "pod": end["pod"],
        "tap": end["tap"],
        "sidecar": _sidecar_delta(window["start"]["sidecar"], end["sidecar"]),
    }


def _sidecar_delta(before: dict | None, after: dict | None) -> dict | None:
    if before is None or after is None:
        return None
    b, a = before["admission"]["counts"], after["admission"]["counts"]
    rejected = {k: v - b["rejected"].get(k, 0) for k, v in a["rejected"].items()}
    shed_before = before["shedding"]["shed"]
    return {
        "admitted": a["admitted"] - b["admitted"],
        "expired_in_queue": a["expired"] - b["expired"],
        "abandoned_in_queue": a["abandoned"] - b["abandoned"],
        "rejected": {k: v for k, v in rejected.items() if v},
        "shed": {k: v - shed_before.get(k, 0) for k, v in after["shedding"]["shed"].items()},
        "codel": after["shedding"]["codel"],
    }


def wire_summary(result: lt.RunResult) -> lt.Summary | None:
    """Sent -> answer over the measured window (leaves out the generator's lateness in releasing requests)."""
    run = result.runs[0]
    rec = run.records
    return lt.summarize(rec.end[i] - rec.sent[i] for i in in_window(rec, *run.window) if rec.status[i])


async def controls(pod_url: str, full_url: str, seconds: float) -> dict:
    """Shed answers with the pod idle, and the generator alone: the floor the shed figures stand on."""
    out = {}
    for name, shape in CONTROL_PROBES.items():
        url = full_url if name == "shed_idle" else pod_url
        trace = lt.build_trace(lt.Plan.sweep([CONTROL_RPS], step_s=seconds + 1, warmup_s=1), lt.Mix((shape,)), seed=9)
        result = await lt.run(trace, lt.Target(url, name=name, timeout_s=2), precise=True)
        f = result.analyze(lt.SLA()).steps[0].overall
        wire = wire_summary(result)
        out[name] = {
            "rps": CONTROL_RPS,
            "status": f.status,
            "p50_ms": f.latency and f.latency.p50_ms,
            "p99_ms": f.latency and f.latency.p99_ms,
            "wire_p99_ms": wire and wire.p99_ms,
        }
    return out
