"""Figures, targets, the Markdown table and the plot of bench/overload.

Theory of operation: `step_figures` turns one raw step (load-generator results per
class, the pod's /sim/stats and tap, the sidecar's counter differences) into the
figures the report shows: goodput (2xx within the request's own deadline, per measured
second, both classes), wasted engine work (wasted / settled engine time in the
window), shed-answer latency (intended send -> answer, and sent -> answer), expired and
doomed forwards (the tap). `targets_for` applies the issue's targets to the full policy
at TARGET_LOAD x capacity. Peak goodput, for a row at load L, is the best goodput any
configuration reached at any load up to L: the goodput curve's peak so far, which a
collapse falls away from. (Not the best over every load: with strict class priority the
served mix shifts to cheap interactive requests as load grows, so goodput in requests/s
can keep rising past 2x without the engine doing more; the overall peak is reported too.)
"""

from __future__ import annotations

from pathlib import Path

from bench.common import SHED_REASONS, target
from bench.overload import POD_PROFILE, TARGET_LOAD
from proxy import loadtest as lt
from proxy.loadtest.stats import in_window


def step_figures(step: dict, load_x: float) -> dict:
    """What the report shows for one (configuration, step), from the raw run."""
    classes, shed_s, shed_wire_s, invalid = {}, [], [], []
    for klass, result in step["results"].items():
        a = result.analyze(lt.SLA()).steps[0]
        f = a.overall
        classes[klass] = {
            "offered_rps": f.offered_rps,
            "goodput_rps": f.goodput_rps,
            "requests": f.requests,
            "ok": f.ok,
            "good": f.good,
            "status": f.status,
            "reasons": f.reasons,
            "errors": f.errors,
            "sender_lateness_p99_ms": a.lateness.p99_ms if a.lateness else None,
        }
        invalid += [f"{klass}: {r}" for r in a.invalid_reasons]
        run, names = result.runs[0], result.reasons.names
        rec = run.records
        for i in in_window(rec, *run.window):
            if rec.status[i] in (429, 503) and names[rec.reason[i]] in SHED_REASONS:
                shed_s.append(rec.end[i] - rec.intended[i])
                shed_wire_s.append(rec.end[i] - rec.sent[i])
    pod = step["pod"]
    shed, wire = lt.summarize(shed_s), lt.summarize(shed_wire_s)
    return {
        "load_x": load_x,
        "offered_rps": sum(c["offered_rps"] for c in classes.values()),
        "goodput_rps": sum(c["goodput_rps"] for c in classes.values()),
        "by_class": classes,
        "valid": not invalid,
        "invalid_reasons": invalid,
        "shed": {
            "count": len(shed_s),
            "p50_ms": shed and shed.p50_ms,
            "p99_ms": shed and shed.p99_ms,
            "max_ms": shed and shed.max_ms,
            "wire_p99_ms": wire and wire.p99_ms,
        },
        # Of the engine time settled in the window (work still running at its end is in neither part).
        "wasted_fraction": pod["wasted_s"] / settled if (settled := pod["useful_s"] + pod["wasted_s"]) else 0.0,
        "pod": {
            k: pod[k]
            for k in (
                "busy_s",
                "useful_s",
                "wasted_s",
                "wasted_client_gone_s",
                "wasted_deadline_s",
                "in_progress_s",
                "requests_submitted",
                "requests_executed",
                "requests_completed",
                "requests_late",
                "requests_cancelled_running",
                "requests_cancelled_waiting",
                "loop_late_steps",
                "loop_lag_s",
            )
        },
        "tap": step["tap"],
        "sidecar": step["sidecar"],
    }


def peak_up_to(runs: dict, load_x: float) -> float:
    """Best goodput of any configuration at any load <= load_x (0 when none)."""
    return max((s["goodput_rps"] for steps in runs.values() for s in steps if s["load_x"] <= load_x), default=0.0)


