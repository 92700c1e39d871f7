"""Does warm-up protect the first users of a freshly started model? p99 of the first 100 requests vs steady state.

    .venv/bin/python -m bench.coldstart [--quick] [--out DIR]

Theory of operation: each run starts a *fresh* simulated pod that loads for
COLD_START_S (/health 503) and then runs its first COLD_REQUESTS requests up to
COLD_PENALTY times slower, the penalty decaying linearly per executed request
(the sim pod's model of CUDA graphs, kernels and allocators warming up), and a
fresh sidecar in front of it with one of two policies:

- with warm-up: policies/warmup-example.toml (two probe shapes, success =
  "stable": the last 3 probes of each shape within 10 % of each other);
- without warm-up: the same file with its [[warmup.probes]] tables removed, so
  the upstream is ready as soon as /health answers 200.

Users behave like Kubernetes: this process polls /readyz every READY_POLL_S and
starts sending the moment it answers 200 (an open-loop, seeded Poisson trace of
the load generator's short_chat shape at RATE req/s). From the per-request
records: p99 of the first 100 requests (by send order) and the steady-state
p99 of the requests sent after the slow-start window (STEADY_FROM_S), in the
same run, so both see the same machine. The figure is their ratio; the target
is <= 1.5 with warm-up; without warm-up it is reported. Configurations are
interleaved (with, without, with, ...) on the same seeded trace per repeat.
Latencies count from each request's intended send time (no coordinated
omission) and include every answer, 2xx or not; non-2xx answers are counted.

Pinning: the sidecar (the process under test) on CPU 0, the pod and this
process (the generator) on CPU 1, where the machine has two.

Output (default bench/results/coldstart/): result.json (per run: every figure
and the first 100 latencies), result.md, first_requests.png (latency by request
number, repeat 0), policy-without-warmup.toml (the derived policy).
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path

import httpx
import trio

from bench.common import machine, parse_args, pin, target, write_result
from proxy import loadtest as lt
from proxy.policy.load import parse_policy
from proxy.testing.procs import Proc

EXAMPLE_POLICY = Path(__file__).resolve().parent.parent / "policies" / "warmup-example.toml"
SPEED = 2.0  # the llm profile at twice real speed: short_chat takes ~110 ms warm
COLD_START_S, COLD_PENALTY, COLD_REQUESTS = 2.0, 20.0, 10
RATE = 20.0  # req/s, ~2 in flight when warm: inside the slow-start ramp's first limit (8)
FIRST_N = 100
READY_POLL_S = 0.02
STEADY_FROM_S = 14.0  # slow_start.window_s (10 s) plus a margin, from the first request
TARGET_RATIO = 1.5
CONFIGS = ("with_warmup", "without_warmup")


def without_probes(text: str) -> str:
    """The policy text minus every [[warmup.probes]] table (header up to the next table header)."""
    out = re.sub(r"(?ms)^\[\[warmup\.probes\]\]\n.*?(?=^\[)", "", text)
    if parse_policy(out, "without_probes").warmup.probes:
        raise RuntimeError("could not strip [[warmup.probes]] from the example policy")
    return out


def wait_ready(admin_url: str, timeout_s: float = 300.0) -> float:
    """Poll /readyz like a kubelet (faster); returns the monotonic time it first answered 200."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            try:
                if client.get(admin_url + "/readyz").status_code == 200:
                    return time.monotonic()
            except httpx.HTTPError:
                pass
            time.sleep(READY_POLL_S)
    raise RuntimeError(f"{admin_url}/readyz not 200 within {timeout_s}s")


