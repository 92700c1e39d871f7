"""`python -m bench.grpc [--quick] [--out DIR]`: run the cases of bench.grpc (module doc), write the report.

Exit 0 when it measured, whatever the targets say; non-zero if a process could not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from bench.common import cpu_seconds, keep_awake, parse_args, pin, target, write_result
from bench.grpc import CONCURRENCY, NAME, RATE, RATES, SLEEP_MS, SLOTS
from bench.grpc import __doc__ as DOC
from bench.grpc.load import closed_loop, open_loop, outcome, retrying_options
from proxy.testing.grpc_servicer import SERVICE
from proxy.testing.procs import READY_PREFIX, Proc, wait_for

GRPC_HEALTH = 'health_check = "grpc"'
POLICY = """
[warmup]
{warmup}
health_interval_s = 0.5

[slow_start]
window_s = 0

[limits]
kind = "fixed"
initial_limit = {slots}
min_limit = 1
max_limit = {slots}
dispatch_batch = {dispatch_batch}

[tenants]
enabled = false
{extra}"""

# The overload case's sidecar: a queue of a few service times, so work that would wait longer is
# refused at once (UNAVAILABLE + grpc-retry-pushback-ms) instead of expiring in the queue.
OVERLOAD_POLICY = """
[classes.interactive]
max_queue_length = 16
max_queue_wait_ms = 250
"""

# --triton: the shipped Triton policy for the identical and fixed-rate cases; for the overload
# case the bench's own (a fixed limit of two batches) with a queue of two batches / 500 ms.
TRITON_POLICY = Path(__file__).resolve().parents[2] / "policies" / "triton-grpc.toml"
TRITON_DELAY_S = 0.01  # per batch, for the latency case: what is added shows above the model's own time
TRITON_RATE = 100
TRITON_OVERLOAD_DELAY_S = 0.2  # the recipe's default: 16 per 0.2 s, 80 calls/s
TRITON_OVERLOAD_POLICY = """
[classes.interactive]
max_queue_length = {queue}
max_queue_wait_ms = 500
"""


class Servicer:
    """bench.grpc.server in its own process (CPU 1 when there is one)."""

    def __init__(self, slots: int) -> None:
        cmd = [sys.executable, "-m", "bench.grpc.server", str(slots)]
        if (os.cpu_count() or 1) > 1:
            cmd = ["taskset", "-c", "1", *cmd]
        self.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        if not line.startswith(READY_PREFIX):
            self.popen.kill()
            raise SystemExit(f"bench.grpc: the servicer did not start ({line!r})")
        self.target = line.split('"data": "')[1].split('"')[0]

    def close(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            self.popen.kill()


def sidecar(
    upstream: str,
    slots: int,
    tmp: Path,
    extra: str = "",
    policy: Path | None = None,
    warmup: str = GRPC_HEALTH,
    dispatch_batch: int = 1,
) -> Proc:
    """The sidecar in front of `upstream`, with POLICY (a fixed limit of `slots`, the [warmup] lines
    `warmup`, limits.dispatch_batch) or the file `policy`."""
    if policy is None:
        policy = tmp / f"policy-{slots}.toml"
        policy.write_text(POLICY.format(slots=slots, extra=extra, warmup=warmup, dispatch_batch=dispatch_batch))
    argv = ["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--upstream-protocol", "h2c"]
    proc = Proc(
        [*argv, "--upstream", f"http://{upstream}", "--policy", str(policy)], cpu=0, name="sidecar", ready_timeout_s=60
    )
    wait_for(lambda: _ok(proc.url("admin") + "/readyz"), timeout_s=60)
    return proc


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def rejections(proc: Proc) -> float:
    text = httpx.get(proc.url("admin") + "/metrics", timeout=30).text  # a starved sidecar answers late
    return sum(float(v) for v in re.findall(r"^rampmeter_rejections_total\{[^}]*\} (\S+)$", text, re.M))


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def fixed_rate(
    direct: str, via: str, car: Proc, rounds: int, seconds: float, rate: int, call: tuple = ("Unary", b"x" * 100)
) -> dict:
    """`call`: (method, payload[, service]) of the unary call, default the servicer's Unary."""
    method, payload, *service = call
    runs: dict[str, list] = {"direct": [], "sidecar": []}
    for _ in range(rounds):
        for name, address in (("direct", direct), ("sidecar", via)):
            before = cpu_seconds(car.popen.pid)
            run = asyncio.run(
                open_loop(address, method, payload, rate, seconds, service=(service or [SERVICE])[0], warm=True)
            )
            cpu = cpu_seconds(car.popen.pid) - before
            runs[name].append(
                {
                    "calls": run.calls,
                    "ok": run.ok,
                    "p50_ms": quantile(run.latencies_ms, 0.5),
                    "p99_ms": quantile(run.latencies_ms, 0.99),
                    "sidecar_cpu_us_per_call": cpu * 1e6 / max(1, run.calls) if name == "sidecar" else None,
                }
            )
    return runs


