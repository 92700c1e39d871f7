"""A run's outcome as a value: the trace, the target, every step's rows, and how to analyze them.

Theory of operation: the runner returns one `RunResult` per target; `analyze(sla)`
computes every figure (pure, `analysis.py`). `merge(part)` folds a later
one-step run of the same trace into it, shifted onto one timeline and with its
reason table re-interned, which is how `run_interleaved` builds A-B-A-B results
that read like one run per target.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from proxy.loadtest.analysis import Analysis, analyze
from proxy.loadtest.records import ReasonTable, StepRun
from proxy.loadtest.target import Target
from proxy.loadtest.trace import Trace
from proxy.loadtest.verdict import SLA


@dataclass
class RunResult:
    trace: Trace
    target: Target
    runs: list[StepRun]
    reasons: ReasonTable
    started_at: float  # wall clock (epoch seconds)
    wall_s: float = 0.0
    transport: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False  # stopped early (Ctrl-C / Runner.stop()): unsent rows are NOT_SENT

    def analyze(self, sla: SLA, **kw: Any) -> Analysis:
        return analyze(self.runs, self.trace.mix.shapes, self.reasons, sla, unit=self.trace.plan.unit, **kw)

    def merge(self, part: RunResult) -> None:
        """Append a later run's steps, shifted to follow this run on one timeline."""
        names, shift = self.reasons, self.wall_s
        remap = [names.index(n.encode("latin-1")) if n else 0 for n in part.reasons.names]
        for run in part.runs:
            rec = run.records
            rec.reason = array("B", (remap[r] for r in rec.reason))
            for col in ("intended", "sent", "end"):
                setattr(rec, col, array("d", (t + shift for t in getattr(rec, col))))
            run.start_s += shift
            self.runs.append(run)
        self.wall_s += part.wall_s
        self.interrupted = self.interrupted or part.interrupted
