"""bench/microbatch: the Markdown a person reads first, and the plot docs/batching.md shows."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SHORT, LONG = "embed_short", "embed_long"
TITLES = {
    "direct": "direct",
    "off": "rampmeter, batching off",
    "on": "rampmeter, batching on",
    "adaptive": "rampmeter, adaptive",
    "grouped": "rampmeter, length buckets [64]",
    "one_bucket": "rampmeter, one bucket",
}


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _n(v, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _serial_table(setup: dict) -> list[str]:
    lines = [
        "| target | rated: load within SLA (req/s; >=: every step met, the sweep ended first) | goodput there (req/s) | x direct | p50 / p99 at 0.8 x C0 (ms) "
        "| mean batch at the top step | sidecar CPU us/req |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    direct = setup["rated"]["direct"]["goodput_rps"]
    for name, steps in setup["steps"].items():
        r = setup["rated"][name]
        at = setup["at_0_8"].get(name) or {}
        top = next((s for s in reversed(steps) if s["within_sla"]), steps[-1] if steps else {})
        ratio = None if not direct or r["goodput_rps"] is None else r["goodput_rps"] / direct
        at_least = ">= " if r.get("lower_bound") else ""
        lines.append(
            f"| {TITLES.get(name, name)} | {at_least}{_n(r['load_rps'])} | {at_least}{_n(r['goodput_rps'])} | "
            f"{at_least}{_n(ratio, 2)} | "
            f"{_ms(at.get('p50_ms'))} / {_ms(at.get('p99_ms'))} | {_n(top.get('mean_batch_items'))} | "
            f"{_n(top.get('sidecar_cpu_us_per_request'), 0)} |"
        )
    return lines


def _steps_table(setup: dict) -> list[str]:
    lines = ["| load (req/s) | " + " | ".join(TITLES.get(n, n) for n in setup["steps"]) + " |"]
    lines.append("|---:|" + "---|" * len(setup["steps"]))
    for load in setup["loads_rps"]:
        cells = []
        for steps in setup["steps"].values():
            s = next((x for x in steps if x["load_rps"] == load), None)
            if s is None:
                cells.append("(left the sweep)")
                continue
            mark = "" if s["within_sla"] else " MISS"
            late = "" if s["valid"] else f" late {s['lateness_p99_ms']:.0f} ms"
            batch = f", batch {s['mean_batch_items']:.1f}" if s.get("mean_batch_items") else ""
            cells.append(
                f"{_ms(s['p50_ms'])} / {_ms(s['p99_ms'])} ms, {s['goodput_rps']:.0f} good/s{batch}{mark}{late}"
            )
        lines.append(f"| {load:g} | " + " | ".join(cells) + " |")
    return lines


def _padded_table(setup: dict) -> list[str]:
    lines = [
        "| load (req/s) | target | short p50 / p99 (ms) | long p50 / p99 (ms) | mean batch | padding share | padding saved (tokens) |",
        "|---:|---|---|---|---:|---:|---:|",
    ]
    for name, steps in setup["steps"].items():
        for s in steps:
            sh, lo = s["by_shape"].get(SHORT, {}), s["by_shape"].get(LONG, {})
            lines.append(
                f"| {s['load_rps']:g} | {TITLES.get(name, name)} | {_ms(sh.get('p50_ms'))} / {_ms(sh.get('p99_ms'))} | "
                f"{_ms(lo.get('p50_ms'))} / {_ms(lo.get('p99_ms'))} | {_n(s.get('mean_batch_items'))} | "
                f"{_pct(s.get('padding_share'))} | "
                f"{_n(s.get('padding_saved_tokens'), 0)} |"
            )
    return lines


def _repeats(setup: dict) -> list[str]:
    reps = setup.get("repeats") or []
    if len(reps) < 2:
        return []
    lines = ["| trace (seed) | " + " | ".join(f"{TITLES.get(n, n)} rated goodput" for n in reps[0]["rated"]) + " |"]
    lines.append("|---:|" + "---:|" * len(reps[0]["rated"]))
    for rep in reps:
        lines.append(f"| {rep['seed']} | " + " | ".join(_n(r["goodput_rps"]) for r in rep["rated"].values()) + " |")
    return [*lines, ""]


def markdown(runs: dict, quick: bool) -> str:
    s = runs["serial"]
    lines = [
        "# microbatch",
        "",
        (
            f"{'Quick run' if quick else 'Full run'} on a shared machine ({os.cpu_count()} CPUs, load average "
            f"{os.getloadavg()[0]:.1f} at the end: busy; latencies include the generator's own lateness). "
            f"Steps {runs['step_s']:g} s ({runs['warmup_s']:g} s warm-up), "
            f"open-loop Poisson, seed {runs['seed']}, configurations interleaved step by step. {runs['pinning']}."
        ),
        "",
        (
            f"## A. Unbatched server (sim pod embeddings-serial at speed {s['speed']:g}), embed_short; direct capacity "
            f"C0 = {s['capacity_direct_rps']:g} req/s; SLA p99 <= {s['sla_p99_ms']:g} ms"
        ),
        "",
        *_serial_table(s),
        "",
        *_repeats(s),
        "Per step, p50 / p99 and goodput (a target leaves the sweep after its first miss; first trace):",
        "",
        *_steps_table(s),
        "",
        (
            "## B. Padding server (sim pod embeddings-padded), 80% embed_short / 20% embed_long; "
            f"SLA p99 <= {runs['padded']['sla_p99_ms']:g} ms; the server alone sustains about "
            f"{runs['padded']['padded_capacity_rps']:g} req/s when its batches are full and padded. The sim pod pads calls to each other, not the inputs "
            "of one call: a merged mixed call costs it only its tokens, so 'one bucket' looks as good as grouped here; "
            "the padding share is what a server that pads rows would compute"
        ),
        "",
        *_padded_table(runs["padded"]),
    ]
    if "litserve" in runs:
        ls = runs["litserve"]
        lines += [
            "",
            f"## C. Real server: {ls['server']}; one client gets {ls['capacity_direct_rps']:g} req/s; "
            f"SLA p99 <= {ls['sla_p99_ms']:g} ms",
            "",
            *_serial_table(ls),
            "",
            *_steps_table(ls),
        ]
    return "\n".join(lines) + "\n"


def _curve(ax, setup: dict, key: str, title: str, sla: float | None = None) -> None:
    styles = ("-", "--", "-", ":")
    for k, (name, steps) in enumerate(setup["steps"].items()):
        xs = [s["offered_rps"] for s in steps if s.get(key) is not None]
        ys = [s[key] for s in steps if s.get(key) is not None]
        ax.plot(xs, ys, marker="o", linestyle=styles[k % 4], markersize=7 - k, label=TITLES.get(name, name))
    if sla is not None:
        ax.axhline(sla, color="grey", linestyle="--", linewidth=1, label=f"SLA p99 {sla:g} ms")
        ax.set_yscale("log")
    ax.set_xlabel("offered load (req/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)


def plot(runs: dict, path: Path) -> Path:
    has_ls = "litserve" in runs
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    _curve(axes[0][0], runs["serial"], "p99_ms", "A. sim pod, unbatched server: p99 (ms)", runs["serial"]["sla_p99_ms"])
    _curve(axes[0][1], runs["serial"], "goodput_rps", "A. sim pod, unbatched server: goodput (req/s within SLA)")
    if has_ls:
        _curve(
            axes[1][0],
            runs["litserve"],
            "p99_ms",
            "C. LitServe, batching off: p99 (ms)",
            runs["litserve"]["sla_p99_ms"],
        )
    else:
        axes[1][0].set_axis_off()
    ax = axes[1][1]
    padded = runs["padded"]["steps"]
    names = list(padded)
    width = 0.38
    for k, shape in enumerate((SHORT, LONG)):
        values = [padded[n][-1]["by_shape"].get(shape, {}).get("p50_ms") or 0 for n in names]
        ax.bar([i + (k - 0.5) * width for i in range(len(names))], values, width, label=f"{shape} p50")
    ax.set_xticks(range(len(names)), [TITLES.get(n, n).replace("rampmeter, ", "") for n in names], fontsize=8)
    ax.set_ylabel("ms")
    load = runs["padded"]["loads_rps"][-1]
    ax.set_title(f"B. sim pod, padding server at {load:g} req/s: p50 by input length", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    for a in (axes[0][0], axes[0][1], axes[1][0], ax):
        if a.has_data():
            a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
