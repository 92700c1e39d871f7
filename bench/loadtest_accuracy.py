"""Is `rampmeter loadtest` right, and how fast can it go? Knee accuracy and the generator's ceiling.

1. Accuracy: the simulated pod's "fixed" profile at half speed has a capacity we
   can compute (32 slots / (10 steps x 20 ms) = 160 req/s, a lone request 200 ms).
   An open-loop sweep from 0.5x to 1.2x that capacity (HTTP/1.1 and h2c
   interleaved step by step on one seeded trace) must find a knee (SLA p99 <=
   2.5 x the lone latency) within 10% of it. Steps count as invalid past 25 ms
   of sender lateness (5% of the SLA, the scale of what is measured here) rather
   than the CLI's default 10 ms, so a busy shared machine does not void them.
2. Ceiling: against nginx `return 200` (a trivial upstream), rising open-loop
   rates of the `tiny` request over HTTP/1.1 and h2c (interleaved per rate); the
   ceiling is the highest rate that a majority of its repeats sustained: step
   valid (sender p99 lateness <= 10 ms, no in-flight cap), every request
   answered 2xx, responses keeping up with arrivals. Also reported: requests per CPU-second of the generator,
   the rate one whole core would sustain (robust to a noisy shared machine).

Pinning: the pod / nginx on CPU 0, this process (the generator) on CPU 1.
Usage: python -m bench.loadtest_accuracy [--quick] [--out DIR]
"""

from __future__ import annotations

import statistics
import time

import trio

from bench.common import Nginx, parse_args, pin, target, write_result
from proxy import loadtest as lt
from proxy.loadtest import report
from proxy.loadtest.outputs import write_outputs
from proxy.simpod.profiles import get_profile
from proxy.testing.procs import Proc

SPEED = 0.5
ACCURACY_LATENESS_MS = 25.0
PROTOCOLS = ("http1", "h2c")
FULL_FRACTIONS = (0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2)
QUICK_FRACTIONS = (0.7, 0.85, 0.9, 0.95, 1.0, 1.1, 1.25)
FULL_RATES = (1000, 1500, 2000, 2250, 2500, 3000, 3500, 4000)
QUICK_RATES = (1000, 2000, 2500, 3000)


def accuracy(args) -> dict:
    profile = get_profile("fixed", speed=SPEED)
    capacity = profile.fixed_capacity_rps()
    lone_ms = profile.fixed_steps * profile.base_ms / SPEED
    sla = lt.SLA.parse(f"p99={2.5 * lone_ms:g}ms")
    fractions = QUICK_FRACTIONS if args.quick else FULL_FRACTIONS
    step_s, warmup_s = (4.0, 1.0) if args.quick else (10.0, 2.0)
    plan = lt.Plan.sweep([round(capacity * f, 3) for f in fractions], step_s=step_s, warmup_s=warmup_s)
    trace = lt.build_trace(plan, lt.Mix.parse("short_chat"), seed=1)
    pod_args = ["sim-pod", "--listen", "127.0.0.1:0", "--profile", "fixed", "--speed", str(SPEED)]
    with Proc(pod_args, cpu=0, name="sim-pod") as pod:
        targets = [lt.Target(pod.url(), protocol=p, name=f"sim-pod {p}", timeout_s=30) for p in PROTOCOLS]
        results = trio.run(lambda: lt.run_interleaved(trace, targets))
    out = {
        "capacity_rps": capacity,
        "lone_latency_ms": lone_ms,
        "sla": sla.describe(),
        "step_s": step_s,
        "max_lateness_ms": ACCURACY_LATENESS_MS,
        "warmup_s": warmup_s,
        "fractions": list(fractions),
        "protocols": {},
    }
    for proto, result in zip(PROTOCOLS, results, strict=True):
        analysis = result.analyze(sla, max_lateness_ms=ACCURACY_LATENESS_MS)
        doc = report.document(result, analysis, command=args.command)
        write_outputs(doc, f"{args.out}/accuracy_{proto}")
        knee = analysis.knee.load
        out["protocols"][proto] = {
            "knee_rps": knee,
            "knee_error_pct": None if knee is None else abs(knee - capacity) / capacity * 100,
            "valid": analysis.valid,
            "summary": analysis.knee.summary,
            "steps": [
                {
                    "load": s.load,
                    "p99_ms": s.overall.latency.p99_ms if s.overall.latency else None,
                    "achieved_rps": s.overall.achieved_rps,
                    "goodput_rps": s.overall.goodput_rps,
                    "valid": s.valid,
                    "within_sla": s.verdict.within_sla,
                }
                for s in analysis.steps
            ],
        }
    return out


def _one_rate(trace, url: str, proto: str) -> dict:
    cpu0 = time.process_time()
    result = trio.run(lambda: lt.run(trace, lt.Target(url, protocol=proto, timeout_s=10)))
    cpu_s = time.process_time() - cpu0
    step = result.analyze(lt.SLA()).steps[0]
    f = step.overall
    sent = sum(len(r.records) for r in result.runs)
    kept_up = f.achieved_rps >= 0.97 * f.offered_rps
    return {
        "rate": step.load,
        "offered_rps": f.offered_rps,
        "achieved_rps": f.achieved_rps,
        "ok": f.ok,
        "requests": f.requests,
        "valid": step.valid,
        "invalid_reasons": list(step.invalid_reasons),
        "lateness_p99_ms": step.lateness.p99_ms if step.lateness else None,
        "latency_p50_ms": f.latency.p50_ms if f.latency else None,
        "latency_p99_ms": f.latency.p99_ms if f.latency else None,
        "cpu_s": cpu_s,
        "wall_s": result.wall_s,
        "cpu_share": cpu_s / result.wall_s,
        "requests_per_cpu_s": sent / cpu_s if cpu_s else None,
        "sustained": step.valid and f.ok == f.requests and kept_up,
    }


