"""The cases the benchmark runs on each server, direct and through rampmeter, on one seeded trace.

Theory of operation: every case is one load-generator step (proxy.loadtest)
built once and replayed against each target in turn, direct then sidecar,
`repeats` times (A B A B): drift on a shared machine hits both alike. The
first WARMUP_SHARE of each run is not measured (why: at WARMUP_SHARE). Before
each run the server is let go idle; after it, `backend_busy_after_s` measures
how long the server kept working once the load had stopped (orphaned work that
nobody waits for any more). Clients give up at their deadline
(`x-request-timeout-ms` and the client timeout are the same budget: the
calibrated policy's default-class budget), so "good" means 2xx within it.

- closed: 2 x the calibrated limit users, closed loop: a load the backend serves
  within the deadlines, which rampmeter must not shed (target: 0 sheds);
- overload: open loop at 2 x the capacity measured in the closed case (the
  direct run's throughput): goodput through rampmeter >= direct's, backend
  work after the load <= 1 s;
- same_throughput (vLLM): open loop at 0.9 x the server's open-loop capacity
  with the 80/20 mix: short requests' p50 direct / through rampmeter >= 2 at
  (about) the same throughput. The capacity is `saturated_rps` of the direct
  overload runs: the answers per second the server gave while 2 x the closed
  loop's rate was offered to it, i.e. while its own queue never emptied. The
  closed loop's throughput is no capacity: its users wait for their answers, so
  the engine idles between an answer and the next request (vLLM's closed loop
  of 16 ran 5.3-7.2 of its 8 sequences), and 0.9 x of it was below capacity in
  one run and past it in another (realcal2: the sidecar's queue 0.0 and 11.9).

While each run goes, `Sampler` reads the engine's own gauges (vLLM's running
and waiting requests) and, through the sidecar, its limit, in-flight count and
queue from /admin/stats, every SAMPLE_S (the stats every other time): the run's own record of where
requests waited (inside the engine, FCFS, or in rampmeter, ordered). After a
sidecar run its /admin/stats latency section (queue and service time per cost
bucket, cumulative) is kept with the run's figures.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
import trio

from bench.common import SHED_REASONS, cpu_seconds
from bench.real_servers.servers import ServerSpec, backend_busy_after_s, wait_idle
from proxy import loadtest as lt
from proxy.calibrate.measure import parse_gauges
from proxy.loadtest.records import StepRun

# Share of each run that is warm-up (not measured), for both targets alike. The sidecar reads the
# engine's gauges during the direct runs too: direct's queue inside vLLM cuts its engine_queue limit to
# what the engine runs (8), and it climbs back one request per reading (1 s) to the 11-12 that fill
# the engine past vLLM's front end. With a 2 s warm-up the sidecar spent most of a 10 s run below
# that, the engine running 4.7 of 8 while requests queued in the sidecar (2026-12-01-realcal3/run1).
# A sidecar that is the engine's only client is never cut so; the window starts once it recovered.
WARMUP_SHARE = 0.3
SAMPLE_S = 0.5  # vLLM gauges; the sidecar's /admin/stats every other reading (it costs the sidecar CPU)


@dataclass(frozen=True)
class Case:
    name: str
    plan: lt.Plan
    mix: lt.Mix


def warmup_s(duration_s: float) -> float:
    """Seconds of each run before its measured window (see WARMUP_SHARE)."""
    return WARMUP_SHARE * duration_s


def closed_case(spec: ServerSpec, model: str | None, limit: int, budget_ms: int, duration_s: float) -> Case:
    users = max(4, 2 * limit)
    plan = lt.Plan((lt.Step(users, duration_s, warmup_s=warmup_s(duration_s)),), mode="closed")
    return Case("closed", plan, lt.Mix(spec.shapes(model, budget_ms)))


def open_case(name: str, spec: ServerSpec, model: str | None, rps: float, budget_ms: int, duration_s: float) -> Case:
    plan = lt.Plan((lt.Step(rps, duration_s, warmup_s=warmup_s(duration_s)),), mode="open")
    return Case(name, plan, lt.Mix(spec.shapes(model, budget_ms)))


def run_case(
    case: Case,
    spec: ServerSpec,
    model: str | None,
    targets: dict[str, tuple[str, int | None]],
    budget_ms: int,
    admin: str | None,
    probe_alone_ms: float,
    repeats: int,
    seed: int,
) -> dict[str, list[dict]]:
    """{target name: [figures per repeat]}; targets: name -> (url, pid whose CPU is counted, or None)."""
    trace = lt.build_trace(case.plan, case.mix, seed=seed)
    out: dict[str, list[dict]] = {name: [] for name in targets}
    for _ in range(repeats):
        for name, (url, pid) in targets.items():
            wait_idle(spec, model, probe_alone_ms)
            cpu0 = cpu_seconds(pid) if pid else None
            target = lt.Target(url, name=name, timeout_s=budget_ms / 1000.0, max_in_flight=2048, check_json=False)
            sampler = Sampler(spec.url + "/metrics" if spec.gauges else None, admin if pid else None)
            t0 = time.monotonic()
            result = trio.run(sampler.run, trace, target)
            wall = time.monotonic() - t0
            cpu = cpu_seconds(pid) - cpu0 if pid else None  # the run only, not the wait for the backend below
            busy = backend_busy_after_s(spec, model, probe_alone_ms)
            row = figures(result, busy, wall, cpu)
            row["sampled"] = sampler.summary()
            if pid and admin:
                row["admin_latency"] = _admin(admin).get("latency")
            out[name].append(row)
    return out


def _admin(admin: str) -> dict:
    try:
        return httpx.get(admin + "/admin/stats", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return {}


@dataclass
class Sampler:
    """Engine gauges and the sidecar's limit / in flight / queue while one run goes (see the module doc)."""

    metrics_url: str | None
    admin_url: str | None
    rows: list[dict] = field(default_factory=list)
    _t0: float = 0.0

    async def run(self, trace: lt.Trace, target: lt.Target) -> lt.RunResult:
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client, trio.open_nursery() as nursery:
            if self.metrics_url or self.admin_url:
                nursery.start_soon(self._poll, client)
            result = await lt.run(trace, target)
            nursery.cancel_scope.cancel()
        return result

    async def _poll(self, client: httpx.AsyncClient) -> None:
        self._t0 = trio.current_time()
        n = 0
        while True:
            row: dict = {"t": round(trio.current_time() - self._t0, 2)}
            n += 1
            try:
                if self.metrics_url:
                    g = parse_gauges((await client.get(self.metrics_url)).text)
                    row["running"] = g.get("vllm:num_requests_running")
                    row["waiting"] = g.get("vllm:num_requests_waiting")
                if self.admin_url and (n % 2 or not self.metrics_url):
                    adm = (await client.get(self.admin_url + "/admin/stats")).json()["admission"]
                    up = adm["upstreams"][0]
                    row |= {"limit": up["limit"], "inflight": up["inflight"], "queued": adm["queued"]}
            except (httpx.HTTPError, ValueError, KeyError, IndexError):
                pass
            if len(row) > 1:
                self.rows.append(row)
            await trio.sleep(SAMPLE_S)

    def summary(self) -> dict:
        out: dict = {"readings": len(self.rows)}
        for key in ("running", "waiting", "limit", "inflight", "queued"):
            values = [r[key] for r in self.rows if r.get(key) is not None]
            if values:
                out[key] = {"mean": statistics.fmean(values), "max": max(values), "min": min(values)}
        waits = [r["waiting"] for r in self.rows if r.get("waiting") is not None]
        if waits:
            out["waiting_share"] = sum(1 for w in waits if w >= 1) / len(waits)
        # While the sidecar held a queue: did the engine run full (the figure the engine_queue limit is for)?
        held = [r for r in self.rows if (r.get("queued") or 0) >= 1 and r.get("running") is not None]
        if held:
            out["running_while_queued"] = statistics.fmean(r["running"] for r in held)
            # ... and did the queue form here, where SJF orders it, rather than inside the engine (FCFS)?
            out["waiting_while_queued"] = statistics.fmean(r.get("waiting") or 0 for r in held)
        # How much of the run the sidecar held a queue at all (SJF has nothing to reorder otherwise).
        queued = [r["queued"] for r in self.rows if r.get("queued") is not None]
        if queued:
            out["queued_share"] = sum(1 for q in queued if q >= 1) / len(queued)
        out["rows"] = self.rows  # the time series, seconds since the run began
        return out