def max_rate(direct: str, via: str, car: Proc, rounds: int, seconds: float) -> dict:
    runs: dict[str, list] = {"direct": [], "sidecar": []}
    for _ in range(rounds):
        for name, address in (("direct", direct), ("sidecar", via)):
            before = cpu_seconds(car.popen.pid)
            run = asyncio.run(closed_loop(address, "Unary", b"x" * 100, CONCURRENCY, seconds))
            cpu = cpu_seconds(car.popen.pid) - before
            runs[name].append(
                {
                    "calls_per_s": run.ok / run.seconds,
                    "sidecar_cpu_us_per_call": cpu * 1e6 / max(1, run.calls) if name == "sidecar" else None,
                }
            )
    return runs


def overload(
    direct: str,
    via: str,
    car: Proc,
    seconds: float,
    *,
    call: tuple = ("Sleep", b"%d" % SLEEP_MS, SERVICE),
    slots: int = SLOTS,
    capacity: float = SLOTS * 1000.0 / SLEEP_MS,
    settle=None,
) -> dict:
    """Peak goodput through the sidecar: the better of closed loops with `slots` and 2x `slots` calls in
    flight (the second keeps its queue full, so its dispatch, limits.dispatch_batch included, is what is
    measured); then 2x `capacity` open loop; `settle()` before each case (a server that keeps computing
    abandoned calls: wait them out)."""
    method, payload, service = call
    peaks = []
    for clients in (slots, 2 * slots):
        peak_run = asyncio.run(closed_loop(via, method, payload, clients, seconds, service=service))
        peaks.append(peak_run.ok / peak_run.seconds)
    peak = max(peaks)
    out = {
        "capacity_calls_per_s": capacity,
        "peak_goodput_calls_per_s": peak,
        "peak_goodput_by_clients": dict(zip((slots, 2 * slots), peaks, strict=True)),
        "offered_calls_per_s": 2 * capacity,
    }
    cases = (
        ("direct", direct, retrying_options(service=service)),
        ("sidecar", via, retrying_options(service=service)),
        ("sidecar, no retry policy", via, None),
    )
    if settle is not None:
        # A server that keeps computing abandoned calls: direct at 2x leaves thousands of them (MLServer,
        # full run: ~4,700, minutes of work in its small batches, past what settle() waits), and the
        # sidecar's cases would run behind that backlog. Direct goes last; the sidecar's cases leave
        # only the calls cut at their deadline.
        cases = (*cases[1:], cases[0])
    for name, address, options in cases:
        if settle is not None:
            out.setdefault("settled_s", {})[name] = settle()
        before, cpu_before = rejections(car), cpu_seconds(car.popen.pid)
        run = asyncio.run(
            open_loop(address, method, payload, 2 * capacity, seconds, timeout=5.0, options=options, service=service)
        )
        through = name != "direct"
        rejected_attempts = rejections(car) - before if through else 0.0
        busy = (cpu_seconds(car.popen.pid) - cpu_before) / run.seconds if through else None
        ended_rejected = sum(run.reasons.values())
        out[name] = {
            "calls": run.calls,
            "ok": run.ok,
            "goodput_calls_per_s": run.goodput(),
            "goodput_over_peak": run.goodput() / peak if peak else None,
            "codes": dict(run.codes),
            "ended_rejected_by_reason": dict(run.reasons),
            "sidecar_rejected_attempts": rejected_attempts,
            "retried_share": (rejected_attempts - ended_rejected) / rejected_attempts if rejected_attempts else None,
            "p50_ms": quantile(run.latencies_ms, 0.5),
            "p99_ms": quantile(run.latencies_ms, 0.99),
            "sidecar_cpu_share": busy,  # of one core, while the calls ran
        }
    return out