def ceiling(args) -> dict:
    rates = QUICK_RATES if args.quick else FULL_RATES
    repeats = 1 if args.quick else 3
    step_s, warmup_s = (2.0, 0.5) if args.quick else (4.0, 1.0)
    mix = lt.Mix.parse("tiny")
    out: dict = {"rates": list(rates), "repeats": repeats, "step_s": step_s, "protocols": {p: [] for p in PROTOCOLS}}
    failures = dict.fromkeys(PROTOCOLS, 0)
    with Nginx(cpu=0) as nginx:
        urls = {"http1": nginx.h1_url, "h2c": nginx.h2_url}
        for rate in rates:
            for rep in range(repeats):
                trace = lt.build_trace(lt.Plan.sweep([rate], step_s=step_s, warmup_s=warmup_s), mix, seed=rep)
                for proto in PROTOCOLS:  # interleaved: drift hits both alike
                    if failures[proto] >= 2 * repeats:
                        continue  # two rates in a row failed: higher ones will too
                    row = _one_rate(trace, urls[proto], proto) | {"repeat": rep}
                    out["protocols"][proto].append(row)
                    failures[proto] = 0 if row["sustained"] else failures[proto] + 1
    for proto, rows in out["protocols"].items():
        sustained = [r["rate"] for r in rows if r["sustained"]]
        per_rate = {}
        for r in rows:
            per_rate.setdefault(r["rate"], []).append(r["sustained"])
        clean = [rate for rate, oks in per_rate.items() if sum(oks) * 2 > len(oks)]  # a majority of repeats
        cpu = [r["requests_per_cpu_s"] for r in rows if r["requests_per_cpu_s"] and r["rate"] >= 1000]
        out[f"{proto}_ceiling_rps"] = max(clean, default=None)
        out[f"{proto}_best_rps"] = max(sustained, default=None)
        out[f"{proto}_requests_per_cpu_s"] = {
            "median": statistics.median(cpu) if cpu else None,
            "min": min(cpu, default=None),
            "max": max(cpu, default=None),
        }
    return out


def markdown(acc: dict, ceil: dict, pinning: str) -> str:
    lines = [
        "# loadtest_accuracy",
        "",
        f"Generator {pinning}; pod and nginx on CPU 0. Machine shared: see loadavg in result.json.",
        "",
        (
            f"## Knee accuracy (fixed profile at speed {SPEED}: capacity {acc['capacity_rps']:g} req/s, "
            f"lone request {acc['lone_latency_ms']:g} ms, SLA {acc['sla']})"
        ),
        "",
        "| protocol | knee req/s | error | valid | summary |",
        "|---|---:|---:|---|---|",
    ]
    for proto, r in acc["protocols"].items():
        err = "-" if r["knee_error_pct"] is None else f"{r['knee_error_pct']:.1f}%"
        lines.append(f"| {proto} | {r['knee_rps']} | {err} | {r['valid']} | {r['summary']} |")
    lines += [
        "",
        "## Generator ceiling against nginx `return 200` (tiny POST, open loop)",
        "",
        (
            "| protocol | rate | repeat | achieved/s | valid | lateness p99 ms | p99 ms | CPU share | req/CPU-s | "
            "sustained |"
        ),
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for proto in PROTOCOLS:
        for r in ceil["protocols"][proto]:
            late = "-" if r["lateness_p99_ms"] is None else f"{r['lateness_p99_ms']:.1f}"
            p99 = "-" if r["latency_p99_ms"] is None else f"{r['latency_p99_ms']:.1f}"
            lines.append(
                f"| {proto} | {r['rate']:g} | {r['repeat']} | {r['achieved_rps']:.0f} | {r['valid']} | {late} "
                f"| {p99} | {r['cpu_share']:.0%} | {r['requests_per_cpu_s']:.0f} | {r['sustained']} |"
            )
    lines += [""]
    for proto in PROTOCOLS:
        cpu = ceil[f"{proto}_requests_per_cpu_s"]
        med = "-" if cpu["median"] is None else f"{cpu['median']:.0f} (min {cpu['min']:.0f}, max {cpu['max']:.0f})"
        lines.append(
            f"- {proto}: ceiling {ceil[f'{proto}_ceiling_rps']} req/s (sustained by most repeats); "
            f"requests per generator CPU-second {med}"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args("loadtest_accuracy", __doc__)
    pinning = pin(1)
    acc = accuracy(args)
    ceil = ceiling(args)
    targets = []
    for proto in PROTOCOLS:
        targets.append(target(f"knee_error_pct_{proto}", acc["protocols"][proto]["knee_error_pct"], "<=", 10.0))
    targets.append(target("ceiling_rps_h2c", ceil["h2c_ceiling_rps"], ">=", 2000.0))
    targets.append(target("ceiling_rps_http1", ceil["http1_ceiling_rps"], ">=", 2000.0))
    cpu = ceil["h2c_requests_per_cpu_s"]["median"]
    targets.append(target("requests_per_cpu_s_h2c", cpu, ">=", 2000.0))
    out = write_result(
        args, {"pinning": pinning, "accuracy": acc, "ceiling": ceil}, targets, markdown(acc, ceil, pinning)
    )
    print((out / "result.md").read_text())


if __name__ == "__main__":
    main()
