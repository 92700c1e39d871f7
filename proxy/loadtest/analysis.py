"""From a run's rows to every figure the reports show: per step, per shape, per class, knee, cost.

Theory of operation: `analyze(runs, shapes, reasons, sla, ...)` is a pure
function of the runner's `StepRun`s. For each step it selects the measured rows
(intended time in the window), groups them overall / by shape label / by class
("default" when a shape has none), computes `Figures` for each group
(`stats.py`), and judges the step:

- invalid when the sender fell behind: p99 of its lateness (open loop: actual
  minus intended send time; closed loop: event-loop oversleep) is above
  `max_lateness_ms`; when requests waited inside the generator because the
  in-flight cap was reached; or when measured requests were never sent.
- within the SLA per `verdict.SLA.misses`.

Then the knee and the cost at the knee (`verdict.py`). The whole-run "overall"
figures pool every step's measured rows over the summed measured time.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.loadtest.records import NOT_SENT, ReasonTable, StepRun
from proxy.loadtest.shapes import Shape
from proxy.loadtest.stats import Figures, Rows, Summary, figures, in_window, summarize
from proxy.loadtest.verdict import SLA, Knee, StepVerdict, cost, find_knee

DEFAULT_CLASS = "default"


@dataclass(frozen=True)
class StepAnalysis:
    index: int
    load: float
    start_s: float
    duration_s: float
    warmup_s: float
    valid: bool
    invalid_reasons: tuple[str, ...]
    lateness: Summary | None
    backlogged: int
    overall: Figures
    by_shape: dict[str, Figures]
    by_class: dict[str, Figures]
    verdict: StepVerdict

    @property
    def measured_s(self) -> float:
        return self.duration_s - self.warmup_s


@dataclass(frozen=True)
class Analysis:
    unit: str  # "rps" (open loop) or "users" (closed loop)
    sla: SLA
    steps: tuple[StepAnalysis, ...]
    overall: Figures
    by_shape: dict[str, Figures]
    by_class: dict[str, Figures]
    knee: Knee
    cost: dict | None
    max_lateness_ms: float

    @property
    def valid(self) -> bool:
        return all(s.valid for s in self.steps)


class _Groups:
    """Row indices per group key, for several (records, indices) sources."""

    def __init__(self, shapes: tuple[Shape, ...]) -> None:
        self.label = [s.label for s in shapes]
        self.cls = [s.cls or DEFAULT_CLASS for s in shapes]

    def split(self, rows: Rows) -> tuple[dict[str, Rows], dict[str, Rows]]:
        by_shape: dict[str, Rows] = {}
        by_class: dict[str, Rows] = {}
        for rec, idx in rows:
            s_parts: dict[str, list[int]] = {}
            c_parts: dict[str, list[int]] = {}
            shape = rec.shape
            for i in idx:
                k = shape[i]
                s_parts.setdefault(self.label[k], []).append(i)
                c_parts.setdefault(self.cls[k], []).append(i)
            for key, part in s_parts.items():
                by_shape.setdefault(key, []).append((rec, part))
            for key, part in c_parts.items():
                by_class.setdefault(key, []).append((rec, part))
        return by_shape, by_class


def _count(rows: Rows | None) -> int:
    return sum(len(idx) for _, idx in rows or ())


def _group_figures(rows: Rows, done: Rows, window_s: float, groups: _Groups, bound, reasons: ReasonTable):
    by_shape, by_class = groups.split(rows)
    done_shape, done_class = groups.split(done)
    overall = figures(rows, window_s, bound, reasons, _count(done))
    shapes = {k: figures(v, window_s, bound, reasons, _count(done_shape.get(k))) for k, v in sorted(by_shape.items())}
    classes = {k: figures(v, window_s, bound, reasons, _count(done_class.get(k))) for k, v in sorted(by_class.items())}
    return overall, shapes, classes


def _invalid(run: StepRun, rows: Rows, lateness: Summary | None, max_lateness_ms: float) -> list[str]:
    out = []
    if lateness is not None and lateness.p99_ms > max_lateness_ms:
        out.append(f"generator behind schedule: p99 lateness {lateness.p99_ms:.1f} ms > {max_lateness_ms:g} ms")
    if run.backlogged:
        out.append(f"in-flight cap of {run.in_flight_cap} reached: {run.backlogged} requests waited in the generator")
    unsent = sum(1 for rec, idx in rows for i in idx if rec.error[i] == NOT_SENT)
    if unsent:
        out.append(f"{unsent} measured requests were never sent (run interrupted)")
    if not rows or not _count(rows):
        out.append("no requests in the measured window")
    return out


def analyze(
    runs: list[StepRun],
    shapes: tuple[Shape, ...],
    reasons: ReasonTable,
    sla: SLA,
    *,
    unit: str,
    max_lateness_ms: float = 10.0,
    gpus: float = 1.0,
    usd_per_gpu_hour: float | None = None,
) -> Analysis:
    groups = _Groups(shapes)
    deadline = [None if s.deadline_ms is None else s.deadline_ms / 1000.0 for s in shapes]
    global_bound = sla.bound_s

    def bound(shape: int) -> float | None:
        own = deadline[shape]
        return global_bound if own is None else own

    steps, all_rows, all_done, total_s = [], [], [], 0.0
    for run in runs:
        w0, w1 = run.window
        rows = [(run.records, in_window(run.records, w0, w1))]
        done = [(r.records, in_window(r.records, w0, w1, by="end")) for r in runs]
        window_s = w1 - w0
        overall, by_shape, by_class = _group_figures(rows, done, window_s, groups, bound, reasons)
        lateness = summarize(run.lateness)
        problems = _invalid(run, rows, lateness, max_lateness_ms)
        misses = sla.misses(overall, by_class) if sla.defined else []
        late = lateness is not None and lateness.p99_ms > max_lateness_ms
        verdict = StepVerdict(
            run.index,
            run.load,
            not problems,
            (not misses) if sla.defined else None,
            late,
            tuple(misses),
            overall.offered_rps,
            overall.goodput_rps,
            overall.latency.p99_ms if overall.latency else None,
            tuple(problems),
            lateness.p99_ms if lateness is not None else None,
        )
        steps.append(
            StepAnalysis(
                run.index,
                run.load,
                run.start_s,
                run.duration_s,
                run.warmup_s,
                not problems,
                tuple(problems),
                lateness,
                run.backlogged,
                overall,
                by_shape,
                by_class,
                verdict,
            )
        )
        all_rows += rows
        all_done += done
        total_s += window_s
    overall, by_shape, by_class = _group_figures(all_rows, all_done, total_s, groups, bound, reasons)
    knee = find_knee([s.verdict for s in steps], unit, sla)
    price = cost(knee.goodput_rps, gpus, usd_per_gpu_hour) if knee.step is not None else None
    return Analysis(unit, sla, tuple(steps), overall, by_shape, by_class, knee, price, max_lateness_ms)
