"""`rampmeter loadtest compare A.json B.json ...`: side by side, and an overlay plot when asked.

Theory of operation: documents are matched step by step on their load value
(the union of loads, ascending; a "-" where a run has no such step), so two
runs of one trace line up exactly and different sweeps still compare. One
column per run, named the same way for every run (its target name when those
differ, else the shortest path suffix that tells the files apart), headed
`NAME p99 ms / goodput req/s`, and every cell in those units, with "!" on an
invalid step. Below the table, each run's knee and its capacity relative to the
first run. The overlay plot (compare.png) is written only into a directory the
caller names (`--out`).
"""

from __future__ import annotations

from pathlib import Path

from proxy.loadtest import plots
from proxy.loadtest.report import load


def labels_for(docs: list[dict], paths: list[str]) -> list[str]:
    """One kind of name for every run: target names if they differ, else the files' shortest distinct path suffixes."""
    names = [d["target"]["name"] for d in docs]
    if len(set(names)) == len(names):
        return names
    parts = [Path(p).with_suffix("").parts for p in paths]
    if len({p[-1] for p in parts}) == 1 and all(len(p) > 1 for p in parts):
        parts = [p[:-1] for p in parts]  # a/loadtest.json, b/loadtest.json: the directories are the names
    for k in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-k:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return list(paths)


def _cell(step: dict | None) -> str:
    if step is None:
        return "-"
    f = step["overall"]
    p99 = f["latency_ms"]["p99"] if f["latency_ms"] else None
    p99_text = "-" if p99 is None else f"{p99:.0f}"
    return f"{p99_text} / {f['goodput_rps']:.1f}{'' if step['valid'] else ' !'}"


def table(docs: list[dict], labels: list[str]) -> str:
    loads = sorted({s["load"] for d in docs for s in d["steps"]})
    by_load = [{s["load"]: s for s in d["steps"]} for d in docs]
    unit = docs[0]["plan"]["unit"] if docs else "rps"
    head = [
        "load (" + ("req/s" if unit == "rps" else "users") + ")",
        *(f"{label} p99 ms / goodput req/s" for label in labels),
    ]
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


def compare(paths: list[str], out_dir: str | Path | None = None) -> tuple[str, Path | None]:
    """Load documents, return the table text, and with `out_dir` write the overlay plot there (compare.png)."""
    docs = [load(p) for p in paths]
    units = {d["plan"]["unit"] for d in docs}
    if len(units) > 1:
        raise ValueError("cannot compare open-loop (req/s) with closed-loop (users) runs")
    labels = labels_for(docs, paths)
    plot = None if out_dir is None else plots.compare(docs, labels, Path(out_dir) / "compare.png")
    return table(docs, labels), plot
