"""Does SJF with aging beat FCFS end to end? Direct, FCFS, SJF+aging and an oracle on one seeded trace.

Setup: the simulated pod's llm profile at --speed 2 with --stop-mean-tokens 200
(outputs stop early, so a request's true length is known only to the pod), an
80/20 mix of the loadtest's short_chat / long_chat shapes (64 bodies per class,
proxy/testing/scheduling.py).

1. Capacity and limit: a closed loop straight at the pod at several
   concurrencies, throughput from the pod's token counter; capacity = the best;
   the limit = the smallest concurrency that delivers >= 90% of it (the batch
   stays efficient, yet a queue can form in the sidecar, where the order is
   decided). `--limit N` forces one.
2. One seeded open-loop Poisson trace per load level (0.7, 0.9, 1.1 x capacity;
   --quick: 1.1 only, shorter steps), replayed at four targets interleaved step
   by step: direct (the pod's own FCFS queue), rampmeter FCFS, rampmeter SJF
   with aging, and the oracle (rampmeter SJF keyed on the true service time,
   sent as x-cost-hint). The sidecars share policy and fixed limit; only the
   order differs. Each sidecar's mean queue wait per step is read from its
   rampmeter_queue_wait_seconds histogram. The full run replays the 1.1 level
   with two more traces (seeds): targets are judged on the median.
3. Per class: mean, p50, p99 latency and goodput (2xx within the class SLA:
   short 500 ms, long 5 s at speed 2). Targets where a queue stands (1.1 x
   capacity: more is offered than the limit lets through, so the order has a
   queue to work on; docs/admission.md shows why at 0.9 little waits and no
   order can meet them): SJF mean latency >= 40% below FCFS; short p99 >= 3x
   lower than FCFS; long p99 <= 1.3x FCFS; SJF mean within 10% of the oracle.
   The same ratios at the other levels. The sidecars run the scheduling
   defaults (aging 100 ms/s, due at 2x the FCFS wait) with max_queue_wait_ms as
   a far backstop.
4. Full run only: FCFS vs SJF at 0.9 load with other limits (how much queue the
   limit leaves in the sidecar decides what the order can do).

Pinning: the pod on CPU 0; the sidecars and this process (the generator) on CPU 1.
Usage: python -m bench.scheduling [--quick] [--out DIR] [--limit N]
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import httpx

from bench.common import parse_args, pin, target, write_result
from proxy.testing import demo_scenario as demo
from proxy.testing import scheduling as sc
from proxy.testing.procs import Proc

SEED = 7
FULL = {
    "users": [16, 24, 32, 40, 48, 64],
    "cap_step_s": 12.0,
    "cap_warmup_s": 3.0,
    "fractions": (0.7, 0.9, 1.1),
    "repeats": 3,
    "step_s": 16.0,
    "warmup_s": 3.0,
    "other_limits": (24, 40),
}
QUICK = {
    "users": [24, 32, 48],
    "cap_step_s": 8.0,
    "cap_warmup_s": 2.0,
    "fractions": (1.1,),
    "repeats": 1,
    "step_s": 12.0,
    "warmup_s": 2.0,
    "other_limits": (),
}
# The smallest concurrency with >= 90% of the best throughput. On the simulated pod the sweep's points sit at
# ~82% (24), ~95% (32) and ~99% (40): a 95% rule would pick 32 or 40 by measurement noise, 90% picks 32.
LIMIT_FRACTION = 0.90
AT = 1.1  # the load level the targets are set at: a queue stands in the sidecar
AGING_MS_PER_S = 100.0  # the schema default
BACKSTOP_MS = 600_000.0  # max_queue_wait_ms far out: the FCFS-relative bound (default 2x) is what acts


class QueueWaits:
    """after_step hook: each sidecar's mean queue wait (ms) per step, from its histogram's sum/count,
    and the machine's 1-minute load average after every configuration's step (a shared machine: a busy
    neighbour slows the simulated pod, which is a Python process, and so the configuration that ran then)."""

    def __init__(self, admin_urls: dict[str, str]) -> None:
        self.urls = admin_urls
        self.last = dict.fromkeys(admin_urls, (0.0, 0.0))
        self.mean_ms: dict[str, list] = {n: [] for n in admin_urls}
        self.loadavg: list[tuple[str, int, float]] = []

    def __call__(self, name: str, index: int) -> None:
        self.loadavg.append((name, index, round(os.getloadavg()[0], 2)))
        if name not in self.urls:
            return
        text = httpx.get(self.urls[name] + "/metrics", timeout=10).text
        total = {
            k: sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(f"rampmeter_queue_wait_seconds_{k}{{")
            )
            for k in ("sum", "count")
        }
        (s0, c0), s, c = self.last[name], total["sum"], total["count"]
        self.last[name] = (s, c)
        self.mean_ms[name].append((s - s0) / (c - c0) * 1000.0 if c > c0 else None)


def measure(args, conf: dict) -> dict:
    profile, mix = demo.demo_profile(), sc.chat_mix()
    run: dict = {
        "profile": {"name": profile.name, "speed": profile.speed, "stop_mean_tokens": profile.stop_mean_tokens},
        "seed": SEED,
        "sla_ms": sc.sla_ms(profile),
        "fractions": list(conf["fractions"]),
        "step_s": conf["step_s"],
        "warmup_s": conf["warmup_s"],
    }
    with Proc(demo.pod_argv(profile, SEED), cpu=0, name="sim-pod") as pod:
        sweep = demo.measure_capacity(
            pod.url(), mix, profile, SEED, conf["users"], conf["cap_step_s"], conf["cap_warmup_s"]
        )
        limit, capacity = demo.choose_limit(sweep, LIMIT_FRACTION)
        limit = args.limit or limit
        loads = [round(f * capacity, 1) for f in conf["fractions"]]
        run |= {
            "capacity_sweep": sweep,
            "capacity_rps": capacity,
            "limit": limit,
            "loads_rps": loads,
            "limit_rule": "--limit" if args.limit else f"the smallest with >= {LIMIT_FRACTION:.0%} of capacity",
        }
        policies = {
            "fcfs": _policy("fcfs", limit, profile),
            "sjf": _policy("sjf", limit, profile),
            "oracle": _policy("sjf", limit, profile, oracle_route=True),
        }
        with demo.sidecars(pod.url(), policies, args.out, cpu=1) as procs:
            targets = {"direct": pod.url(), **{n: p.url() for n, p in procs.items()}}
            mixes = dict.fromkeys(targets, mix) | {"oracle": sc.with_oracle_hints(mix, profile, SEED, limit)}
            waits = QueueWaits({n: p.url("admin") for n, p in procs.items()})
            step = (conf["step_s"], conf["warmup_s"])
            results = demo.compare(targets, mixes, loads, *step, SEED, after_step=waits)
            run["figures"] = {n: sc.class_figures(r, run["sla_ms"]) for n, r in results.items()}
            at = run["fractions"].index(AT)
            reps = [{"seed": SEED, "figures": {n: f[at] for n, f in run["figures"].items()}}]
            for seed in range(SEED + 1, SEED + conf["repeats"]):  # the 0.9 level again, other traces
                again = demo.compare(targets, mixes, [loads[at]], *step, seed, after_step=waits)
                reps.append(
                    {"seed": seed, "figures": {n: sc.class_figures(r, run["sla_ms"])[0] for n, r in again.items()}}
                )
            admin = {n: httpx.get(p.url("admin") + "/admin/stats", timeout=10).json() for n, p in procs.items()}
        waited = waits.mean_ms  # per sidecar: one entry per level, then one per repeat
        run["queue_wait_ms"] = {n: w[: len(loads)] for n, w in waited.items()}
        for k, rep in enumerate(reps):
            rep["queue_wait_ms"] = {n: w[at] if k == 0 else w[len(loads) + k - 1] for n, w in waited.items()}
        run["repeats_at"] = reps
        run["loadavg_after_each_step"] = waits.loadavg
        run["oracle_honest"], run["oracle_slope_ms_per_unit"] = sc.oracle_slope_ok(admin["oracle"])
        run["admission"] = {n: _admission(a) for n, a in admin.items()}
        others = [n for n in conf["other_limits"] if n != limit]
        run["limit_sensitivity"] = [
            _at_limit(args, pod.url(), profile, mix, n, sweep, AT * capacity, conf) for n in others
        ]
        pod_stats = httpx.get(pod.url() + "/sim/stats", timeout=10).json()
    run["pod"] = {k: pod_stats.get(k) for k in ("requests_completed", "loop_late_steps", "loop_lag_s", "busy_s")}
    return run


def _policy(order: str, limit: int, profile, **kw) -> str:
    return sc.policy_toml(order, limit, profile, aging_ms_per_s=AGING_MS_PER_S, max_queue_wait_ms=BACKSTOP_MS, **kw)


def _at_limit(args, pod_url: str, profile, mix, limit: int, sweep: list[dict], load: float, conf: dict) -> dict:
    """FCFS vs SJF at one load with another fixed limit."""
    policies = {o: _policy(o, limit, profile) for o in ("fcfs", "sjf")}
    where = Path(args.out) / f"limit-{limit}"
    where.mkdir(exist_ok=True)
    with demo.sidecars(pod_url, policies, where, cpu=1) as procs:
        waits = QueueWaits({n: p.url("admin") for n, p in procs.items()})
        results = demo.compare(
            {n: p.url() for n, p in procs.items()},
            dict.fromkeys(procs, mix),
            [round(load, 1)],
            conf["step_s"],
            conf["warmup_s"],
            SEED,
            after_step=waits,
        )
    at_limit = next((r["capacity_rps"] for r in sweep if r["users"] == limit), None)
    return {
        "limit": limit,
        "load_rps": round(load, 1),
        "capacity_at_limit_rps": at_limit,
        "figures": {n: sc.class_figures(r, sc.sla_ms(profile)) for n, r in results.items()},
        "queue_wait_ms": waits.mean_ms,
    }


def _admission(stats: dict) -> dict:
    adm = stats["admission"]
    return {"order": adm["order"], "counts": adm["counts"], "limit_total": adm["limit_total"], "models": adm["models"]}


def ratios(f: dict) -> dict:
    """The four compared figures for one load level; f maps configuration -> that level's figures."""

    def r(a, b):
        return None if a is None or b in (None, 0) else a / b

    cut = r(f["sjf"]["all"]["mean_ms"], f["fcfs"]["all"]["mean_ms"])
    out = {
        "mean_latency_cut_sjf_vs_fcfs": None if cut is None else 1 - cut,
        "short_p99_ratio_fcfs_over_sjf": r(f["fcfs"][sc.SHORT]["p99_ms"], f["sjf"][sc.SHORT]["p99_ms"]),
        "long_p99_ratio_sjf_over_fcfs": r(f["sjf"][sc.LONG]["p99_ms"], f["fcfs"][sc.LONG]["p99_ms"]),
    }
    if "oracle" in f:
        out["mean_latency_ratio_sjf_over_oracle"] = r(f["sjf"]["all"]["mean_ms"], f["oracle"]["all"]["mean_ms"])
        out["oracle_long_p99_ratio_over_fcfs"] = r(f["oracle"][sc.LONG]["p99_ms"], f["fcfs"][sc.LONG]["p99_ms"])
    return out


