"""SLA targets, per-step verdicts, the knee (rated capacity) and cost per good request.

Theory of operation: an `SLA` is percentile targets ("p99=500ms,p50=200ms") plus
the share of failed requests a step may have (default 1%: a step that answers
fast because it sheds half its load has not met any SLA worth the name) and
optional per-class deadlines. A step meets it when every target holds on its
overall figures and every class with a deadline has its p99 within it.

The knee is the highest step of the unbroken run of valid, SLA-meeting steps
from the bottom of the sweep ("the highest load whose p99 *stays* within the
SLA"): a lucky pass above a failed step does not count, and an invalid step
(generator behind schedule) ends the run, since nothing above it can be
trusted. `Knee.summary` says it in one plain sentence.

Cost at the knee: GPU-hours per million good requests = gpus * 1e6 /
(goodput_rps * 3600), and that times the hourly price.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from proxy.loadtest.stats import Figures

_TARGET = re.compile(r"^\s*p(\d+(?:\.\d+)?|max)\s*=\s*(\d+(?:\.\d+)?)\s*(ms|s|us)?\s*$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "us": 1e-6, None: 1e-3}


def parse_duration_ms(text: str) -> float:
    """ "500ms", "1.5s", "250" (ms) -> milliseconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|us)?\s*", text)
    if not m:
        raise ValueError(f"bad duration {text!r}: want e.g. 500ms or 1.5s")
    return float(m.group(1)) * _UNIT_S[m.group(2)] * 1000.0


@dataclass(frozen=True)
class SLA:
    targets: tuple[tuple[float, float], ...] = ()  # (percentile, bound in seconds)
    class_deadlines_ms: dict[str, int] = field(default_factory=dict)
    max_failed_fraction: float = 0.01

    @classmethod
    def parse(
        cls, spec: str | None, *, class_deadlines_ms: dict[str, int] | None = None, max_failed_fraction: float = 0.01
    ) -> SLA:
        targets = []
        for part in (spec or "").split(","):
            if not part.strip():
                continue
            m = _TARGET.match(part)
            if not m:
                raise ValueError(f"bad SLA target {part.strip()!r}: want e.g. p99=500ms (p50, p95, p99, p99.9, pmax)")
            q = 100.0 if m.group(1) == "max" else float(m.group(1))
            if q not in (50.0, 95.0, 99.0, 99.9, 100.0):
                raise ValueError(f"SLA percentile p{m.group(1)} is not reported; use p50, p95, p99, p99.9 or pmax")
            targets.append((q, float(m.group(2)) * _UNIT_S[m.group(3)]))
        if not 0 <= max_failed_fraction <= 1:
            raise ValueError("max_failed_fraction must be in [0, 1]")
        return cls(tuple(sorted(targets)), dict(class_deadlines_ms or {}), max_failed_fraction)

    @property
    def defined(self) -> bool:
        return bool(self.targets or self.class_deadlines_ms)

    @property
    def bound_s(self) -> float | None:
        """Latency bound of one request for goodput: the highest percentile's target."""
        return self.targets[-1][1] if self.targets else None

    def describe(self) -> str:
        parts = [f"{_q(q)} <= {_ms(b * 1000)}" for q, b in self.targets]
        parts += [f"{c} p99 <= {_ms(ms)}" for c, ms in sorted(self.class_deadlines_ms.items())]
        return ", ".join(parts) if parts else "none"

    def misses(self, overall: Figures, by_class: dict[str, Figures]) -> list[str]:
        """Why a step's figures miss the SLA (empty: met)."""
        out = []
        lat = overall.latency
        for q, bound in self.targets:
            if lat is None:
                out.append(f"{_q(q)}: no responses")
            elif lat.at(q) > bound * 1000.0:
                out.append(f"{_q(q)} {_ms(lat.at(q))} > {_ms(bound * 1000)}")
        for cls_name, ms in sorted(self.class_deadlines_ms.items()):
            fig = by_class.get(cls_name)
            if fig is not None and fig.latency is not None and fig.latency.p99_ms > ms:
                out.append(f"{cls_name} p99 {_ms(fig.latency.p99_ms)} > {_ms(ms)}")
        if overall.failed_fraction > self.max_failed_fraction:
            out.append(f"{overall.failed_fraction:.1%} failed > {self.max_failed_fraction:.1%}")
        return out