def targets_for(runs: dict) -> tuple[list[dict], float]:
    """The issue's targets, for the full policy at TARGET_LOAD x capacity; also the peak up to that load."""
    peak = peak_up_to(runs, TARGET_LOAD)
    at = next((s for s in runs.get("full", ()) if s["load_x"] == TARGET_LOAD), None)
    if at is None:
        return [], peak
    return [
        target("full_goodput_vs_peak_at_2x", at["goodput_rps"] / peak if peak else None, ">=", 0.9),
        target("full_wasted_engine_fraction_at_2x", at["wasted_fraction"], "<=", 0.05),
        target("full_shed_answer_p99_ms_at_2x", at["shed"]["p99_ms"], "<=", 5.0),
        target("full_expired_requests_forwarded_at_2x", at["tap"]["expired"], "==", 0),
    ], peak


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def markdown(runs: dict, peak: float, capacity: float, meta: dict) -> str:
    """The table a person reads first: every configuration at every load, then the controls."""
    lines = [
        "# bench/overload",
        "",
        (
            f"Simulated pod: llm profile, speed {POD_PROFILE.speed:g}, {POD_PROFILE.max_num_seqs} sequences a batch; "
            f"computed capacity for the mix {capacity:.1f} req/s. Clients: 75% interactive (2 s deadline), 25% batch "
            f"(10 s), open loop, each giving up at its deadline. Peak goodput up to {TARGET_LOAD:g}x: {peak:.1f} "
            f'req/s; over every load: {peak_up_to(runs, float("inf")):.1f} req/s ("of peak": of the best goodput '
            f"at that load or below). "
            f"{meta['pinning']}; load average {meta['loadavg']}."
        ),
        "",
        (
            "| config | load | offered req/s | goodput req/s | of peak | interactive good | batch good "
            "| wasted engine time | shed answers | shed p99 ms (wire) | 504 expired | client timeouts | expired fwd "
            "| doomed fwd |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for load in sorted({s["load_x"] for steps in runs.values() for s in steps}):
        for config, steps in runs.items():
            s = next((x for x in steps if x["load_x"] == load), None)
            if s is None:
                continue
            c = s["by_class"]
            expired = sum(x["reasons"].get("deadline_expired", 0) for x in c.values())
            timeouts = sum(x["errors"].get("timeout", 0) for x in c.values())
            lines.append(
                f"| {config}{'' if s['valid'] else ' (!)'} | {load:g}x | {s['offered_rps']:.1f} | "
                f"{s['goodput_rps']:.1f} | {fmt_pct(s['goodput_rps'] / best if (best := peak_up_to(runs, load)) else None)} | "
                f"{c['interactive']['good']}/{c['interactive']['requests']} | {c['batch']['good']}/{c['batch']['requests']} | "
                f"{fmt_pct(s['wasted_fraction'])} | {s['shed']['count']} | {fmt_ms(s['shed']['p99_ms'])} "
                f"({fmt_ms(s['shed']['wire_p99_ms'])}) | {expired} | "
                f"{timeouts} | {s['tap']['expired']} | {s['tap']['doomed']} |"
            )
    if not all(s["valid"] for steps in runs.values() for s in steps):
        lines += ["", "(!) the generator fell behind its schedule in that run (see result.json invalid_reasons)."]
    lines += [
        "",
        (
            "shed p99: intended send -> answer for the sidecar's 503/429 at arrival (on the wire, sent -> "
            "answer, in brackets). expired fwd / doomed fwd: requests that reached the pod with no budget left "
            "/ with less budget than their own uncontended service time (the pod's tap)."
        ),
        "",
    ]
    control = meta.get("controls")
    if control:
        idle, floor = control["shed_idle"], control["generator_floor"]
        lines += [
            (
                f"Controls at {idle['rps']:g} req/s: shed answers with the pod idle p50 {fmt_ms(idle['p50_ms'])} "
                f"ms, p99 {fmt_ms(idle['p99_ms'])} ms; the generator alone against the pod's 404 (no work) p50 "
                f"{fmt_ms(floor['p50_ms'])} ms, p99 {fmt_ms(floor['p99_ms'])} ms."
            ),
            "",
        ]
    return "\n".join(lines)


def plot(runs: dict, peak: float, capacity: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (config, steps), marker in zip(runs.items(), "osD", strict=False):
        steps = sorted(steps, key=lambda s: s["offered_rps"])
        x = [s["offered_rps"] for s in steps]
        ax.plot(x, [s["goodput_rps"] for s in steps], marker=marker, label=config)
        ax2.plot(x, [100 * s["wasted_fraction"] for s in steps], marker=marker, label=config)
    top = max(s["offered_rps"] for steps in runs.values() for s in steps)
    ax.plot([0, top], [0, top], ls=":", c="grey", label="offered")
    ax.axvline(capacity, ls="--", c="grey", lw=1)
    ax.axhline(0.9 * peak, ls="--", c="green", lw=1, label=f"90% of peak goodput up to {TARGET_LOAD:g}x")
    ax.set(
        xlabel="offered load, req/s (dashed: capacity)",
        ylabel="goodput, req/s (2xx within deadline)",
        title="Goodput vs offered load",
    )
    ax2.axhline(5, ls="--", c="green", lw=1, label="5% target")
    ax2.set(xlabel="offered load, req/s", ylabel="% of engine time", title="Wasted engine work")
    for a in (ax, ax2):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