def saturated_rps(runs: Sequence[StepRun]) -> float | None:
    """2xx answers per second that ended inside the measured window (warm-up to the end of the offering).

    Offered more than it can serve (the overload case), the server's queue never empties in that window,
    so this is its open-loop capacity for the mix: the rate the same_throughput case takes 0.9 x of.
    Answers that end after the offering stopped are the backlog, not the rate, and are not counted.
    """
    done = 0
    span = 0.0
    for run in runs:
        lo, hi = run.window
        rec = run.records
        done += sum(1 for i, end in enumerate(rec.end) if lo <= end < hi and 200 <= rec.status[i] < 300)
        span += hi - lo
    return done / span if span > 0 else None


def figures(result: lt.RunResult, busy_after_s: float, wall_s: float, cpu_s: float | None) -> dict:
    analysis = result.analyze(lt.SLA())
    step = analysis.steps[0]
    overall = step.overall
    reasons = dict(overall.reasons)
    sheds = sum(n for r, n in reasons.items() if r in SHED_REASONS)
    sent = sum(len(run.records.status) for run in result.runs)
    by_shape = {}
    for label, f in step.by_shape.items():
        by_shape[label] = {
            "requests": f.requests,
            "ok": f.ok,
            "good": f.good,
            "p50_ms": f.latency.p50_ms if f.latency else None,
            "p99_ms": f.latency.p99_ms if f.latency else None,
        }
    return {
        "requests": overall.requests,
        "ok": overall.ok,
        "good": overall.good,
        "offered_rps": overall.offered_rps,
        "achieved_rps": overall.achieved_rps,
        "saturated_rps": saturated_rps(result.runs),
        "goodput_rps": overall.goodput_rps,
        "p50_ms": overall.latency.p50_ms if overall.latency else None,
        "p99_ms": overall.latency.p99_ms if overall.latency else None,
        "status": dict(overall.status),
        "reasons": reasons,
        "errors": dict(overall.errors),
        "sheds": sheds,
        "by_shape": by_shape,
        "backend_busy_after_s": busy_after_s,
        "wall_s": wall_s,
        # The sidecar's CPU over the whole run (warm-up included) per request sent in it, and per second:
        # up to realcal4 it was divided by the measured window's requests only (70 % of the run's) and took in
        # the wait for the backend to go idle after the run, when the sidecar serves nothing.
        "sidecar_cpu_us_per_request": None if cpu_s is None or not sent else cpu_s * 1e6 / sent,
        "sidecar_cpu_ms_per_s": None if cpu_s is None or not wall_s else cpu_s * 1e3 / wall_s,
        "requests_in_run": sent,
    }
