"""`rampmeter loadtest compare A.json B.json ...`: side by side, and an overlay plot.

Theory of operation: documents are matched step by step on their load value
(the union of loads, ascending; a blank where a run has no such step), so two
runs of one trace line up exactly and different sweeps still compare. Each cell
shows p99 and goodput, with "!" on an invalid step. Below the table, each run's
knee and its capacity relative to the first run.
"""

from __future__ import annotations

from pathlib import Path

from proxy.loadtest import plots
from proxy.loadtest.report import load


def labels_for(docs: list[dict], paths: list[str]) -> list[str]:
    names = [d["target"]["name"] for d in docs]
    if len(set(names)) == len(names):
        return names
    return [Path(p).stem if Path(p).stem not in {Path(q).stem for q in paths[:i]} else p for i, p in enumerate(paths)]


def _cell(step: dict | None) -> str:
    if step is None:
        return "-"
    f = step["overall"]
    p99 = f["latency_ms"]["p99"] if f["latency_ms"] else None
    p99_text = "-" if p99 is None else f"{p99 / 1000:.2f}s" if p99 >= 1000 else f"{p99:.0f}ms"
    return f"p99 {p99_text} good {f['goodput_rps']:.0f}/s{'' if step['valid'] else ' !'}"


def table(docs: list[dict], labels: list[str]) -> str:
    loads = sorted({s["load"] for d in docs for s in d["steps"]})
    by_load = [{s["load"]: s for s in d["steps"]} for d in docs]
    unit = docs[0]["plan"]["unit"] if docs else "rps"
    head = ["load (" + ("req/s" if unit == "rps" else "users") + ")", *labels]
    rows = [[f"{x:g}", *(_cell(b.get(x)) for b in by_load)] for x in loads]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def fmt(cells: list[str]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))

    lines = [fmt(head), "-+-".join("-" * w for w in widths), *(fmt(r) for r in rows), ""]
    base = docs[0]["knee"]["load"] if docs else None
    for doc, label in zip(docs, labels, strict=True):
        knee = doc["knee"]
        rel = ""
        if base and knee["load"] is not None and doc is not docs[0]:
            rel = f" ({knee['load'] / base:.0%} of {labels[0]})"
        lines.append(f"{label}: {knee['summary']}{rel}")
    if any(not d["valid"] for d in docs):
        lines.append("! = invalid step (generator behind schedule or could not send it all): do not trust it.")
    return "\n".join(lines)


def compare(paths: list[str], out_dir: str | Path) -> tuple[str, Path]:
    """Load documents, return the table text and write the overlay plot (compare.png)."""
    docs = [load(p) for p in paths]
    units = {d["plan"]["unit"] for d in docs}
    if len(units) > 1:
        raise ValueError("cannot compare open-loop (req/s) with closed-loop (users) runs")
    labels = labels_for(docs, paths)
    return table(docs, labels), plots.compare(docs, labels, Path(out_dir) / "compare.png")
