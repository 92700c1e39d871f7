"""Retry storms: naive, fixed-interval, client_sdk and OpenAI SDK callers through a 3x slowdown; and a mixed workload.

    .venv/bin/python -m bench.retry_storm [--quick] [--out DIR] [--repeats N] [--no-pin]
        [--scenarios storm,mixed] [--populations ...] [--mixed-populations ...]

Theory of operation: a simulated pod (`PodShape`: 10 sequences at once, each 10
steps of 20 ms, so 50 req/s of capacity and 200 ms per request) gets an
open-loop Poisson trace at 70% of its capacity; p99 then sits far under the
naive client's 1 s timeout. Mid-run, a fault makes every engine step 3x slower
for 10 s (capacity drops to 16.7 req/s, 600 ms a request). The same trace is
replayed by three client populations (bench/retry_storm/populations.py), each
straight at the pod and through the rampmeter sidecar: six configurations, each
on fresh processes, interleaved within a repeat (naive, naive+sidecar, fixed,
...) so drift on a shared machine hits all alike. Per run: attempts per
logical request, goodput before / during / after the fault and in the last
5 s, the time from the fault's end until goodput is back at 90% of its
pre-fault level, and what the pod executed (analysis.py). A run whose generator
fell behind (p99 release lateness > MAX_LATENESS_S) is flagged, not re-run: a
storm can load the client's own core, and re-running until the generator keeps
up would select the runs without a storm.

The plain OpenAI SDK runs the storm twice through the sidecar: as it is
(`openai`), and seeing only the headers the sidecar sent before it added
`retry-after-ms` and `x-should-retry` (`openai_oldheaders`).

The mixed scenario (bench/retry_storm/mixed.py) is fault-free: 80% short and
20% long chats, no deadline, through a healthy sidecar; every failure there is
a false one.

Pinning (unless --no-pin): pod and sidecar on CPU 0, this process (the
clients) on CPU 1. Targets, for client_sdk with and without the sidecar:
attempts per call <= 1.15 over the run, recovery <= 3 s; in the mixed workload,
0 false failures per 1,000 calls for client_sdk, the plain OpenAI SDK and the
OpenAI SDK over client_sdk's transport.
"""

from __future__ import annotations

import math
import os
import statistics
import time

from bench.common import parse_args, pin, target, write_result
from bench.retry_storm import mixed, report
from bench.retry_storm.analysis import SLA_S, analyze
from bench.retry_storm.populations import MIXED_POPULATIONS, POPULATIONS
from bench.retry_storm.scenario import PodShape, RunSpec, Timeline, run
from proxy import loadtest as lt

POD = PodShape(slots=10, steps=10, step_ms=20.0)
LOAD_FRACTION = 0.7
FULL = Timeline(warmup_s=5.0, before_s=10.0, fault_s=10.0, after_s=20.0)
QUICK = Timeline(warmup_s=2.0, before_s=5.0, fault_s=10.0, after_s=8.0)  # the same 10 s fault
MAX_LATENESS_S = 0.25  # a quarter of the naive timeout: past it a run is flagged "behind"
TARGETS = {"amplification": 1.15, "recovery_s": 3.0, "false_failures_per_1000": 0.0}
MIXED_KEYS = ("false_failures_per_1000", "attempts_per_call", "long_p99_s", "short_p99_s", "lateness_p99_s")
KEYS = (
    "amplification",
    "during_amplification",
    "goodput_before",
    "goodput_during",
    "goodput_after",
    "goodput_last",
    "recovery_s",
    "pod_executions_per_call",
    "lateness_p99_s",
    "p99_before_s",
)


def figures(calls, recorder, facts, timeline: Timeline) -> dict:
    a = analyze(calls, recorder.attempt_times, timeline, facts["fault_at"])
    a.update(facts)
    a["during_amplification"] = a["during"]["amplification"]
    for phase in ("before", "during", "after", "last"):
        a[f"goodput_{phase}"] = a[phase]["goodput_rps"]
    a["p99_before_s"] = a["before"]["p99_latency_s"]
    a["pod_executions_per_call"] = facts["pod"]["requests_executed"] / max(1, len(calls))
    a["valid"] = facts["lateness_p99_s"] <= MAX_LATENESS_S
    return a


