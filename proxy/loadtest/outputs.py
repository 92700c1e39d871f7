"""Write a run's files: the JSON document, the Markdown report and the two PNG plots.

Theory of operation: `write_outputs(doc, out_dir)` writes loadtest.json,
report.md, latency.png and goodput.png into `out_dir` (explicit paths override
the JSON and Markdown locations); the report links the plots by relative path
so the directory can be moved or attached as a whole. Returns what it wrote.
"""

from __future__ import annotations

import os
from pathlib import Path

from proxy.loadtest import markdown, plots
from proxy.loadtest.report import dumps


def write_outputs(
    doc: dict,
    out_dir: str | Path,
    *,
    json_path: str | Path | None = None,
    markdown_path: str | Path | None = None,
    with_plots: bool = True,
) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    jpath = Path(json_path) if json_path else out / "loadtest.json"
    jpath.parent.mkdir(parents=True, exist_ok=True)
    jpath.write_bytes(dumps(doc))
    written["json"] = jpath
    mpath = Path(markdown_path) if markdown_path else out / "report.md"
    mpath.parent.mkdir(parents=True, exist_ok=True)
    links: dict[str, str] = {}
    if with_plots:
        written["latency_plot"] = plots.latency(doc, out / "latency.png")
        written["goodput_plot"] = plots.goodput(doc, out / "goodput.png")
        for title, key in (("latency vs load", "latency_plot"), ("goodput vs load", "goodput_plot")):
            links[title] = os.path.relpath(written[key].resolve(), mpath.parent.resolve())
    mpath.write_text(markdown.render(doc, links))
    written["markdown"] = mpath
    return written