GOALS = {
    "mean_latency_cut_sjf_vs_fcfs": (">=", 0.40),
    "short_p99_ratio_fcfs_over_sjf": (">=", 3.0),
    "long_p99_ratio_sjf_over_fcfs": ("<=", 1.3),
    "mean_latency_ratio_sjf_over_oracle": ("<=", 1.1),
}


# Shown beside the targets, not one: what the oracle pays for its mean (its long answers' p99 against
# FCFS's, the line SJF is held to). The SJF / oracle ratio moves with it, SJF's own mean does not
# (docs/real-servers.md, stop 31: aging and fcfs_wait_multiple at three settings each).
INFO = ("oracle_long_p99_ratio_over_fcfs",)


def repeated_ratios(run: dict) -> dict[str, dict]:
    """Each ratio at the target level over the repeats (the targets', then INFO's): median, min, max, values."""
    per = [ratios(rep["figures"]) for rep in run["repeats_at"]]
    out = {}
    for name in (*GOALS, *INFO):
        values = [p[name] for p in per if p.get(name) is not None]
        out[name] = {
            "median": statistics.median(values) if values else None,
            "min": min(values, default=None),
            "max": max(values, default=None),
            "values": values,
        }
    return out


def targets_at(run: dict) -> list[dict]:
    got = repeated_ratios(run)
    out = [target(name, got[name]["median"], *GOALS[name]) for name in GOALS]
    return out + [target("oracle_slope_positive", 1.0 if run["oracle_honest"] else 0.0, "==", 1.0)]


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def markdown(run: dict, pinning: str) -> str:
    p, cap_l = (
        run["profile"],
        next((r["capacity_rps"] for r in run["capacity_sweep"] if r["users"] == run["limit"]), None),
    )
    lines = [
        "# scheduling",
        "",
        (
            f"Sim pod: llm profile, speed {p['speed']:g}, stop_mean_tokens {p['stop_mean_tokens']:g}, seed "
            f"{run['seed']}; 80% short_chat / 20% long_chat. Generator {pinning}, sidecars on CPU 1, pod on CPU 0. "
            f"Load average at the end: {os.getloadavg()[0]:.2f}."
        ),
        "",
        "## Capacity and limit (closed loop straight at the pod)",
        "",
        "| concurrency | capacity req/s (tokens/s / tokens per request) | completions/s | p50 |",
        "|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['users']} | {r['capacity_rps']:.1f} | {r['completed_rps']:.1f} | {demo._ms(r['p50_ms'])} |"
        for r in run["capacity_sweep"]
    ]
    lines += [
        "",
        (
            f"Capacity {run['capacity_rps']:.1f} req/s; fixed limit {run['limit']} ({run['limit_rule']}; "
            f"{_fmt(cap_l)} req/s at that concurrency), the same for FCFS, SJF and the oracle. SLA: short "
            f"{run['sla_ms'][sc.SHORT]:.0f} ms, long {run['sla_ms'][sc.LONG]:.0f} ms. Steps {run['step_s']:g} s "
            f"({run['warmup_s']:g} s warm-up not measured)."
        ),
    ]
    for i, (frac, load) in enumerate(zip(run["fractions"], run["loads_rps"], strict=True)):
        f = {n: steps[i] for n, steps in run["figures"].items()}
        rho = "" if not cap_l else f", {load / cap_l:.2f} of what the limit lets through"
        waits = ", ".join(f"{n} {_fmt(w[i])} ms" for n, w in run["queue_wait_ms"].items())
        lines += [
            "",
            f"## {frac:g} x capacity = {load:g} req/s{rho}",
            "",
            demo.table(run["figures"], i),
            "",
            f"Mean queue wait in the sidecar: {waits}. Ratios: "
            + ", ".join(f"{k} {_fmt(v)}" for k, v in ratios(f).items()),
        ]
    reps = run["repeats_at"]
    lines += [
        "",
        f"## {AT:g} x capacity over {len(reps)} traces (seeds {', '.join(str(r['seed']) for r in reps)})",
        "",
        "| ratio | median | min | max | target |",
        "|---|---:|---:|---:|---|",
    ]
    for name, r in repeated_ratios(run).items():
        goal = f"{GOALS[name][0]} {GOALS[name][1]:g}" if name in GOALS else "(not a target: the oracle's price)"
        lines.append(f"| {name} | {_fmt(r['median'])} | {_fmt(r['min'])} | {_fmt(r['max'])} | {goal} |")
    waits = ["/".join(_fmt(rep["queue_wait_ms"][n]) for rep in reps) for n in run["queue_wait_ms"]]
    lines += [
        "",
        "Mean queue wait per trace (ms): "
        + ", ".join(f"{n} {w}" for n, w in zip(run["queue_wait_ms"], waits, strict=True)),
        "",
        "Machine load average after each configuration's step (2 CPUs; above 2 the pod may have been "
        "slowed): " + ", ".join(f"{n}#{i} {a:g}" for n, i, a in run["loadavg_after_each_step"]),
    ]
    if run["limit_sensitivity"]:
        lines += [
            "",
            f"## Other limits at {AT:g} x capacity (FCFS vs SJF only)",
            "",
            (
                "| limit | req/s at that concurrency | load / that | FCFS queue wait | mean cut | short p99 FCFS/SJF "
                "| long p99 SJF/FCFS | short p99 FCFS, SJF |"
            ),
            "|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for s in run["limit_sensitivity"]:
            f = {n: steps[0] for n, steps in s["figures"].items()}
            r, c = ratios(f), s["capacity_at_limit_rps"]
            lines.append(
                f"| {s['limit']} | {_fmt(c)} | {_fmt(s['load_rps'] / c if c else None)} | "
                f"{_fmt(s['queue_wait_ms']['fcfs'][0])} ms | {_fmt(r['mean_latency_cut_sjf_vs_fcfs'])} | "
                f"{_fmt(r['short_p99_ratio_fcfs_over_sjf'])} | {_fmt(r['long_p99_ratio_sjf_over_fcfs'])} | "
                f"{demo._ms(f['fcfs'][sc.SHORT]['p99_ms'])}, {demo._ms(f['sjf'][sc.SHORT]['p99_ms'])} |"
            )
    lines += [
        "",
        (
            f"Oracle service-model slope after the run: {run['oracle_slope_ms_per_unit']} ms per hint unit "
            "(positive: the oracle ordered exactly by true service time)."
        ),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    args = parse_args(
        "scheduling",
        __doc__,
        lambda p: p.add_argument("--limit", type=int, help="fixed limit for the sidecars (default: measured)"),
    )
    pinning = pin(1)
    run = measure(args, QUICK if args.quick else FULL)
    targets = targets_at(run)
    demo.plot(
        run["figures"],
        run["sla_ms"],
        f"{args.out}/scheduling.png",
        f"limit {run['limit']}, capacity {run['capacity_rps']:.0f} req/s",
    )
    out = write_result(args, run, targets, markdown(run, pinning) + "\n![p50/p99 by class](scheduling.png)\n")
    print((out / "result.md").read_text())
    print(json.dumps({t["name"]: t["met"] for t in targets}))


if __name__ == "__main__":
    main()