def measure(spec: RunSpec, timeline: Timeline, trace, cpus) -> dict:
    shape = trace.mix.shapes[0]
    calls, recorder, facts = run(spec, POD, timeline, trace.steps[0].offsets, shape.path, shape.body, cpus)
    fig = figures(calls, recorder, facts, timeline)
    print(
        f"  {spec.label:14s} attempts/call {fig['amplification']:.2f}  goodput before "
        f"{fig['goodput_before']:.1f} during {fig['goodput_during']:.1f} last {fig['goodput_last']:.1f}  "
        f"recovery {report._f(fig['recovery_s'], 1)}  sender p99 late {1000 * fig['lateness_p99_s']:.0f} ms"
        f"{'' if fig['valid'] else ' (behind)'}",
        flush=True,
    )
    return fig


def _median(values: list[float | None]) -> float | None:
    """Median with "never" (None) counted as infinitely late: None when the median is."""
    median = statistics.median(float("inf") if v is None else v for v in values)
    return None if math.isinf(median) else median


def summarise(raw: dict[str, list[dict]]) -> dict:
    out = {}
    for label, reps in raw.items():
        all_values = {k: [r[k] for r in reps] for k in KEYS}
        out[label] = {
            "population": reps[0]["spec"]["population"],
            "sidecar": reps[0]["spec"]["sidecar"],
            "median": {k: _median(v) for k, v in all_values.items()},
            "all": all_values,
            "valid": all(r["valid"] for r in reps),
        }
    return out


def measure_mixed(spec: RunSpec, timeline, planned, cpus) -> dict:
    fig = mixed.run(spec, timeline, planned, cpus)
    fig["long_p99_s"] = fig["by_kind"]["long"]["p99_s"]
    fig["short_p99_s"] = fig["by_kind"]["short"]["p99_s"]
    print(
        f"  mixed {spec.population:15s} false failures {fig['false_failures']}/{fig['calls']} "
        f"({fig['false_failures_per_1000']:.1f} per 1,000)  attempts/call {fig['attempts_per_call']:.2f}  "
        f"long p99 {report._f(fig['long_p99_s'], 2)} s  {fig['failures'] or ''}",
        flush=True,
    )
    return fig


def summarise_mixed(raw: dict[str, list[dict]]) -> dict:
    return {
        name: {
            "median": {k: _median([r[k] for r in reps]) for k in MIXED_KEYS},
            "all": {k: [r[k] for r in reps] for k in MIXED_KEYS},
            "failures": [r["failures"] for r in reps],
            "calls": [r["calls"] for r in reps],
        }
        for name, reps in raw.items()
    }


