"""Drive load at a URL and report latency, goodput and the knee (rated capacity).

Theory of operation: parse flags into the library's values (Mix, Plan, Trace,
Target, SLA), pre-flight the target (one request per endpoint, so a wrong URL
fails at once with a message), run the trace under trio with a progress
display, then analyze and write the JSON document, the Markdown report and the
plots. Ctrl-C stops the run and still writes what was measured (exit 130).

    rampmeter loadtest http://127.0.0.1:8000 --rate 50:400:50 --step-s 10 --sla p99=500ms
    rampmeter loadtest http://127.0.0.1:8000 --mode closed --users 1,4,16,64 --think-ms 200
    rampmeter loadtest compare before/loadtest.json after/loadtest.json --out cmp
    rampmeter loadtest shapes

Exit status: 0 when the run happened (whatever the SLA verdict), 2 on bad input
or an unusable target, 3 with --strict when a step is invalid, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys

import trio

from proxy.loadtest import compare as compare_mod
from proxy.loadtest import jsonl, preflight, progress, report, shapes
from proxy.loadtest.outputs import write_outputs
from proxy.loadtest.runner import Runner, RunResult
from proxy.loadtest.trace import Plan, build_trace, parse_loads
from proxy.loadtest.transport import PROTOCOLS, Target
from proxy.loadtest.verdict import SLA, parse_duration_ms


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "url",
        metavar="URL",
        help="target http://HOST:PORT[/PREFIX]; or 'compare' A.json B.json ...; "
        "or 'shapes' to list the built-in request shapes",
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="with 'compare': result JSON files")
    g = p.add_argument_group("load")
    g.add_argument("--protocol", choices=PROTOCOLS, default="http1", help="HTTP/1.1 or cleartext HTTP/2 (h2c)")
    g.add_argument(
        "--mode",
        choices=("open", "closed"),
        default="open",
        help="open: arrivals at a rate, latency from the intended send time; closed: N users",
    )
    g.add_argument("--rate", metavar="LOADS", help="open loop: req/s per step, 'A,B,C' or 'START:STOP:STEP'")
    g.add_argument("--users", metavar="LOADS", help="closed loop: users per step, 'A,B,C' or 'START:STOP:STEP'")
    g.add_argument("--step-s", type=float, default=10.0, help="how long each step is held")
    g.add_argument("--warmup-s", type=float, default=2.0, help="start of each step left out of the figures")
    g.add_argument("--arrival", choices=("poisson", "constant"), default="poisson", help="open-loop arrivals")
    g.add_argument("--think-ms", type=float, default=0.0, help="closed loop: mean think time between requests")
    g.add_argument(
        "--think",
        choices=("constant", "exponential"),
        default="exponential",
        help="closed loop: think-time distribution",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the trace (arrivals, shape draws, keys)")
    w = p.add_argument_group("workload")
    w.add_argument(
        "--mix",
        default="short_chat",
        help="NAME[@CLASS][=WEIGHT],... of built-in shapes "
        f"({', '.join(shapes.BUILTIN_NAMES)}); CLASS goes out as x-priority",
    )
    w.add_argument("--jsonl", metavar="FILE", help="request bodies, one per line (replaces --mix; see docs)")
    w.add_argument("--model", help="'model' field to put in request bodies that have none")
    w.add_argument(
        "--idempotency",
        choices=("none", "unique"),
        default="none",
        help="send an idempotency-key: none, or unique per request",
    )
    w.add_argument(
        "--dup-fraction",
        type=float,
        default=0.0,
        help="with --idempotency unique: share of requests that repeat a recent one (same key and body)",
    )
    s = p.add_argument_group("SLA and cost")
    s.add_argument("--sla", help="percentile targets, e.g. p99=500ms or p99=500ms,p50=200ms")
    s.add_argument(
        "--class-sla",
        action="append",
        default=[],
        metavar="CLASS=DURATION",
        help="per-class deadline, e.g. interactive=300ms (sent as x-request-timeout-ms; repeatable)",
    )
    s.add_argument(
        "--max-failed-fraction",
        type=float,
        default=0.01,
        help="a step with more non-2xx/failed requests than this misses the SLA",
    )
    s.add_argument("--gpu-cost-per-hour", type=float, help="USD per GPU-hour, for cost per million good requests")
    s.add_argument("--gpus", type=float, default=1.0, help="GPUs behind the target")
    c = p.add_argument_group("client")
    c.add_argument("--timeout-ms", type=float, default=30_000.0, help="client timeout from the intended send time")
    c.add_argument("--connections", type=int, default=1, help="h2c: connections to spread streams over")
    c.add_argument(
        "--max-in-flight",
        type=int,
        default=10_000,
        help="requests in flight at most (h1: connections); past it the step is invalid",
    )
    c.add_argument(
        "--max-lateness-ms",
        type=float,
        default=10.0,
        help="a step whose sender lateness p99 is above this is marked invalid",
    )
    c.add_argument(
        "--precise-timing",
        action="store_true",
        help="release requests within microseconds of their intended time (busy-waits the last 1 ms)",
    )
    c.add_argument("--no-json-check", action="store_true", help="accept 2xx bodies that are not JSON")
    c.add_argument("--no-preflight", action="store_true", help="skip the one-request-per-endpoint check")
    o = p.add_argument_group("output")
    o.add_argument(
        "--out",
        help="directory for loadtest.json, report.md and the plots (default: loadtest-out); "
        "with 'compare': write the overlay plot compare.png there (none without --out)",
    )
    o.add_argument("--json", metavar="FILE", help="write the JSON document here instead of OUT/loadtest.json")
    o.add_argument("--markdown", metavar="FILE", help="write the Markdown report here instead of OUT/report.md")
    o.add_argument("--no-plots", action="store_true", help="do not draw PNG plots")
    o.add_argument("--records", action="store_true", help="include per-request records in the JSON")
    o.add_argument("--name", help="what reports and comparisons call this target (default: the URL)")
    o.add_argument(
        "--progress",
        choices=("auto", "rich", "plain", "none"),
        default="auto",
        help="live display: rich on a terminal, plain lines otherwise",
    )
    o.add_argument("--strict", action="store_true", help="exit 3 when any step is invalid")


def _fail(message: str) -> int:
    print(f"rampmeter loadtest: {message}", file=sys.stderr)
    return 2


def _class_deadlines(items: list[str]) -> dict[str, int]:
    out = {}
    for item in (x for raw in items for x in raw.split(",") if x.strip()):
        name, sep, dur = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"bad --class-sla {item!r}: want CLASS=DURATION, e.g. interactive=300ms")
        out[name.strip()] = max(1, round(parse_duration_ms(dur)))
    return out


def build(args: argparse.Namespace):
    """Flags -> (trace, target, sla); ValueError/JsonlError/OSError with a message for the user."""
    deadlines = _class_deadlines(args.class_sla)
    if args.jsonl:
        mix = jsonl.load(args.jsonl, model=args.model).with_class_deadlines(deadlines)
    else:
        mix = shapes.Mix.parse(args.mix, model=args.model, class_deadlines_ms=deadlines)
    spec = args.rate if args.mode == "open" else args.users
    other = args.users if args.mode == "open" else args.rate
    if other:
        raise ValueError(f"--{'users' if args.mode == 'open' else 'rate'} does not apply to --mode {args.mode}")
    if not spec:
        raise ValueError(f"--mode {args.mode} needs --{'rate' if args.mode == 'open' else 'users'}")
    plan = Plan.sweep(
        parse_loads(spec),
        step_s=args.step_s,
        warmup_s=args.warmup_s,
        mode=args.mode,
        arrival=args.arrival,
        think_ms=args.think_ms,
        think=args.think,
    )
    trace = build_trace(plan, mix, args.seed, idempotency=args.idempotency, dup_fraction=args.dup_fraction)
    target = Target(
        args.url,
        protocol=args.protocol,
        name=args.name or "",
        connections=args.connections,
        max_in_flight=args.max_in_flight,
        timeout_s=args.timeout_ms / 1000.0,
        check_json=not args.no_json_check,
    )
    sla = SLA.parse(args.sla, class_deadlines_ms=deadlines, max_failed_fraction=args.max_failed_fraction)
    return trace, target, sla


async def _main(trace, target, args) -> RunResult:
    if not args.no_preflight:
        for warning in await preflight.preflight(target, trace.mix):
            print(f"rampmeter loadtest: warning: {warning}", file=sys.stderr)
    shown = progress.make(args.progress)
    runner = Runner(trace, target, progress=shown, precise=args.precise_timing)
    async with trio.open_nursery() as nursery:

        async def on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    print("\nrampmeter loadtest: interrupted; writing what was measured", file=sys.stderr)
                    runner.stop()
                    return

        nursery.start_soon(on_signal)
        try:
            result = await runner.run()
        finally:
            close = getattr(shown, "close", None)  # RichProgress has one, PlainProgress none
            if close is not None:
                close()
        nursery.cancel_scope.cancel()
    return result


def _run_test(args: argparse.Namespace) -> int:
    if args.files:
        return _fail(f"unexpected arguments {' '.join(args.files)} (only 'compare' takes files)")
    try:
        trace, target, sla = build(args)
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    try:
        result = trio.run(_main, trace, target, args)
    except preflight.TargetError as exc:
        return _fail(str(exc))
    analysis = result.analyze(
        sla, max_lateness_ms=args.max_lateness_ms, gpus=args.gpus, usd_per_gpu_hour=args.gpu_cost_per_hour
    )
    command = "rampmeter loadtest " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["loadtest"] else sys.argv[1:])
    doc = report.document(result, analysis, command=command, records=args.records)
    written = write_outputs(
        doc, args.out or "loadtest-out", json_path=args.json, markdown_path=args.markdown, with_plots=not args.no_plots
    )
    _print_summary(doc, written)
    if result.interrupted:
        return 130
    return 3 if args.strict and not doc["valid"] else 0


def _print_summary(doc: dict, written: dict) -> None:
    unit = "req/s" if doc["plan"]["unit"] == "rps" else "users"
    for s in doc["steps"]:
        f = s["overall"]
        lat = f["latency_ms"] or {}
        p50, p99, p999 = (f"{lat[q]:.1f}" if lat else "-" for q in ("p50", "p99", "p99.9"))
        print(
            f"step {s['index']}: {s['load']:g} {unit}: offered {f['offered_rps']:.1f}/s, goodput "
            f"{f['goodput_rps']:.1f}/s, p50 {p50} p99 {p99} p99.9 {p999} ms, "
            f"2xx {f['ok']}/{f['requests']}" + ("" if s["valid"] else f"  INVALID: {'; '.join(s['invalid_reasons'])}")
        )
    print(doc["knee"]["summary"])
    if doc.get("cost"):
        print(
            f"Cost: {doc['cost']['gpu_hours_per_million_good']:.3g} GPU-hours per million good requests"
            + (f" (${doc['cost']['usd_per_million_good']:.2f})" if doc["cost"]["usd_per_million_good"] else "")
        )
    print("wrote " + ", ".join(str(p) for p in written.values()))


def _compare(args: argparse.Namespace) -> int:
    if len(args.files) < 2:
        return _fail("compare needs at least two result files: rampmeter loadtest compare A.json B.json")
    try:
        text, plot = compare_mod.compare(args.files, None if args.no_plots else args.out)
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    print(text)
    if plot is not None:
        print(f"wrote {plot}")
    return 0


def _shapes() -> int:
    for name in shapes.BUILTIN_NAMES:
        s = shapes.builtin(name)
        print(f"{name:18} {s.path:22} {'stream ' if s.stream else ''}{len(s.body)} body bytes")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.url == "compare":
        return _compare(args)
    if args.url == "shapes":
        return _shapes()
    return _run_test(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rampmeter loadtest", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
