"""What a person reads first: the Markdown table and one plot per population.

Theory of operation: `markdown()` renders the medians of each configuration
(population x with/without the sidecar) over repeats, one row each, plus the
setup in words; `plot()` draws, per population, goodput and attempts per second
over time with the fault shaded, without the sidecar above and with it below,
from the first valid repeat of each. matplotlib runs headless (Agg).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after use(): the backend must be chosen first


def _f(value: float | None, digits: int = 2) -> str:
    return "never" if value is None else f"{value:.{digits}f}"


def _span(values: list[float | None], digits: int = 2) -> str:
    known = [v for v in values if v is not None]
    if len(values) < 2:
        return ""
    if not known:
        return ""
    low, high = min(known), max(known)
    missing = "" if len(known) == len(values) else ", never"
    return f" ({_f(low, digits)}-{_f(high, digits)}{missing})"


def markdown(args, setup: dict, summary: dict, load: dict) -> str:
    lines = [
        f"# bench.retry_storm ({'quick' if args.quick else 'full'})",
        "",
        f"`{args.command}`",
        "",
        (
            f"Simulated pod: {setup['pod']}. Offered load {setup['rate_rps']:.1f} req/s "
            f"({setup['load_fraction']:.0%} of capacity), Poisson, the same seeded trace for every run. "
            f"Timeline: {setup['timeline']}. Fault: every engine step {setup['slowdown']:g}x slower "
            f"(POST /sim/faults). Good = 2xx within {setup['sla_s']:g} s of the intended send time. "
            f"{setup['repeats']} repeat(s), medians (min-max). Load average before {load['before']}, "
            f"after {load['after']}. {setup['pinning']}."
        ),
        "",
        "Populations: " + "; ".join(f"**{k}**: {v}" for k, v in setup["populations"].items()) + ".",
        "",
        (
            "| population | sidecar | p99 before ms | attempts per call (run) | during fault "
            "| goodput before | during | after | last 5 s | recovery s | pod executions per call "
            "| sender p99 late ms |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary.values():
        m = s["median"]
        cells = [
            f"{1000 * m['p99_before_s']:.0f}",
            f"{m['amplification']:.2f}{_span(s['all']['amplification'])}",
            _f(m["during_amplification"]),
            f"{m['goodput_before']:.1f}",
            f"{m['goodput_during']:.1f}{_span(s['all']['goodput_during'], 1)}",
            f"{m['goodput_after']:.1f}",
            f"{m['goodput_last']:.1f}{_span(s['all']['goodput_last'], 1)}",
            f"{_f(m['recovery_s'], 1)}{_span(s['all']['recovery_s'], 1)}",
            _f(m["pod_executions_per_call"]),
            f"{1000 * m['lateness_p99_s']:.0f}{'' if s['valid'] else ' (behind)'}",
        ]
        lines.append(f"| {s['population']} | {'yes' if s['sidecar'] else 'no'} | " + " | ".join(cells) + " |")
    lines += [
        "",
        (
            "p99 before: latency of the calls issued before the fault (intended send to end, retries "
            "included). Goodput in req/s, by phase of the intended send time. Recovery: seconds from the "
            "fault's end until requests are again served at >= 90% of the pre-fault success ratio (over "
            'a 2 s window); "never": not within the run. Pod executions per call: requests the pod '
            "started, per logical request (the work the GPU did, retries included). Sender lateness: how "
            'late the generator released calls (p99; over 250 ms the run is flagged "behind": its '
            "figures include the client's own delay). Plots: one PNG per population."
        ),
    ]
    return "\n".join(lines)


def markdown_mixed(setup: dict, mixed: dict, storm: dict) -> str:
    """The mixed workload's table, and the OpenAI SDK's storm figures with and without the new headers."""
    lines = []
    if mixed:
        m = setup["mixed"]
        lines += [
            "## Mixed workload: no deadline, a healthy sidecar",
            "",
            (
                f"Simulated pod: {m['pod']}. {m['rate_rps']:g} req/s Poisson, {1 - m['long_fraction']:.0%} short "
                f"(max_tokens {m['tokens']['short']}) and {m['long_fraction']:.0%} long (max_tokens "
                f"{m['tokens']['long']}), no deadline; {m['timeline']}; the same seeded trace for every population. "
                "Nothing rejects: every failed call is a false failure."
            ),
            "",
            "Populations: " + "; ".join(f"**{k}**: {v}" for k, v in m["populations"].items()) + ".",
            "",
            "| population | calls | false failures per 1,000 | attempts per call | short p99 s | long p99 s | failures |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for name, s in mixed.items():
            md = s["median"]
            failures = "; ".join(", ".join(f"{k} x{v}" for k, v in f.items()) for f in s["failures"] if f) or "none"
            lines.append(
                f"| {name} | {'/'.join(str(c) for c in s['calls'])} | {md['false_failures_per_1000']:.1f}"
                f"{_span(s['all']['false_failures_per_1000'], 1)} | {md['attempts_per_call']:.2f} | "
                f"{_f(md['short_p99_s'])} | {_f(md['long_p99_s'])} | {failures} |"
            )
    with_headers, without = storm.get("openai+sidecar"), storm.get("openai_oldheaders+sidecar")
    if with_headers and without:
        a, b = with_headers["median"], without["median"]
        lines += [
            "",
            "## The plain OpenAI SDK through the storm, with and without the new headers",
            "",
            "| OpenAI SDK sees | attempts per call (run) | during fault | goodput during | last 5 s | recovery s |",
            "|---|---:|---:|---:|---:|---:|",
            f"| retry-after-ms + x-should-retry (now) | {a['amplification']:.2f} | {_f(a['during_amplification'])} | "
            f"{a['goodput_during']:.1f} | {a['goodput_last']:.1f} | {_f(a['recovery_s'], 1)} |",
            f"| retry-after only (before) | {b['amplification']:.2f} | {_f(b['during_amplification'])} | "
            f"{b['goodput_during']:.1f} | {b['goodput_last']:.1f} | {_f(b['recovery_s'], 1)} |",
        ]
    return "\n".join(lines)


def plot(out: Path, population: str, runs: dict[bool, dict], fault_s: float) -> Path:
    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True, sharey=True)
    for ax, sidecar in zip(axes, (False, True), strict=True):
        figures = runs.get(sidecar)
        ax.set_title(f"{population} {'with' if sidecar else 'without'} the sidecar", fontsize=10)
        if figures is None:
            continue
        series = figures["series"]
        fault_at, fault_end = figures["fault_window"]
        ax.axvspan(fault_at, fault_end, color="0.85", label=f"fault ({fault_s:g} s, 3x slower)")
        ax.plot(series["t"], series["offered_rps"], color="0.5", linestyle="--", linewidth=1, label="offered calls/s")
        ax.plot(series["t"], series["attempts_rps"], color="tab:red", label="attempts/s (what the server saw)")
        ax.plot(series["t"], series["goodput_rps"], color="tab:green", label="goodput (good calls/s)")
        recovery = figures["recovery_s"]
        recovered = "never recovered" if recovery is None else f"recovery {recovery:.1f} s"
        ax.text(
            0.01,
            0.95,
            f"attempts per call {figures['amplification']:.2f}, {recovered}",
            transform=ax.transAxes,
            va="top",
            fontsize=9,
        )
        ax.set_ylabel("per second")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8)
    axes[1].set_xlabel("seconds since the trace started (by intended send time; attempts by send time)")
    fig.tight_layout()
    path = out / f"{population}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