def main() -> None:
    def add(p) -> None:
        p.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3, quick 1)")
        p.add_argument("--seed", type=int, default=1, help="seed of the arrival traces")
        p.add_argument("--scenarios", default="storm,mixed", help="comma-separated: storm, mixed")
        p.add_argument("--populations", default=",".join(POPULATIONS), help="storm populations, comma-separated")
        p.add_argument(
            "--mixed-populations", default=",".join(MIXED_POPULATIONS), help="mixed populations, comma-separated"
        )
        p.add_argument("--no-pin", action="store_true", help="leave every process unpinned")

    args = parse_args("retry_storm", __doc__, add)
    args.repeats = args.repeats or (1 if args.quick else 3)
    scenarios = set(args.scenarios.split(","))
    timeline = QUICK if args.quick else FULL
    mixed_timeline = mixed.QUICK if args.quick else mixed.FULL
    two_cpus = (os.cpu_count() or 1) >= 2 and not args.no_pin
    cpus = {"pod": 0, "sidecar": 0} if two_cpus else {"pod": None, "sidecar": None}
    pinning = ("pod and sidecar pinned to CPU 0, clients to CPU 1 (" + pin(1) + ")") if two_cpus else "not pinned"
    rate = LOAD_FRACTION * POD.capacity_rps
    trace = lt.build_trace(lt.Plan.sweep([rate], step_s=timeline.total_s), lt.Mix.parse("short_chat"), args.seed)
    specs = []
    if "storm" in scenarios:
        specs = [RunSpec(p, sidecar) for p in args.populations.split(",") for sidecar in POPULATIONS[p].sidecar_modes]
    mixed_specs = []
    if "mixed" in scenarios:
        mixed_specs = [RunSpec(p, True) for p in args.mixed_populations.split(",")]
    planned = mixed.trace(args.seed, mixed_timeline)
    load = {"before": [round(x, 2) for x in os.getloadavg()]}
    raw: dict[str, list[dict]] = {s.label: [] for s in specs}
    raw_mixed: dict[str, list[dict]] = {s.population: [] for s in mixed_specs}
    started = time.monotonic()
    for rep in range(args.repeats):
        print(f"repeat {rep + 1}/{args.repeats}", flush=True)
        for spec in specs:
            raw[spec.label].append(measure(spec, timeline, trace, cpus))
        for spec in mixed_specs:
            raw_mixed[spec.population].append(measure_mixed(spec, mixed_timeline, planned, cpus))
    load["after"] = [round(x, 2) for x in os.getloadavg()]
    summary = summarise(raw)
    summary_mixed = summarise_mixed(raw_mixed)
    setup = {
        "pod": f"`sim-pod {' '.join(POD.args())}`, capacity {POD.capacity_rps:g} req/s, "
        f"{POD.service_s * 1000:g} ms a request",
        "rate_rps": rate,
        "load_fraction": LOAD_FRACTION,
        "slowdown": timeline.slowdown,
        "sla_s": SLA_S,
        "timeline": f"{timeline.warmup_s:g} s warm-up (not measured), {timeline.before_s:g} s before, "
        f"{timeline.fault_s:g} s fault, {timeline.after_s:g} s after",
        "repeats": args.repeats,
        "pinning": pinning,
        "mix": "short_chat (POST /v1/chat/completions)",
        "populations": {name: cls.describe for name, cls in POPULATIONS.items()},
        "mixed": {
            "pod": f"`sim-pod {' '.join(mixed.LlmPod().args())}`",
            "rate_rps": mixed.RATE_RPS,
            "long_fraction": mixed.LONG_FRACTION,
            "tokens": {"short": mixed.SHORT_TOKENS, "long": mixed.LONG_TOKENS},
            "timeline": f"{mixed_timeline.warmup_s:g} s warm-up (not measured), {mixed_timeline.measure_s:g} s measured",
            "calls_planned": len(planned),
            "populations": {name: cls.describe for name, cls in MIXED_POPULATIONS.items()},
        },
        "wall_s": time.monotonic() - started,
    }
    targets = []
    for sidecar in (False, True):
        label = RunSpec("sdk", sidecar).label
        if label in summary:
            where = "with_sidecar" if sidecar else "without_sidecar"
            m = summary[label]["median"]
            targets.append(target(f"sdk_attempts_per_call_{where}", m["amplification"], "<=", TARGETS["amplification"]))
            targets.append(target(f"sdk_recovery_s_{where}", m["recovery_s"], "<=", TARGETS["recovery_s"]))
    for name in ("sdk_nodeadline", "openai_defaults", "openai_sdk"):
        if name in summary_mixed:
            value = summary_mixed[name]["median"]["false_failures_per_1000"]
            targets.append(
                target(f"mixed_false_failures_per_1000_{name}", value, "<=", TARGETS["false_failures_per_1000"])
            )
    runs = {
        "setup": setup,
        "load_average": load,
        "summary": summary,
        "summary_mixed": summary_mixed,
        "raw": raw,
        "raw_mixed": raw_mixed,
    }
    storm_text = report.markdown(args, setup, summary, load) if summary else f"# bench.retry_storm\n\n`{args.command}`"
    text = storm_text + "\n\n" + report.markdown_mixed(setup, summary_mixed, summary)
    out = write_result(args, runs, targets, text)
    for population in {s.population for s in specs}:
        runs_by_mode = {s.sidecar: raw[s.label][0] for s in specs if s.population == population}
        report.plot(out, population, runs_by_mode, timeline.fault_s)
    print((out / "result.md").read_text())


if __name__ == "__main__":
    main()
