"""`python -m bench.real_servers`: calibrate each real server, then direct vs rampmeter, interleaved."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import trio

from bench.common import parse_args, target, write_result
from bench.real_servers import __doc__ as DOC
from bench.real_servers.cases import closed_case, open_case, run_case
from bench.real_servers.servers import SERVERS, RunningServer, ServerFailed, model_name, probe_ms
from proxy.calibrate import CalibrationError, calibrate, check_policy, policy_toml
from proxy.calibrate import cli as calibrate_cli
from proxy.testing.procs import ProcFailed
from proxy.testing.stack import sidecar


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--servers", default="vllm,litserve,pytriton", help=f"comma-separated, of {', '.join(SERVERS)}")
    p.add_argument("--duration-s", type=float, default=None, help="seconds per run (default 10 quick, 30 full)")
    p.add_argument(
        "--min-limit",
        type=int,
        default=None,
        help="experiment: raise the calibrated [limits] min_limit (and initial_limit) to this many requests",
    )
    p.add_argument(
        "--engine-target-waiting",
        type=float,
        default=None,
        help="experiment: the calibrated [limits] engine_target_waiting (requests kept waiting inside vLLM; default 2)",
    )
    p.add_argument(
        "--repeats", type=int, default=None, help="direct / rampmeter pairs per case (default 1 quick, 2 full)"
    )
    p.add_argument(
        "--budget-ms",
        type=int,
        default=None,
        help="the deadline fixed by hand for both sides: the clients' timeout and the policy's default-class budget "
        "(calibrate's other classes and CoDel follow it), instead of the budget calibrate measured",
    )


def main() -> int:
    args = parse_args("real_servers", DOC, add)
    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    unknown = [n for n in names if n not in SERVERS]
    if unknown:
        sys.exit(f"bench: unknown server(s) {', '.join(unknown)}; choose from {', '.join(SERVERS)}")
    duration = args.duration_s or (10.0 if args.quick else 30.0)
    repeats = args.repeats or (1 if args.quick else 2)
    out = Path(args.out)
    runs: dict = {}
    for name in names:
        print(f"== {name}", flush=True)
        try:
            runs[name] = bench_server(
                name, args.quick, duration, repeats, out, args.min_limit, args.engine_target_waiting, args.budget_ms
            )
        except (ServerFailed, ProcFailed, OSError, httpx.HTTPError, CalibrationError) as exc:
            print(f"bench: {name} could not be measured: {exc}", file=sys.stderr)
            return 1
        (out / "partial.json").write_text(json.dumps(runs, indent=2, default=str))
    targets = [t for name in names for t in targets_for(name, runs[name])]
    write_result(args, runs, targets, markdown(runs, args.quick))
    print((out / "result.md").read_text())
    return 0


def bench_server(
    name: str,
    quick: bool,
    duration: float,
    repeats: int,
    out: Path,
    min_limit: int | None,
    target_waiting: float | None = None,
    budget_ms: int | None = None,
) -> dict:
    spec = SERVERS[name]
    with RunningServer(spec, out) as server:
        install_s = server.install()
        start_s = server.start()
        model = model_name(spec.url)
        parser = argparse.ArgumentParser()
        calibrate_cli.add_arguments(parser)
        cal_args = [spec.url, *spec.calibrate_args, *(["--quick"] if quick else [])]
        options = calibrate_cli.options_from(parser.parse_args(cal_args))
        cal = trio.run(calibrate, options)
        # --budget-ms: the same deadline on both sides, fixed by hand (round 1: budgets calibrated at a quiet
        # moment met a slower machine, and the comparison became one of rejections).
        hand = [] if budget_ms is None else ["--budget-ms", str(budget_ms)]
        text = policy_toml(cal, command="rampmeter calibrate " + " ".join([*cal_args, *hand]), budget_ms=budget_ms)
        if min_limit:
            text = with_min_limit(text, min_limit)
        if target_waiting is not None:
            text = with_target_waiting(text, target_waiting)
        policy = check_policy(text)
        policy_path = out / f"{name}.policy.toml"
        policy_path.write_text(text)
        budget = policy.classes[policy.scheduling.default_class].default_timeout_ms
        probe_alone = statistics.median(probe_ms(spec, model) for _ in range(3))
        result: dict = {
            "server": spec.version,
            "habits": spec.habits,
            "install_s": install_s,
            "start_s": start_s,
            "server_cpu_priority": server.cpu_priority,
            "calibrate": {
                "duration_s": cal.duration_s,
                "limit": cal.limit,
                "knee": cal.knee.concurrency,
                "knee_rps": cal.knee.throughput_rps,
                "health": cal.health,
                "stops_on_cancel": cal.stops_on_cancel,
                "engine_gauges": cal.engine_gauges,
                "budget_ms": budget,
                "budget_by_hand": budget_ms is not None,
                "calibrated_turn_ms": cal.turn_ms,
                "policy": str(policy_path),
                "min_limit_override": min_limit,
                "engine_target_waiting_override": target_waiting,
            },
            "probe_alone_ms": probe_alone,
        }
        # No --upstream: it replaces [[upstreams]] whole, and the calibrated upstream table (its URL is
        # spec.url) carries what is measured here: stops_on_cancel and timeout_s.
        with sidecar([], "--log-level", "warning", policy=str(policy_path)) as proc:
            result["sidecar_warm_after_s"] = wait_warm(proc.url("admin"), policy.slow_start.window_s + 30)
            targets = {"direct": (spec.url, None), "rampmeter": (proc.url("data"), proc.popen.pid)}
            cases: dict = {}
            closed = closed_case(spec, model, cal.limit, budget, duration)
            admin = proc.url("admin")
            cases["closed"] = run_case(closed, spec, model, targets, budget, admin, probe_alone, repeats, seed=1)
            capacity = statistics.median(r["achieved_rps"] for r in cases["closed"]["direct"])
            result["capacity_rps"] = capacity
            over = open_case("overload", spec, model, 2.0 * capacity, budget, duration)
            cases["overload"] = run_case(over, spec, model, targets, budget, admin, probe_alone, repeats, seed=2)
            # The load point: 0.9 x what the server answered per second while offered 2 x (its open-loop
            # capacity, see cases.saturated_rps), not 0.9 x the closed loop's rate.
            open_capacity = _median(cases["overload"]["direct"], "saturated_rps") or capacity
            result["open_capacity_rps"] = open_capacity
            if spec.gauges:
                same = open_case("same_throughput", spec, model, 0.9 * open_capacity, budget, duration)
                cases["same_throughput"] = run_case(
                    same, spec, model, targets, budget, admin, probe_alone, repeats, seed=3
                )
            result["cases"] = cases
            stats = httpx.get(proc.url("admin") + "/admin/stats", timeout=10).json()
            (out / f"{name}.admin_stats.json").write_text(json.dumps(stats, indent=2))
    return result


def with_min_limit(text: str, n: int) -> str:
    """The calibrated policy with `[limits] min_limit` (and initial_limit) raised to n: an experiment on the
    floor, marked in the file (the limit never below what fills the engine past the server's front end)."""
    out = []
    for line in text.splitlines():
        key = line.split("=")[0].strip()
        if key in ("min_limit", "initial_limit") and int(line.split("=")[1]) < n:
            line = f"{key} = {n}  # bench.real_servers --min-limit {n} (calibrate wrote {line.split('=')[1].strip()})"
        out.append(line)
    return "\n".join(out) + "\n"


def with_target_waiting(text: str, n: float) -> str:
    """The calibrated policy with `[limits] engine_target_waiting = n` (an experiment, marked in the file)."""
    out = [line for line in text.splitlines() if line.split("=")[0].strip() != "engine_target_waiting"]
    at = out.index("[limits]") + 1
    out.insert(at, f"engine_target_waiting = {n}  # bench.real_servers --engine-target-waiting {n}")
    return "\n".join(out) + "\n"


def wait_warm(admin: str, limit_s: float) -> float:
    """Seconds until /readyz says warm (the slow-start ramp is over): runs compare full limits."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if "warm" in httpx.get(admin + "/readyz", timeout=5).text:
            break
        time.sleep(0.2)
    return time.monotonic() - t0


def _median(runs: list[dict], key: str, shape: str | None = None) -> float | None:
    values = [(r["by_shape"].get(shape, {}) if shape else r).get(key) for r in runs]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def targets_for(name: str, r: dict) -> list[dict]:
    cases = r["cases"]
    closed_sheds = sum(x["sheds"] for x in cases["closed"]["rampmeter"])
    over = cases["overload"]
    good_side, good_direct = _median(over["rampmeter"], "goodput_rps"), _median(over["direct"], "goodput_rps")
    margin = None if good_side is None or good_direct is None else good_side - good_direct
    busy = _median(over["rampmeter"], "backend_busy_after_s")
    out = [
        target(f"{name}_closed_loop_sheds", closed_sheds, "<=", 0),
        target(f"{name}_goodput_rps_rampmeter_minus_direct_at_2x", margin, ">=", 0.0),
        target(f"{name}_backend_busy_after_load_s_at_2x", busy, "<=", 1.0),
    ]
    if "same_throughput" in cases:
        same = cases["same_throughput"]
        d, s = _median(same["direct"], "p50_ms", "short"), _median(same["rampmeter"], "p50_ms", "short")
        out.append(target(f"{name}_short_p50_ratio_direct_over_rampmeter", None if not s else d / s, ">=", 2.0))
        td, ts = _median(same["direct"], "achieved_rps"), _median(same["rampmeter"], "achieved_rps")
        out.append(target(f"{name}_throughput_ratio_rampmeter_over_direct", None if not td else ts / td, ">=", 0.9))
    return out


def _sampled(reps: list[dict], a: str, b: str) -> str:
    """Means of two gauges sampled during the runs (median over repeats), "a / b"; "-" where not read."""

    def mean(key: str) -> float | None:
        values = [r.get("sampled", {}).get(key, {}).get("mean") for r in reps]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    return f"{_fmt(mean(a), '.1f')} / {_fmt(mean(b), '.1f')}"


def _running_while_queued(reps: list[dict], key: str = "running_while_queued") -> float | None:
    """Mean engine running (or waiting) over the readings at which the sidecar queued (median over repeats)."""
    values = [r.get("sampled", {}).get(key) for r in reps]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _pairs(same: dict) -> list[str]:
    """Each direct / rampmeter pair of a case (run back to back): short p50s, their ratio, throughputs."""
    out = []
    for i, (d, s) in enumerate(zip(same.get("direct", []), same.get("rampmeter", []), strict=False)):
        dp, sp = d["by_shape"].get("short", {}).get("p50_ms"), s["by_shape"].get("short", {}).get("p50_ms")
        ratio = None if not dp or not sp else dp / sp
        out.append(
            f"pair {i + 1}: short p50 {_fmt(dp)} direct / {_fmt(sp)} ms through (**{_fmt(ratio, '.2f')}x**), "
            f"long p50 {_fmt(d['by_shape'].get('long', {}).get('p50_ms'))} / "
            f"{_fmt(s['by_shape'].get('long', {}).get('p50_ms'))} ms, "
            f"throughput {d['achieved_rps']:.2f} / {s['achieved_rps']:.2f}/s, "
            f"sidecar queued at {_fmt(100 * (s.get('sampled', {}).get('queued_share') or 0))} % of readings, "
            f"engine waiting {_fmt(d.get('sampled', {}).get('waiting', {}).get('mean'), '.1f')} direct / "
            f"{_fmt(s.get('sampled', {}).get('waiting', {}).get('mean'), '.1f')} through"
        )
    return out


def _fmt(v, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def markdown(runs: dict, quick: bool) -> str:
    lines = [
        "# Real servers: direct vs rampmeter (policy written by `rampmeter calibrate`)",
        "",
        f"{'Quick run' if quick else 'Full run'}; machine: 2 shared CPU cores, busy (other engineers' tests).",
        "Interleaved direct / rampmeter on the same seeded trace; clients give up at the calibrated budget.",
        "",
    ]
    for name, r in runs.items():
        c = r["calibrate"]
        lines += [
            f"## {name}: {r['server']}",
            f"{r['habits']}. CPU priority: {r.get('server_cpu_priority') or 'as started'}. Calibrated in {c['duration_s']:.0f} s: limit {c['limit']} (knee {c['knee']} at "
            f"{c['knee_rps']:.1f}/s), {c['health']}, stops_on_cancel {c['stops_on_cancel']}, "
            f"default budget {c['budget_ms']} ms{' (fixed by hand, --budget-ms)' if c.get('budget_by_hand') else ''}; capacity (direct, closed loop) {r.get('capacity_rps', 0):.1f}/s; "
            f"open-loop capacity (direct answers/s while offered 2x) {r.get('open_capacity_rps') or 0:.1f}/s.",
            "",
            "| case | target | req | ok | good/s | p50 ms | p99 ms | short p50 | long p50 | sheds | other non-2xx "
            "| busy after s | sidecar CPU us/req | engine running / waiting (mean) | sidecar limit / queued (mean) "
            "| engine running / waiting while sidecar queued |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for case, per_target in r.get("cases", {}).items():
            for tname, reps in per_target.items():
                lines.append(
                    f"| {case} | {tname} | {_fmt(_median(reps, 'requests'))} | {_fmt(_median(reps, 'ok'))} "
                    f"| {_fmt(_median(reps, 'goodput_rps'), '.2f')} | {_fmt(_median(reps, 'p50_ms'))} "
                    f"| {_fmt(_median(reps, 'p99_ms'))} | {_fmt(_median(reps, 'p50_ms', 'short'))} "
                    f"| {_fmt(_median(reps, 'p50_ms', 'long'))} | {sum(x['sheds'] for x in reps)} "
                    f"| {sum(x['requests'] - x['ok'] - x['sheds'] for x in reps)} "
                    f"| {_fmt(_median(reps, 'backend_busy_after_s'), '.1f')} "
                    f"| {_fmt(_median(reps, 'sidecar_cpu_us_per_request'))} "
                    f"| {_sampled(reps, 'running', 'waiting')} | {_sampled(reps, 'limit', 'queued')} "
                    f"| {_fmt(_running_while_queued(reps), '.1f')} / "
                    f"{_fmt(_running_while_queued(reps, 'waiting_while_queued'), '.1f')} |"
                )
        lines.append("")
        for case, per_target in r.get("cases", {}).items():
            if case != "closed":
                lines += [f"- {case} " + p for p in _pairs(per_target)]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
