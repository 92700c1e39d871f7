"""Direct vs FCFS vs SJF with aging (vs an oracle): one seeded chat trace, side by side.

Theory of operation: the simulated pod (llm profile, outputs that stop early)
serves an 80/20 short/long chat mix (proxy/testing/scheduling.py). Sidecars
in front of it differ only in queue order, all with the same fixed concurrency
limit, so the queue forms in the sidecar and only the order it admits in
differs. `compare` replays the same trace at every target, step by step in
turn (A B C A B C ...), so drift on a shared machine hits all alike; the
oracle's trace has the same arrivals and shapes, plus true-service-time hints.

`run_demo` is what `make demo` calls: it starts what it is not given (pod,
FCFS and SJF sidecars, with generated policies), measures the pod's capacity
with a short closed loop at its plateau, replays ~0.9 of it for `seconds` per
configuration, prints a table (short and long p50/p99, goodput) and writes
`scheduling.png`. bench/scheduling.py reuses every piece with the oracle,
several load levels and a measured limit.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import trio

from proxy import loadtest as lt
from proxy.loadtest.closed import LEAD_S
from proxy.simpod.profiles import Profile, get_profile
from proxy.testing import scheduling as sc
from proxy.testing.procs import Proc, wait_for

SPEED = 2.0  # the llm profile with every engine time halved: the pod sustains ~70 req/s of this mix
STOP_MEAN_TOKENS = 200  # geometric output lengths, capped at max_tokens (profile default 0: always max_tokens)
# bench.scheduling's 95%-of-peak rule picks 32 or 40 on this pod (docs/admission.md); at 32 a 0.9 load
# leaves a queue in the sidecar for the order to work on, at 40 hardly any.
DEMO_LIMIT = 32
CAPACITY_USERS = 64  # concurrency at which the demo pod's throughput has plateaued (KV cache full)
_TITLES = {"direct": "direct", "fcfs": "rampmeter FCFS", "sjf": "rampmeter SJF+aging", "oracle": "oracle SJF"}


def demo_profile(speed: float = SPEED, stop_mean_tokens: float = STOP_MEAN_TOKENS) -> Profile:
    return get_profile("llm", speed=speed, stop_mean_tokens=stop_mean_tokens)


def pod_argv(profile: Profile, seed: int) -> list[str]:
    return [
        "sim-pod",
        "--listen",
        "127.0.0.1:0",
        "--profile",
        profile.name,
        "--speed",
        f"{profile.speed:g}",
        "--stop-mean-tokens",
        f"{profile.stop_mean_tokens:g}",
        "--seed",
        str(seed),
    ]


@contextlib.contextmanager
def sidecars(
    pod_url: str, policies: dict[str, str], policy_dir: str | Path, cpu: int | None = None
) -> Iterator[dict[str, Proc]]:
    """One `rampmeter serve` per policy text, in front of `pod_url`, each ready (/readyz 200) when yielded."""
    with contextlib.ExitStack() as stack:
        procs = {}
        for name, text in policies.items():
            path = Path(policy_dir) / f"policy-{name}.toml"
            path.write_text(text)
            argv = [
                "serve",
                "--policy",
                str(path),
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--upstream",
                pod_url,
                "--log-level",
                "warning",
            ]
            procs[name] = stack.enter_context(Proc(argv, cpu=cpu, name=f"sidecar-{name}"))
        for proc in procs.values():
            wait_for(lambda p=proc: _ok(p.url("admin") + "/readyz"), timeout_s=20)
        yield procs


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).is_success
    except httpx.HTTPError:
        return False


def measure_capacity(
    pod_url: str, mix: lt.Mix, profile: Profile, seed: int, users: list[int], step_s: float, warmup_s: float
) -> list[dict]:
    """Closed loop straight at the pod, one run per concurrency: what it delivers there.

    Throughput is read from the pod's own output-token counter over the measured
    window, divided by the tokens a request of the mix truly generates: counting
    completions instead would swing by the luck of how many long answers happen
    to end inside a window of a few seconds.
    """
    per_request = sc.mean_output_tokens(mix, profile, seed)
    rows = []
    for n in users:
        plan = lt.Plan.sweep([n], step_s=step_s, warmup_s=warmup_s, mode="closed")
        trace = lt.build_trace(plan, mix, seed=seed)
        tokens, result = trio.run(_counted_run, pod_url, trace, warmup_s, step_s)
        step = result.analyze(lt.SLA()).steps[0]
        rows.append(
            {
                "users": n,
                "capacity_rps": tokens / (step_s - warmup_s) / per_request,
                "output_tokens_per_s": tokens / (step_s - warmup_s),
                "completed_rps": step.overall.achieved_rps,
                "p50_ms": step.overall.latency.p50_ms if step.overall.latency else None,
            }
        )
    return rows


async def _counted_run(pod_url: str, trace: lt.Trace, warmup_s: float, step_s: float) -> tuple[int, lt.RunResult]:
    """Run `trace` and count the pod's generated tokens between warm-up end and step end."""
    marks: list[int] = []

    async def count(at: float) -> None:
        await trio.sleep_until(at)
        stats = await trio.to_thread.run_sync(lambda: httpx.get(pod_url + "/sim/stats", timeout=5).json())
        marks.append(stats["output_tokens"])

    async with trio.open_nursery() as nursery:
        start = trio.current_time() + LEAD_S  # when the runner sends the first request
        nursery.start_soon(count, start + warmup_s)
        nursery.start_soon(count, start + step_s)
        result = await lt.run(trace, lt.Target(pod_url, timeout_s=120))
    return marks[1] - marks[0], result