@dataclass(frozen=True)
class StepVerdict:
    index: int
    load: float
    valid: bool
    within_sla: bool | None  # None: no SLA given
    late: bool  # the generator fell behind its schedule: a miss may be its own fault
    misses: tuple[str, ...]
    offered_rps: float
    goodput_rps: float
    p99_ms: float | None
    problems: tuple[str, ...] = ()  # why the step is invalid, as the report lists it
    lateness_p99_ms: float | None = None  # the generator's own p99 lateness sending it


@dataclass(frozen=True)
class Knee:
    step: int | None  # index of the rated step, None when there is none
    load: float | None
    offered_rps: float | None
    goodput_rps: float | None
    p99_ms: float | None
    lower_bound: bool  # every step met the SLA: the true capacity is at least this
    summary: str


def find_knee(verdicts: list[StepVerdict], unit: str, sla: SLA) -> Knee:
    """The highest step of the unbroken passing run from the bottom (module doc), sorted by load."""
    if not sla.defined:
        return Knee(None, None, None, None, None, False, "No SLA given (--sla or --class-sla): no knee computed.")
    ordered = sorted(verdicts, key=lambda v: v.load)
    best, stop = None, None
    for v in ordered:
        if not v.valid or not v.within_sla:
            stop = v
            break
        best = v
    if best is None:
        assert stop is not None
        return Knee(
            None,
            None,
            None,
            None,
            None,
            False,
            f"No rated capacity: the lowest step ({_load(stop.load, unit)}) {_why(stop)}.",
        )
    head = (
        f"Rated capacity {_load(best.load, unit)}: p99 {_ms(best.p99_ms)} within SLA ({sla.describe()}), "
        f"goodput {best.goodput_rps:.1f} req/s"
    )
    if stop is None:
        return Knee(
            best.index,
            best.load,
            best.offered_rps,
            best.goodput_rps,
            best.p99_ms,
            True,
            head + f"; every step met the SLA, so capacity is at least this (sweep higher). "
            f"Alert at 80%: {_load(0.8 * best.load, unit)}.",
        )
    if _untrusted(stop):
        tail = f"; the next step ({_load(stop.load, unit)}) {_why(stop)}: capacity may be higher."
    else:
        tail = f"; at {_load(stop.load, unit)} it broke ({'; '.join(stop.misses)})."
    later = [v for v in ordered if v.load > stop.load and v.valid and v.within_sla]
    if later:
        tail += f" (Step at {_load(later[0].load, unit)} passed again; not counted.)"
    return Knee(
        best.index,
        best.load,
        best.offered_rps,
        best.goodput_rps,
        best.p99_ms,
        False,
        head + tail + f" Alert at 80%: {_load(0.8 * best.load, unit)}.",
    )


def _untrusted(v: StepVerdict) -> bool:
    """A step whose miss may be the generator's doing (late), or that is invalid yet met the SLA."""
    return v.late or (not v.valid and bool(v.within_sla))


def _why(v: StepVerdict) -> str:
    if v.late and v.lateness_p99_ms is not None:
        # On a shared or busy machine the generator, not the target, misses its schedule: say so, and the knob.
        suggest = math.ceil(v.lateness_p99_ms * 1.5 / 5) * 5
        return (
            f"was invalid: the load generator fell behind its own schedule (p99 sender lateness "
            f"{v.lateness_p99_ms:.1f} ms, above --max-lateness-ms); on a busy machine rerun with "
            f"--max-lateness-ms {suggest:g}, or with less load per generator process"
        )
    if _untrusted(v):
        detail = "; ".join(v.problems) or "the generator fell behind its schedule or could not send it all"
        return f"was invalid ({detail})"
    return f"missed the SLA ({'; '.join(v.misses)})"


def cost(goodput_rps: float | None, gpus: float, usd_per_gpu_hour: float | None) -> dict | None:
    """GPU-hours (and USD when priced) per million good requests at `goodput_rps`."""
    if not goodput_rps or goodput_rps <= 0 or gpus <= 0:
        return None
    gpu_hours = gpus * 1e6 / (goodput_rps * 3600.0)
    usd = None if usd_per_gpu_hour is None else gpu_hours * usd_per_gpu_hour
    return {
        "gpus": gpus,
        "usd_per_gpu_hour": usd_per_gpu_hour,
        "goodput_rps": goodput_rps,
        "gpu_hours_per_million_good": gpu_hours,
        "usd_per_million_good": usd,
    }


def _q(q: float) -> str:
    return "max" if q == 100.0 else f"p{q:g}"


def _ms(ms: float | None) -> str:
    if ms is None:
        return "n/a"
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.0f} ms" if ms >= 10 else f"{ms:.2f} ms"


def _load(load: float, unit: str) -> str:
    return f"{load:g} req/s" if unit == "rps" else f"{load:g} users"