def peak_words(over: dict) -> str:
    by = over["peak_goodput_by_clients"]
    return (
        f"peak goodput through the sidecar {over['peak_goodput_calls_per_s']:.1f} calls/s (closed loop, the better "
        f"of {' and '.join(map(str, by))} clients: {' / '.join(f'{v:.1f}' for v in by.values())})"
    )


def med(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def fmt(v: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}{unit}"


def _flags(p) -> None:
    p.add_argument("--triton", action="store_true", help="also run against a real Triton (PyTriton, ../shared/servers)")
    p.add_argument("--mlserver", action="store_true", help="also run against MLServer (../shared/servers)")
    p.add_argument(
        "--triton-only",
        action="store_true",
        help="only the real servers' cases: PyTriton, or those --triton / --mlserver name",
    )
    p.add_argument(
        "--keep-awake",
        action="store_true",
        help="a SCHED_IDLE busy loop on the sidecar's core, so it never halts between calls (module doc)",
    )


def fixed_rows(fixed: dict) -> tuple[list[str], dict]:
    rows, added = [], {}
    for rate, runs_at in fixed.items():
        p50 = {k: med(v, "p50_ms") for k, v in runs_at.items()}
        p99 = {k: med(v, "p99_ms") for k, v in runs_at.items()}
        a50 = None if None in p50.values() else p50["sidecar"] - p50["direct"]
        a99 = None if None in p99.values() else p99["sidecar"] - p99["direct"]
        added[rate] = (a50, a99)
        cpu = med(runs_at["sidecar"], "sidecar_cpu_us_per_call")
        rows.append(
            f"| unary at {rate} calls/s: p50 / p99 | {fmt(p50['direct'])} / {fmt(p99['direct'])} ms "
            f"| {fmt(p50['sidecar'])} / {fmt(p99['sidecar'])} ms | {fmt(a50)} / {fmt(a99)} ms | {fmt(cpu, ' us', 0)} |"
        )
    return rows, added


def overload_rows(over: dict) -> list[str]:
    md = [
        "| | goodput calls/s | of peak | codes | sidecar-rejected attempts | retried after pushback | OK p50 / p99 "
        "| sidecar CPU (of a core) |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for name in ("direct", "sidecar", "sidecar, no retry policy"):
        o = over[name]
        share = o["retried_share"]
        md.append(
            f"| {name} | {o['goodput_calls_per_s']:.1f} | {fmt(o['goodput_over_peak'])} | {o['codes']} "
            f"| {o['sidecar_rejected_attempts']:.0f} | {'-' if share is None else f'{share * 100:.0f}%'} "
            f"| {fmt(o['p50_ms'], '', 0)} / {fmt(o['p99_ms'], '', 0)} ms | {fmt(o['sidecar_cpu_share'])} |"
        )
    return md


def servicer_cases(stack: contextlib.ExitStack, tmp: Path, rounds: int, seconds: float) -> tuple[dict, list, list]:
    """The grpcio servicer's cases (module doc): runs, targets, report lines."""
    servicer = Servicer(SLOTS)
    stack.callback(servicer.close)
    car = stack.enter_context(sidecar(servicer.target, 256, tmp))
    via = car.url("data").removeprefix("http://")
    identical = outcome(servicer.target) == outcome(via)
    fixed = {rate: fixed_rate(servicer.target, via, car, rounds, seconds, rate) for rate in RATES}
    maxed = max_rate(servicer.target, via, car, rounds, seconds / 2)
    car.stop()
    tight = stack.enter_context(sidecar(servicer.target, SLOTS, tmp, OVERLOAD_POLICY))
    over = overload(servicer.target, tight.url("data").removeprefix("http://"), tight, 2 * seconds)
    tight.stop()

    rows, added = fixed_rows(fixed)
    rate = {k: med(v, "calls_per_s") for k, v in maxed.items()}
    cpu_max = med(maxed["sidecar"], "sidecar_cpu_us_per_call")
    rows.append(
        f"| max calls/s, {CONCURRENCY} in flight | {fmt(rate['direct'], '', 0)} | {fmt(rate['sidecar'], '', 0)} "
        f"| | {fmt(cpu_max, ' us', 0)} |"
    )
    runs = {"identical": identical, "fixed_rate": fixed, "max_rate": maxed, "overload": over}
    targets = [
        target("identical_direct_and_sidecar", 1.0 if identical else 0.0, "==", 1.0),
        target(f"added_p99_ms_at_{RATE}_calls_per_s", added.get(RATE, (None, None))[1], "<=", 2.0),
        target("goodput_at_2x_over_peak", over["sidecar"]["goodput_over_peak"], ">=", 0.9),
    ]
    md = [
        "| case | direct | sidecar | added | sidecar CPU per call |",
        "|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"Identical results direct and through the sidecar (unary, server stream, error + trailers): {identical}.",
        "",
        f"Overload: Sleep {SLEEP_MS} ms, {SLOTS} at once (capacity {over['capacity_calls_per_s']:.0f} calls/s), "
        f"sidecar limit {SLOTS}; {peak_words(over)}; offered {over['offered_calls_per_s']:.0f} calls/s open loop, clients with a gRPC retry policy "
        "(UNAVAILABLE, 5 attempts, 10 ms backoff) except where it says none, 5 s deadline; goodput is OK calls "
        "ended per second within the offered window (its first second left out). The load generator shares CPU 1 "
        "with the servicer: every retried attempt takes CPU from the servicer too.",
        "",
        *overload_rows(over),
    ]
    return runs, targets, md


def triton_cases(
    stack: contextlib.ExitStack, tmp: Path, rounds: int, seconds: float, recipe
) -> tuple[dict, list, list]:
    """A real KServe v2 server (bench/grpc/triton.py `recipe`): identical results, added latency, overload goodput."""
    from bench.grpc import triton as tr

    call = (tr.METHOD, tr.infer_request(), tr.SERVICE)
    target_ = recipe.grpc_target
    with tr.RealServer(recipe, TRITON_DELAY_S, tmp) as _:
        policy = tmp / f"{recipe.name}-grpc.toml"  # the shipped policy, without slow start (a bench starts cold)
        text = TRITON_POLICY.read_text().replace("127.0.0.1:8001", target_)
        text = text.replace('health_check = "grpc"\ngrpc_health_service = ""', recipe.warmup)
        text = text.replace("\ndispatch_batch = 1\n", f"\ndispatch_batch = {recipe.dispatch_batch}\n")  # as it says
        policy.write_text(text + "\n[slow_start]\nwindow_s = 0\n")
        car = stack.enter_context(sidecar(target_, 0, tmp, policy=policy))
        via = car.url("data").removeprefix("http://")
        identical, seen = tr.identical(target_, via)
        fixed = {TRITON_RATE: fixed_rate(target_, via, car, rounds, seconds, TRITON_RATE, call)}
        car.stop()
    slots = 2 * tr.MAX_BATCH  # one batch running, one forming (the shipped policy's limit too)
    capacity = tr.MAX_BATCH / TRITON_OVERLOAD_DELAY_S
    with tr.RealServer(recipe, TRITON_OVERLOAD_DELAY_S, tmp) as server:
        extra = TRITON_OVERLOAD_POLICY.format(queue=slots)
        tight = stack.enter_context(
            sidecar(target_, slots, tmp, extra, warmup=recipe.warmup, dispatch_batch=recipe.dispatch_batch)
        )
        over = overload(
            target_, tight.url("data").removeprefix("http://"), tight, 2 * seconds,
            call=call, slots=slots, capacity=capacity, settle=server.wait_idle,
        )  # fmt: skip
        tight.stop()
    rows, added = fixed_rows(fixed)
    runs = {"identical": identical, "seen_direct": seen, "fixed_rate": fixed, "overload": over}
    targets = [
        target(f"{recipe.name}_identical_direct_and_sidecar", 1.0 if identical else 0.0, "==", 1.0),
        target(f"{recipe.name}_goodput_at_2x_over_peak", over["sidecar"]["goodput_over_peak"], ">=", 0.9),
    ]
    health = "gRPC health" if "grpc" in recipe.warmup else "HTTP /v2/health/ready on its HTTP port"
    md = [
        f"## {recipe.label} (../shared/servers recipe, model tiny: x2 after {TRITON_DELAY_S * 1000:g} ms per batch, "
        f"batches up to {tr.MAX_BATCH}), ModelInfer; sidecar running policies/{TRITON_POLICY.name} "
        f"(slow start off; {health})",
        "",
        "| case | direct | sidecar | added | sidecar CPU per call |",
        "|---|---:|---:|---:|---:|",
        *rows,
        "",
        f"Identical results direct and through the sidecar (tritonclient[grpc]: model metadata, 4 ModelInfer "
        f"outputs, an unknown model's status and message): {identical}.",
        "",
        f"Overload: {TRITON_OVERLOAD_DELAY_S * 1000:g} ms per batch of up to {tr.MAX_BATCH} (capacity "
        f"{capacity:.0f} calls/s), sidecar limit {slots} (dispatch_batch {recipe.dispatch_batch}), class queue {slots} / 500 ms; "
        f"{peak_words(over)}; offered "
        f"{over['offered_calls_per_s']:.0f} calls/s open loop, as above.",
        "",
        *overload_rows(over),
    ]
    return runs, targets, md


def real_servers(args) -> list:
    """The recipes to run (--triton: PyTriton, --mlserver: MLServer; --triton-only alone: PyTriton)."""
    from bench.grpc import triton as tr

    chosen = [r for r, on in ((tr.PYTRITON, args.triton), (tr.MLSERVER, args.mlserver)) if on]
    return chosen or ([tr.PYTRITON] if args.triton_only else [])


def main() -> None:
    args = parse_args(NAME, DOC, _flags)
    pinned = pin(1)
    rounds, seconds = (2, 4.0) if args.quick else (5, 15.0)
    runs: dict = {"pinning": pinned, "keep_awake": args.keep_awake}
    targets: list = []
    sections: list[str] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rampmeter-bench-grpc-")))
        if args.keep_awake:
            stack.enter_context(keep_awake(0))
        if not args.triton_only:
            runs["servicer"], t, md = servicer_cases(stack, tmp, rounds, seconds)
            targets += t
            sections += md
        for recipe in real_servers(args):
            runs[recipe.name], t, md = triton_cases(stack, tmp, rounds, seconds, recipe)
            targets += t
            sections += ["", *md]
    head = [
        f"# bench.grpc{' (quick)' if args.quick else ''}",
        "",
        f"Load generator {pinned} (grpc.aio), sidecar on CPU 0, grpcio servicer on CPU 1; "
        f"{rounds} interleaved rounds of {seconds:g} s;"
        f"{' the sidecar core kept awake (--keep-awake: a SCHED_IDLE busy loop);' if args.keep_awake else ''}"
        f" load average at the end {os.getloadavg()[0]:.1f} "
        "(a shared, busy machine: CPU us per call is the figure that survives it).",
        "",
    ]
    out = write_result(args, runs, targets, "\n".join(head + sections))
    print((out / "result.md").read_text())


if __name__ == "__main__":
    main()