def choose_limit(sweep: list[dict], fraction: float) -> tuple[int, float]:
    """(smallest concurrency delivering `fraction` of the best throughput, the best throughput)."""
    best = max(r["capacity_rps"] for r in sweep)
    return min(r["users"] for r in sweep if r["capacity_rps"] >= fraction * best), best


async def _interleave(pairs: list[tuple[lt.Trace, lt.Target]], after_step=None) -> list[lt.RunResult]:
    """run_interleaved with one trace per target (same arrivals and shapes; the oracle's carry hints).

    `after_step(target_name, step_index)`, if given, runs (in a thread) after each target's step.
    """
    merged: list[lt.RunResult | None] = [None] * len(pairs)
    for index in range(len(pairs[0][0].steps)):
        for k, (trace, target) in enumerate(pairs):
            part = await lt.run(trace.subset([index]), target)
            if after_step is not None:
                await trio.to_thread.run_sync(after_step, target.name, index)
            if merged[k] is None:
                part.trace = trace
                merged[k] = part
            else:
                merged[k].merge(part)  # type: ignore[union-attr]  # set in the branch above
    return merged  # type: ignore[return-value]


def compare(
    targets: dict[str, str],
    mixes: dict[str, lt.Mix],
    loads: list[float],
    step_s: float,
    warmup_s: float,
    seed: int,
    timeout_s: float = 120.0,
    after_step=None,
) -> dict[str, lt.RunResult]:
    """Replay one seeded open-loop Poisson trace per load at every target, interleaved step by step."""
    plan = lt.Plan.sweep(loads, step_s=step_s, warmup_s=warmup_s)
    traces = {name: lt.build_trace(plan, mixes[name], seed=seed) for name in targets}
    first = next(iter(traces.values()))
    for t in traces.values():  # the hints must not change who arrives when
        assert all(
            a.offsets == b.offsets and a.choices == b.choices for a, b in zip(t.steps, first.steps, strict=False)
        )
    pairs = [(traces[n], lt.Target(url, name=n, timeout_s=timeout_s)) for n, url in targets.items()]
    return dict(zip(targets, trio.run(_interleave, pairs, after_step), strict=True))


