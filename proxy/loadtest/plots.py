"""PNG plots of a load test, drawn from the JSON document (matplotlib, no display needed).

Theory of operation: figures are built with `matplotlib.figure.Figure` (the Agg
canvas, no pyplot global state), so plotting works headless, in threads and
inside tests. Each plot reads only the document:

- latency: p50/p95/p99/p99.9 vs load (log scale), the SLA targets as dashed
  lines, the knee as a vertical line, invalid steps crossed out in red.
- goodput: goodput and achieved rate vs load, the offered rate as the y = x
  reference (open loop), the knee marked.
- compare: p99 and goodput vs load for several documents overlaid.
"""

from __future__ import annotations

from pathlib import Path

_QUANTILES = (("p50", "p50"), ("p95", "p95"), ("p99", "p99"), ("p99.9", "p99.9"))


def _figure(width: float = 8.0, height: float = 4.8, ncols: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    return fig, fig.subplots(1, ncols) if ncols > 1 else fig.subplots()


def _xlabel(doc: dict) -> str:
    return "offered load (req/s)" if doc["plan"]["unit"] == "rps" else "concurrent users"


def _series(doc: dict, key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for s in doc["steps"]:
        lat = s["overall"]["latency_ms"]
        if lat is not None:
            xs.append(s["load"])
            ys.append(lat[key])
    return xs, ys


def _mark_knee(ax, doc: dict) -> None:
    knee = doc["knee"]
    if knee["load"] is not None:
        ax.axvline(
            knee["load"],
            color="green",
            linestyle=":",
            linewidth=1.5,
            label=f"knee {knee['load']:g}{' (lower bound)' if knee['lower_bound'] else ''}",
        )


def _mark_invalid(ax, doc: dict, key: str, nested: str | None = "latency_ms") -> None:
    bad = [s for s in doc["steps"] if not s["valid"]]
    xs, ys = [], []
    for s in bad:
        value = s["overall"][nested][key] if nested else s["overall"][key]
        if value is not None:
            xs.append(s["load"])
            ys.append(value)
    if xs:
        ax.scatter(xs, ys, marker="x", s=90, color="red", zorder=5, label="INVALID step")


def latency(doc: dict, path: str | Path) -> Path:
    fig, ax = _figure()
    for key, label in _QUANTILES:
        xs, ys = _series(doc, key)
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
    for target in doc["sla"]["targets"]:
        q = "max" if target["percentile"] == 100 else f"p{target['percentile']:g}"
        ax.axhline(target["bound_ms"], color="black", linestyle="--", linewidth=1, label=f"SLA {q}")
    _mark_knee(ax, doc)
    _mark_invalid(ax, doc, "p99")
    ax.set_yscale("log")
    ax.set_xlabel(_xlabel(doc))
    ax.set_ylabel("latency from intended send (ms)")
    ax.set_title(f"Latency vs load: {doc['target']['name']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def goodput(doc: dict, path: str | Path) -> Path:
    fig, ax = _figure()
    loads = [s["load"] for s in doc["steps"]]
    ax.plot(loads, [s["overall"]["goodput_rps"] for s in doc["steps"]], marker="o", label="goodput (2xx within SLA)")
    ax.plot(
        loads,
        [s["overall"]["achieved_rps"] for s in doc["steps"]],
        marker="s",
        markersize=3,
        label="achieved (responses)",
    )
    if doc["plan"]["unit"] == "rps" and loads:
        ax.plot([0, max(loads)], [0, max(loads)], color="grey", linestyle="--", linewidth=1, label="offered")
    _mark_knee(ax, doc)
    _mark_invalid(ax, doc, "goodput_rps", nested=None)
    ax.set_xlabel(_xlabel(doc))
    ax.set_ylabel("requests/s")
    ax.set_title(f"Goodput vs load: {doc['target']['name']}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def compare(docs: list[dict], labels: list[str], path: str | Path) -> Path:
    fig, (lat_ax, good_ax) = _figure(12.0, 4.8, ncols=2)
    for doc, label in zip(docs, labels, strict=True):
        xs, ys = _series(doc, "p99")
        line = lat_ax.plot(xs, ys, marker="o", markersize=3, label=label)[0]
        loads = [s["load"] for s in doc["steps"]]
        good_ax.plot(
            loads,
            [s["overall"]["goodput_rps"] for s in doc["steps"]],
            marker="o",
            markersize=3,
            color=line.get_color(),
            label=label,
        )
        if doc["knee"]["load"] is not None:
            for ax in (lat_ax, good_ax):
                ax.axvline(doc["knee"]["load"], color=line.get_color(), linestyle=":", linewidth=1)
        _mark_invalid(lat_ax, doc, "p99")
    for target in docs[0]["sla"]["targets"] if docs else ():
        lat_ax.axhline(target["bound_ms"], color="black", linestyle="--", linewidth=1, label="SLA")
    lat_ax.set_yscale("log")
    lat_ax.set_ylabel("p99 latency (ms)")
    good_ax.set_ylabel("goodput (req/s)")
    for ax, title in ((lat_ax, "p99 vs load (dotted: knees)"), (good_ax, "goodput vs load")):
        ax.set_xlabel(_xlabel(docs[0]) if docs else "load")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
