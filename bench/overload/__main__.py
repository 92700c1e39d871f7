"""`python -m bench.overload [--quick] [--out DIR]`: the sweep, interleaved, then the report.

Theory of operation: start the tapped pod (CPU 1, with this process, the generator)
and one sidecar per sidecar configuration (CPU 0), wait for /readyz; for every load
step run each configuration in turn on the same traces (bench.overload.step), then
the latency controls; write result.json / result.md / goodput.png (bench.common).
Exit 0 when it measured, whatever the targets say; non-zero if it could not.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import httpx
import trio

from bench.common import parse_args, pin, write_result
from bench.overload import (
    CONFIGS,
    FULL_LOADS,
    NAME,
    POD_PROFILE,
    POLICIES,
    QUICK_LOADS,
    SHAPES,
    capacity_rps,
)
from bench.overload import __doc__ as DOC
from bench.overload.pod import PodProcess
from bench.overload.report import fmt_ms, fmt_pct, markdown, plot, step_figures, targets_for
from bench.overload.step import Timing, class_traces, controls, run_step
from proxy import loadtest as lt
from proxy.testing.procs import Proc, ProcFailed, wait_for


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _sidecar(config: str, pod_url: str) -> Proc:
    argv = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--upstream",
        pod_url,
        "--policy",
        POLICIES[config],
        "--log-level",
        "warning",
    ]
    proc = Proc(argv, cpu=0, name=f"sidecar-{config}")
    wait_for(lambda: _ready(proc.url("admin") + "/readyz"), timeout_s=30)
    return proc


def measure(
    configs: tuple[str, ...], loads_x: tuple[float, ...], capacity: float, timing: Timing
) -> tuple[dict, dict | None]:
    """Every (step, configuration), interleaved; then the latency controls. Returns (runs, controls)."""
    traces = class_traces(loads_x, capacity, timing)
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    control = None
    pod = PodProcess(cpu=1)
    procs: dict[str, Proc] = {}
    try:
        for config in configs:
            if config != "direct":
                procs[config] = _sidecar(config, pod.url)
        for i, load in enumerate(loads_x):
            for config in configs:
                proc = procs.get(config)
                url, admin = (pod.url, None) if proc is None else (proc.url(), proc.url("admin"))
                raw = trio.run(run_step, url, admin, pod.url, {k: t.subset([i]) for k, t in traces.items()}, timing)
                runs[config].append(fig := step_figures(raw, load))
                print(
                    f"bench.overload: {config:>14} {load:g}x offered {fig['offered_rps']:.1f} goodput "
                    f"{fig['goodput_rps']:.1f} wasted {fmt_pct(fig['wasted_fraction'])} shed p99 "
                    f"{fmt_ms(fig['shed']['p99_ms'])} ms expired fwd {fig['tap']['expired']}",
                    file=sys.stderr,
                )
        if "full" in procs:
            control = trio.run(controls, pod.url, procs["full"].url(), min(timing.measured_s, 10.0))
    finally:
        for proc in procs.values():
            proc.stop()
        pod.stop()
    return runs, control


def _options(p) -> None:
    p.add_argument("--loads", help="comma-separated multiples of capacity (default 0.5,1,1.5,2,2.5; --quick 1,2)")
    p.add_argument("--configs", default=",".join(CONFIGS), help="which of direct,admission_only,full to run")
    p.add_argument("--full-policy", default=POLICIES["full"], help="policy file of the full configuration")
    p.add_argument(
        "--admission-only-policy",
        default=POLICIES["admission_only"],
        help="policy file of the admission-only configuration",
    )


def main() -> int:
    args = parse_args(NAME, DOC, _options)
    POLICIES.update(full=args.full_policy, admission_only=args.admission_only_policy)
    configs = tuple(c for c in CONFIGS if c in args.configs.split(","))
    loads_x = (
        tuple(float(x) for x in args.loads.split(",")) if args.loads else QUICK_LOADS if args.quick else FULL_LOADS
    )
    timing = Timing(2.0, 6.0) if args.quick else Timing(5.0, 15.0)
    pinning = "sidecars on CPU 0, pod and load generator " + pin(1).replace("pinned to", "on")
    capacity = capacity_rps()
    try:
        runs, control = measure(configs, loads_x, capacity, timing)
    except (ProcFailed, TimeoutError) as exc:
        sys.exit(f"bench.overload: could not start what it measures: {exc}")
    targets, peak = targets_for(runs)
    meta = {"pinning": pinning, "loadavg": ", ".join(f"{x:.2f}" for x in os.getloadavg()), "controls": control}
    plot(runs, peak, capacity, Path(args.out) / "goodput.png")
    doc = {
        "capacity_rps": capacity,
        "peak_goodput_rps_up_to_target_load": peak,
        "loads_x": list(loads_x),
        "timing": dataclasses.asdict(timing),
        "profile": dataclasses.asdict(POD_PROFILE),
        "mix": lt.Mix(SHAPES).describe(),
        "policies": dict(POLICIES),
        **meta,
        "configs": runs,
    }
    out = write_result(args, doc, targets, markdown(runs, peak, capacity, meta))
    print((out / "result.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