def one_run(policy_file: Path, trace: lt.Trace) -> dict:
    pod_args = [
        "sim-pod",
        "--listen",
        "127.0.0.1:0",
        "--profile",
        "llm",
        "--speed",
        str(SPEED),
        "--cold-start-s",
        str(COLD_START_S),
        "--cold-penalty",
        str(COLD_PENALTY),
        "--cold-penalty-requests",
        str(COLD_REQUESTS),
    ]
    started = time.monotonic()
    with Proc(pod_args, cpu=1, name="sim-pod") as pod:
        car_args = [
            "serve",
            "--policy",
            str(policy_file),
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--upstream",
            pod.url(),
            "--log-level",
            "warning",
        ]
        with Proc(car_args, cpu=0, name="sidecar") as car:
            ready_at = wait_ready(car.url("admin"))
            at_ready = sim_stats(pod)  # ~1 ms: what the first users will meet
            result = trio.run(lambda: lt.run(trace, lt.Target(car.url(), name="sidecar", timeout_s=60)))
    return figures(result) | {
        "ready_after_start_s": ready_at - started,
        "pod_cold_multiplier_at_ready": at_ready["cold_multiplier"],
        "pod_requests_executed_at_ready": at_ready["requests_executed"],
    }


def sim_stats(pod: Proc) -> dict:
    return httpx.get(pod.url() + "/sim/stats", timeout=5, trust_env=False).json()


def figures(result: lt.RunResult) -> dict:
    rows, names = [], result.reasons.names
    for run in result.runs:
        rec = run.records
        rows += [
            (rec.intended[i], rec.end[i] - rec.intended[i], rec.status[i], names[rec.reason[i]])
            for i in range(len(rec))
        ]
    rows.sort()
    t0 = rows[0][0]
    first = rows[:FIRST_N]
    steady = [r for r in rows if r[0] - t0 >= STEADY_FROM_S]
    first_p99, steady_p99 = p99(first), p99(steady)
    return {
        "requests": len(rows),
        "first_n": len(first),
        "steady_n": len(steady),
        "first_p50_ms": p50(first),
        "first_p99_ms": first_p99,
        "first_max_ms": max(r[1] for r in first) * 1000,
        "first_non_2xx": sum(not 200 <= r[2] < 300 for r in first),
        "first_answers": answers(first),
        "steady_p50_ms": p50(steady),
        "steady_p99_ms": steady_p99,
        "steady_non_2xx": sum(not 200 <= r[2] < 300 for r in steady),
        "steady_answers": answers(steady),
        "ratio": first_p99 / steady_p99,
        "first_latencies_ms": [round(r[1] * 1000, 1) for r in first],
        "first_ok": [200 <= r[2] < 300 for r in first],
    }


def answers(rows: list) -> dict[str, int]:
    """Count of answers by status and x-rampmeter-reason: {"200": 97, "503 overloaded": 3}."""
    out: dict[str, int] = {}
    for r in rows:
        key = f"{r[2]} {r[3]}".strip() if r[2] else "no answer"
        out[key] = out.get(key, 0) + 1
    return out


def p99(rows: list) -> float:
    return lt.percentile(sorted(r[1] for r in rows), 99) * 1000


def p50(rows: list) -> float:
    return lt.percentile(sorted(r[1] for r in rows), 50) * 1000


def plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for config, color in zip(CONFIGS, ("tab:blue", "tab:red"), strict=True):
        r = runs[config][0]
        points = list(enumerate(r["first_latencies_ms"], 1))
        ok = [(i, ms) for (i, ms), good in zip(points, r["first_ok"], strict=True) if good]
        bad = [(i, ms) for (i, ms), good in zip(points, r["first_ok"], strict=True) if not good]
        ax.plot(
            *zip(*ok, strict=False),
            ".",
            color=color,
            label=f"{config.replace('_', ' ')}: p99 {r['first_p99_ms']:.0f} ms",
        )
        if bad:
            ax.plot(*zip(*bad, strict=False), "x", color=color, label=f"{config.replace('_', ' ')}: rejected (non-2xx)")
        ax.axhline(r["steady_p99_ms"], color=color, linestyle=":", linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel("user request (send order), from /readyz 200; dotted: steady-state p99")
    ax.set_ylabel("latency ms")
    ax.set_title("First requests to a freshly started pod (repeat 0)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    args = parse_args("coldstart", __doc__)
    pinning = pin(1)
    if pinning != "not pinned":
        pinning = "sidecar on CPU 0, pod and generator on CPU 1"
    repeats, duration_s = (1, 20.0) if args.quick else (3, 25.0)
    out = Path(args.out)
    policies = {"with_warmup": EXAMPLE_POLICY, "without_warmup": out / "policy-without-warmup.toml"}
    policies["without_warmup"].write_text(without_probes(EXAMPLE_POLICY.read_text()))
    load_before = machine()["loadavg_1m"]
    runs: dict[str, list] = {c: [] for c in CONFIGS}
    for rep in range(repeats):
        trace = lt.build_trace(lt.Plan.sweep([RATE], step_s=duration_s), lt.Mix.parse("short_chat"), seed=rep)
        for config in CONFIGS:  # interleaved: drift hits both alike
            runs[config].append(one_run(policies[config], trace) | {"repeat": rep})
    summary = {
        c: {
            "ratio_median": statistics.median(r["ratio"] for r in rs),
            "ratio_min": min(r["ratio"] for r in rs),
            "ratio_max": max(r["ratio"] for r in rs),
        }
        for c, rs in runs.items()
    }
    plot(runs, out / "first_requests.png")
    setup = {
        "speed": SPEED,
        "cold_start_s": COLD_START_S,
        "cold_penalty": COLD_PENALTY,
        "cold_penalty_requests": COLD_REQUESTS,
        "rate_rps": RATE,
        "duration_s": duration_s,
        "first_n": FIRST_N,
        "steady_from_s": STEADY_FROM_S,
        "repeats": repeats,
        "pinning": pinning,
        "policy": str(EXAMPLE_POLICY.relative_to(EXAMPLE_POLICY.parent.parent)),
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": machine()["loadavg_1m"],
    }
    targets = [
        target("first100_p99_over_steady_p99_with_warmup", summary["with_warmup"]["ratio_median"], "<=", TARGET_RATIO)
    ]
    write_result(args, {"setup": setup, "summary": summary, **runs}, targets, markdown(runs, summary, setup))


def not_2xx(answers: dict[str, int]) -> str:
    bad = {k: n for k, n in answers.items() if not k.startswith("2")}
    return ", ".join(f"{n} ({k})" for k, n in sorted(bad.items())) or "0"


def markdown(runs: dict, summary: dict, setup: dict) -> str:
    lines = [
        "# coldstart",
        "",
        (
            f"Fresh sim pod per run (llm profile, speed {setup['speed']:g}; loads {setup['cold_start_s']:g} s, "
            f"then its first {setup['cold_penalty_requests']} requests up to {setup['cold_penalty']:g}x slower). "
            f"Users send short_chat at {setup['rate_rps']:g} req/s (Poisson) from the moment /readyz is 200. "
            f"Steady state: requests sent {setup['steady_from_s']:g} s or more after the first. "
            f"Pinning: {setup['pinning']}; "
            f"load average {setup['loadavg_1m_before']:.2f} before, {setup['loadavg_1m_after']:.2f} after."
        ),
        "",
        (
            "Latencies count from each request's intended send time and include every answer; "
            "rejections are fast, so they are listed beside the percentiles."
        ),
        "",
        (
            "| config | repeat | ready after start s | pod slowdown at ready | first-100 p50 ms | first-100 p99 ms "
            "| first-100 max ms | first-100 not 2xx | steady p99 ms | p99 ratio |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for config in CONFIGS:
        for r in runs[config]:
            lines.append(
                f"| {config} | {r['repeat']} | {r['ready_after_start_s']:.1f} "
                f"| {r['pod_cold_multiplier_at_ready']:.1f}x | {r['first_p50_ms']:.0f} "
                f"| {r['first_p99_ms']:.0f} | {r['first_max_ms']:.0f} | {not_2xx(r['first_answers'])} "
                f"| {r['steady_p99_ms']:.0f} | {r['ratio']:.2f} |"
            )
    lines.append("")
    for config in CONFIGS:
        s = summary[config]
        lines.append(
            f"- {config.replace('_', ' ')}: first-100 p99 / steady p99 = {s['ratio_median']:.2f} "
            f"(median; min {s['ratio_min']:.2f}, max {s['ratio_max']:.2f})"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
