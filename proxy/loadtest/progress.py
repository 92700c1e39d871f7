"""Progress while a load test runs: a rich live panel on a terminal, plain lines otherwise.

Theory of operation: the runner calls `step_started(run, runner)`,
`tick(runner)` every half second and `step_ended(run, runner)`; a progress
object only reads the runner's cheap live counters (`Runner.statistics()`) and,
once per step, the rows already finished (a p99 "so far": the report's figures
are computed after the run, exactly). Plain mode prints one line per step, for
logs and CI; rich mode redraws a small table. Output goes to stderr so stdout
stays for the summary.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from proxy.loadtest.records import NOT_SENT, OK
from proxy.loadtest.stats import percentile


def _p99_so_far(run: Any) -> float | None:
    rec = run.records
    lat = sorted(rec.end[i] - rec.intended[i] for i in range(len(rec)) if rec.status[i] and rec.error[i] == OK)
    return percentile(lat, 99) * 1000.0 if lat else None


def _late_p99(run: Any) -> float | None:
    return percentile(sorted(run.lateness), 99) * 1000.0 if len(run.lateness) else None


def _unit(runner: Any) -> str:
    return "req/s" if runner.trace.plan.mode == "open" else "users"


def _step_counts(run: Any) -> tuple[int, int]:
    """Finished rows of a step that came back 2xx, and those that did not."""
    rec, ok, failed = run.records, 0, 0
    for i in range(len(rec)):
        if rec.error[i] != NOT_SENT:  # NOT_SENT: not sent yet, or still in flight
            if rec.error[i] == OK and 200 <= rec.status[i] < 300:
                ok += 1
            else:
                failed += 1
    return ok, failed


class PlainProgress:
    def __init__(self, out: TextIO = sys.stderr) -> None:
        self.out = out

    def step_started(self, run: Any, runner: Any) -> None:
        print(
            f"step {run.index}: {run.load:g} {_unit(runner)} for {run.duration_s:g} s (warm-up {run.warmup_s:g} s)",
            file=self.out,
            flush=True,
        )

    def tick(self, runner: Any) -> None:
        pass

    def step_ended(self, run: Any, runner: Any) -> None:
        s = runner.statistics()
        p99, late = _p99_so_far(run), _late_p99(run)
        ok, failed = _step_counts(run)
        print(
            f"  done: sent {len(run.records)}, 2xx {ok}, failed {failed}, in flight {s['in_flight']}, "
            f"p99 so far {'-' if p99 is None else f'{p99:.1f} ms'}, "
            f"sender lateness p99 {'-' if late is None else f'{late:.1f} ms'}"
            + (f", {run.backlogged} waited at the in-flight cap" if run.backlogged else ""),
            file=self.out,
            flush=True,
        )


class RichProgress:
    def __init__(self, out: TextIO = sys.stderr) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=out)
        self.live = Live(console=self.console, refresh_per_second=4, transient=False)
        self.rows: list[tuple[str, ...]] = []
        self.current: tuple[str, ...] = ()
        self.started = False

    def _render(self) -> Any:
        from rich.table import Table

        table = Table(title="rampmeter loadtest", expand=False)
        for col in ("step", "load", "sent", "2xx", "failed", "in flight", "p99 so far", "lateness p99"):
            table.add_column(col, justify="right")
        for row in [*self.rows, self.current] if self.current else self.rows:
            table.add_row(*row)
        return table

    def step_started(self, run: Any, runner: Any) -> None:
        if not self.started:
            self.live.start()
            self.started = True
        self.tick(runner)

    def tick(self, runner: Any) -> None:
        s, run = runner.statistics(), runner.live.step
        if run is None:
            return
        late = _late_p99(run)
        self.current = (
            str(run.index),
            f"{run.load:g} {_unit(runner)}",
            f"{s['sent']} (run)",
            f"{s['ok']} (run)",
            f"{s['failed']} (run)",
            str(s["in_flight"]),
            "...",
            "-" if late is None else f"{late:.1f} ms",
        )
        self.live.update(self._render())

    def step_ended(self, run: Any, runner: Any) -> None:
        s = runner.statistics()
        p99, late = _p99_so_far(run), _late_p99(run)
        ok, failed = _step_counts(run)
        self.rows.append(
            (
                str(run.index),
                f"{run.load:g} {_unit(runner)}",
                str(len(run.records)),
                str(ok),
                str(failed),
                str(s["in_flight"]),
                "-" if p99 is None else f"{p99:.1f} ms",
                "-" if late is None else f"{late:.1f} ms",
            )
        )
        self.current = ()
        self.live.update(self._render())

    def close(self) -> None:
        if self.started:
            self.live.stop()


def make(kind: str = "auto", out: TextIO = sys.stderr) -> PlainProgress | RichProgress | None:
    """ "auto" (rich on a terminal, else plain), "rich", "plain" or "none"."""
    if kind == "none":
        return None
    if kind == "rich" or (kind == "auto" and out.isatty()):
        return RichProgress(out)
    return PlainProgress(out)