def table(figures: dict[str, list[dict]], step: int) -> str:
    """Markdown table of one load level: per configuration, per-class mean/p50/p99 and goodput."""
    head = (
        "| configuration | short mean | short p50 | short p99 | long mean | long p50 | long p99 | all mean "
        "| goodput short/long/all (req/s) |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, steps in figures.items():
        s = steps[step]
        cells = [_ms(s[c][k]) for c in sc.CLASSES for k in ("mean_ms", "p50_ms", "p99_ms")]
        good = "/".join(f"{s[c]['goodput_rps']:.1f}" for c in (*sc.CLASSES, "all"))
        lines.append(f"| {_TITLES.get(name, name)} | {' | '.join(cells)} | {_ms(s['all']['mean_ms'])} | {good} |")
    return "\n".join(lines)


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms")


def plot(figures: dict[str, list[dict]], sla: dict[str, float], path: str | Path, title: str = "") -> Path:
    """p50 and p99 latency per class and configuration, log scale, SLA dotted: lines against the
    offered load when there are several levels, bars side by side for one."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.6), dpi=110, layout="constrained")
    axes = fig.subplots(1, 2)
    single = len(next(iter(figures.values()))) == 1
    for ax, cls in zip(axes, sc.CLASSES, strict=True):
        (_bars if single else _lines)(ax, figures, cls)
        ax.axhline(sla[cls], color="grey", linestyle=":", label=f"SLA {sla[cls]:.0f} ms")
        ax.set_yscale("log")
        ax.set_ylabel("latency (ms)")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title)
    fig.savefig(path)
    return Path(path)


def _lines(ax, figures: dict[str, list[dict]], cls: str) -> None:
    for i, (name, steps) in enumerate(figures.items()):
        xs = [s["load"] for s in steps]
        for key, style in (("p99_ms", "-"), ("p50_ms", "--")):
            ax.plot(
                xs,
                [s[cls][key] for s in steps],
                style,
                marker="o",
                color=f"C{i}",
                label=f"{_TITLES.get(name, name)} {key[:3]}",
            )
    ax.set_title(f"{cls}: p50 (dashed), p99 (solid)")
    ax.set_xlabel("offered load (req/s)")


def _bars(ax, figures: dict[str, list[dict]], cls: str) -> None:
    names = list(figures)
    for k, (key, hatch) in enumerate((("p50_ms", ""), ("p99_ms", "//"))):
        xs = [i + (k - 0.5) * 0.38 for i in range(len(names))]
        ax.bar(
            xs,
            [figures[n][0][cls][key] or 0 for n in names],
            width=0.36,
            hatch=hatch,
            color=[f"C{i}" for i in range(len(names))],
            edgecolor="black",
            label=key[:3],
        )
    ax.set_xticks(range(len(names)), [_TITLES.get(n, n) for n in names], fontsize=8)
    ax.set_title(f"{cls}: p50 (plain), p99 (hatched)")


def run_demo(
    pod_url: str | None = None,
    fcfs_url: str | None = None,
    sjf_url: str | None = None,
    *,
    out_dir: str | Path = "demo-out",
    seconds: float = 25.0,
    load: float = 0.9,
    limit: int = DEMO_LIMIT,
    capacity_s: float = 10.0,
    seed: int = 1,
    echo=print,
) -> dict:
    """The side-by-side demo (see the module doc); returns {"load_rps", "capacity_rps", "limit", "figures"}.

    `figures[config][0][cls]` holds mean_ms, p50_ms, p99_ms, goodput_rps for cls in short_chat, long_chat,
    all. Given URLs are used as they are: a given pod should run `pod_argv(demo_profile(speed), seed)`,
    a given sidecar `sc.policy_toml(order, limit, profile)`; missing ones are started here and stopped
    at the end.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mix = sc.chat_mix()
    with contextlib.ExitStack() as stack:
        if pod_url is None:
            profile = demo_profile()
            pod_url = stack.enter_context(Proc(pod_argv(profile, seed), name="sim-pod")).url()
        else:
            profile = demo_profile(speed=httpx.get(pod_url + "/sim/stats", timeout=5).json()["speed"])
        urls = {"fcfs": fcfs_url, "sjf": sjf_url}
        missing = {n: sc.policy_toml(n, limit, profile) for n, u in urls.items() if u is None}
        if missing:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="rampmeter-demo-"))
            procs = stack.enter_context(sidecars(pod_url, missing, tmp))
            urls |= {n: p.url() for n, p in procs.items()}
        echo(f"measuring the pod's capacity ({CAPACITY_USERS} requests at once, {capacity_s:g} s) ...")
        capacity = measure_capacity(
            pod_url, mix, profile, seed, [CAPACITY_USERS], step_s=capacity_s, warmup_s=min(3.0, capacity_s / 3)
        )[0]["capacity_rps"]
        rate = round(load * capacity, 1)
        echo(f"  {capacity:.1f} req/s; replaying {rate} req/s ({load:g}x) for {seconds:g} s per configuration")
        targets = {"direct": pod_url, **{n: u for n, u in urls.items() if u is not None}}  # all started by now
        results = compare(
            targets, dict.fromkeys(targets, mix), [rate], step_s=seconds, warmup_s=min(5.0, seconds / 5), seed=seed
        )
    sla = sc.sla_ms(profile)
    figures = {n: sc.class_figures(r, sla) for n, r in results.items()}
    echo(
        f"\nshort chat SLA {sla[sc.SHORT]:.0f} ms, long chat SLA {sla[sc.LONG]:.0f} ms; "
        f"limit {limit} for both sidecars\n" + table(figures, 0)
    )
    plot(figures, sla, out / "scheduling.png", f"{rate} req/s ({load:g}x capacity), limit {limit}")
    echo(f"plot: {out / 'scheduling.png'}")
    return {"load_rps": rate, "capacity_rps": capacity, "limit": limit, "figures": figures}


if __name__ == "__main__":  # python -m proxy.testing.demo_scenario [OUT_DIR]
    import sys

    run_demo(out_dir=sys.argv[1] if len(sys.argv) > 1 else "demo-out")
