"""The stable JSON document ("rampmeter.loadtest/1") and the Markdown report made from it.

Theory of operation: `document(result, analysis, ...)` turns a run and its
analysis into plain JSON-able dicts, field by field as documented in
docs/loadtest.md; everything downstream (Markdown, plots, `compare`) reads only
that document, so a JSON file from last week renders exactly like a fresh run.
The schema is versioned: fields are only ever added within "/1"; renaming or
removing one means "/2".

Invalid steps are never silent: `valid: false` with reasons on the step, the
document's top-level `valid`, a marker in every Markdown table row and a cross
in the plots.
"""

from __future__ import annotations

import datetime
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from proxy.loadtest.records import ERROR_NAMES
from proxy.loadtest.stats import Figures, Summary

if TYPE_CHECKING:
    from proxy.loadtest.analysis import Analysis
    from proxy.loadtest.result import RunResult

SCHEMA = "rampmeter.loadtest/1"
VERSION = "0.1.0"


def summary_dict(s: Summary | None) -> dict | None:
    if s is None:
        return None
    return {
        "count": s.count,
        "mean": s.mean_ms,
        "p50": s.p50_ms,
        "p95": s.p95_ms,
        "p99": s.p99_ms,
        "p99.9": s.p999_ms,
        "max": s.max_ms,
    }


def figures_dict(f: Figures) -> dict:
    return {
        "requests": f.requests,
        "responses": f.responses,
        "ok": f.ok,
        "good": f.good,
        "offered_rps": f.offered_rps,
        "achieved_rps": f.achieved_rps,
        "goodput_rps": f.goodput_rps,
        "good_fraction": f.good / f.requests if f.requests else None,
        "failed_fraction": f.failed_fraction,
        "latency_ms": summary_dict(f.latency),
        "ttft_ms": summary_dict(f.ttft),
        "tpot_ms": summary_dict(f.tpot),
        "status": f.status,
        "reasons": f.reasons,
        "errors": f.errors,
    }


def _records(result: RunResult) -> dict:
    cols: dict[str, list] = {
        k: []
        for k in (
            "step",
            "intended_s",
            "sent_s",
            "end_s",
            "latency_ms",
            "status",
            "error",
            "reason",
            "shape",
            "ttft_ms",
            "tokens",
        )
    }
    names = result.reasons.names
    for run in result.runs:
        r = run.records
        for i in range(len(r)):
            cols["step"].append(run.index)
            cols["intended_s"].append(r.intended[i])
            cols["sent_s"].append(r.sent[i])
            cols["end_s"].append(r.end[i])
            cols["latency_ms"].append((r.end[i] - r.intended[i]) * 1000.0)
            cols["status"].append(r.status[i])
            cols["error"].append(ERROR_NAMES[r.error[i]])
            cols["reason"].append(names[r.reason[i]] or None)
            cols["shape"].append(r.shape[i])
            ttft = r.ttft[i]
            cols["ttft_ms"].append(None if math.isnan(ttft) else ttft * 1000.0)
            cols["tokens"].append(r.tokens[i])
    return cols


def document(result: RunResult, analysis: Analysis, *, command: str | None = None, records: bool = False) -> dict:
    """The JSON document of one run (schema in docs/loadtest.md)."""
    plan, target, sla = result.trace.plan, result.target, analysis.sla
    started = datetime.datetime.fromtimestamp(result.started_at, datetime.UTC)
    steps = [
        {
            "index": s.index,
            "load": s.load,
            "start_s": s.start_s,
            "duration_s": s.duration_s,
            "warmup_s": s.warmup_s,
            "measured_s": s.measured_s,
            "valid": s.valid,
            "invalid_reasons": list(s.invalid_reasons),
            "within_sla": s.verdict.within_sla,
            "sla_misses": list(s.verdict.misses),
            "lateness_ms": summary_dict(s.lateness),
            "backlogged": s.backlogged,
            "overall": figures_dict(s.overall),
            "by_shape": {k: figures_dict(v) for k, v in s.by_shape.items()},
            "by_class": {k: figures_dict(v) for k, v in s.by_class.items()},
        }
        for s in analysis.steps
    ]
    knee = analysis.knee
    return {
        "schema": SCHEMA,
        "tool": {"name": "rampmeter loadtest", "version": VERSION, "python": sys.version.split()[0]},
        "command": command,
        "started_at": started.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "wall_s": result.wall_s,
        "interrupted": result.interrupted,
        "target": {
            "url": target.url,
            "name": target.label,
            "protocol": target.protocol,
            "timeout_ms": target.timeout_s * 1000.0,
            "connections": target.connections,
            "max_in_flight": target.max_in_flight,
            "check_json": target.check_json,
        },
        "plan": {
            "mode": plan.mode,
            "unit": plan.unit,
            "arrival": plan.arrival if plan.mode == "open" else None,
            "think_ms": plan.think_ms if plan.mode == "closed" else None,
            "think": plan.think if plan.mode == "closed" else None,
            "seed": result.trace.seed,
            "idempotency": result.trace.idempotency,
            "steps": [{"load": s.load, "duration_s": s.duration_s, "warmup_s": s.warmup_s} for s in plan.steps],
        },
        "mix": result.trace.mix.describe(),
        "sla": {
            "targets": [{"percentile": q, "bound_ms": b * 1000.0} for q, b in sla.targets],
            "class_deadlines_ms": dict(sla.class_deadlines_ms),
            "max_failed_fraction": sla.max_failed_fraction,
            "text": sla.describe(),
        },
        "max_lateness_ms": analysis.max_lateness_ms,
        "valid": analysis.valid and not result.interrupted,
        "steps": steps,
        "overall": figures_dict(analysis.overall),
        "by_shape": {k: figures_dict(v) for k, v in analysis.by_shape.items()},
        "by_class": {k: figures_dict(v) for k, v in analysis.by_class.items()},
        "knee": {
            "step": knee.step,
            "load": knee.load,
            "unit": plan.unit,
            "offered_rps": knee.offered_rps,
            "goodput_rps": knee.goodput_rps,
            "p99_ms": knee.p99_ms,
            "lower_bound": knee.lower_bound,
            "summary": knee.summary,
        },
        "cost": analysis.cost,
        "transport": result.transport,
        "records": _records(result) if records else None,
    }


def dumps(doc: dict) -> bytes:
    return msgspec.json.format(msgspec.json.encode(doc), indent=2) + b"\n"


def load(path: str | Path) -> dict:
    """A document from a file; ValueError when it is not one of ours."""
    try:
        doc = msgspec.json.decode(Path(path).read_bytes())
    except msgspec.DecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("rampmeter.loadtest/"):
        raise ValueError(f'{path}: not a rampmeter loadtest result (no "schema": "{SCHEMA}")')
    if doc["schema"] != SCHEMA:
        raise ValueError(f"{path}: schema {doc['schema']} is not {SCHEMA}; use the matching rampmeter version")
    return doc
