"""Real servers' habits on the sim pod: direct, rampmeter FCFS and rampmeter SJF, side by side.

Issue 12 found rampmeter made things worse on real servers; the sim pod now has their habits
(proxy/simpod/profiles.py). Two of them, each with one seeded trace replayed at every
configuration in turn, step by step (direct, FCFS, SJF, direct, ...):

1. serial (a llama.cpp-style server: one request at a time, first come first served, keeps
   computing after a disconnect), at --speed 5: 80% short chats (16 output tokens, ~66 ms
   alone) / 20% long ones (256 tokens, ~1.03 s). Capacity is the profile's own formula (one
   over the mean service time). a) an open-loop Poisson trace at 0.9 x capacity: short p50
   and long p99 against FCFS's, at the queue's steady state (the trace's first 90 s left
   out); b) a closed loop of 4 clients: nothing may be shed. The sidecars run the default
   policy but for the order and a fixed limit of 1 (the server runs one request at a time):
   default shedding (CoDel in the service time's scale), default classes and budgets (30 s),
   default aging and starvation bound.
2. keeps-computing (LitServe/PyTriton-style: padded batches of up to 8, 25 ms a step, keeps
   computing after a disconnect), at speed 1: 16 clients in a closed loop (100 ms think time),
   half short answers (4 tokens, ~0.15 s in a batch of its own kind) and half long ones (48
   tokens, ~1.6 s), every request with a 600 ms budget (x-request-timeout-ms) that its client
   also keeps (it gives up after 0.7 s and sends the next one). A long answer can never make
   it; in a padded batch a short one waits for the longest. Direct: clients leave, the server
   computes on (zombies), the queue grows. Through rampmeter (fixed limit 8, the batch size;
   stops_on_cancel left at "auto", no engine gauges to learn from): goodput (2xx within the
   budget) and how long the server kept computing after the load stopped (the pod's own
   idle_since, read once it is idle; the next step starts only then).

Pinning: the pod on CPU 0; sidecars and this process (the generator) on CPU 1.
Usage: python -m bench.real_habits [--quick] [--out DIR] [--scheduling KEY=VALUE ...] [--open-s S]
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import httpx

from bench.common import SHED_REASONS, parse_args, pin, target, write_result
from proxy import loadtest as lt
from proxy.loadtest.shapes import Shape, chat_body
from proxy.simpod import get_profile, oracle
from proxy.testing import demo_scenario as demo
from proxy.testing import scheduling as sc
from proxy.testing.procs import Proc

SEED = 11
CHAT = "/v1/chat/completions"
SERIAL_SPEED = 5.0  # faster, the sidecar's hop between two requests becomes a gap the serial server idles in
# The serial case's open loop is measured at its steady state: at rho 0.9 FCFS's mean wait starts at 0 and
# reaches ~90% of its steady value (~3.7 s) only after ~90 s (M/G/1 with this mix, averaged over 400 seeded
# traces), so a full run leaves the first 90 s out and measures the next 150 s. --quick (40 s) is a smoke run.
FULL = {"open_s": 240.0, "open_warmup_s": 90.0, "repeats": 3, "closed_s": 40.0, "keeps_s": 40.0, "keeps_warmup_s": 5.0}
QUICK = {"open_s": 40.0, "open_warmup_s": 4.0, "repeats": 1, "closed_s": 20.0, "keeps_s": 20.0, "keeps_warmup_s": 4.0}
KEEPS_BUDGET_MS = 600
KEEPS_CLIENT_TIMEOUT_S = 0.7
KEEPS_USERS, KEEPS_THINK_MS = 16, 100.0


def mix(short_tokens: int, long_tokens: int, short_share: float, deadline_ms: int | None = None) -> lt.Mix:
    return lt.Mix(
        (
            Shape(sc.SHORT, CHAT, chat_body(20, short_tokens), deadline_ms=deadline_ms, weight=short_share),
            Shape(sc.LONG, CHAT, chat_body(20, long_tokens), deadline_ms=deadline_ms, weight=1.0 - short_share),
        )
    )


def pod_argv(profile: str, speed: float) -> list[str]:
    return ["sim-pod", "--listen", "127.0.0.1:0", "--profile", profile, "--speed", f"{speed:g}", "--seed", str(SEED)]


def policy(order: str, limit: int, scheduling: tuple[str, ...] = ()) -> str:
    """The default policy but for the order and a fixed limit (health checks a little faster), plus any
    `[scheduling]` KEY = VALUE lines an experiment names (--scheduling)."""
    return "\n".join(
        [
            "[warmup]",
            "health_interval_s = 0.5",
            "[gpu]",
            "enabled = false",
            "[scheduling]",
            f'order = "{order}"',
            *scheduling,
            "[limits]",
            'kind = "fixed"',
            f"initial_limit = {limit}",
            "min_limit = 1",
            "",
        ]
    )


def rejections(admin_url: str) -> dict[str, int]:
    stats = httpx.get(admin_url + "/admin/stats", timeout=10).json()
    out = dict(stats["admission"]["counts"]["rejected"])
    for reason, n in stats["shedding"]["shed"].items():
        out[reason] = out.get(reason, 0) + n
    return out


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def serial(args, conf: dict) -> dict:
    profile = get_profile("serial", speed=SERIAL_SPEED)
    m = mix(16, 256, 0.8)
    alone = {s.name: oracle(CHAT, s.body, profile).service_s * 1000.0 for s in m.shapes}
    mean_ms = 0.8 * alone[sc.SHORT] + 0.2 * alone[sc.LONG]
    capacity = 1000.0 / mean_ms
    sla = {sc.SHORT: 20 * alone[sc.SHORT], sc.LONG: 5 * alone[sc.LONG]}
    run: dict = {"profile": "serial", "speed": SERIAL_SPEED, "alone_ms": alone, "capacity_rps": capacity, "sla_ms": sla}
    with Proc(pod_argv("serial", SERIAL_SPEED), cpu=0, name="sim-pod") as pod:
        policies = {o: policy(o, 1, tuple(args.scheduling)) for o in ("fcfs", "sjf")}
        where = Path(args.out) / "serial"
        where.mkdir(exist_ok=True)
        with demo.sidecars(pod.url(), policies, where, cpu=1) as procs:
            targets = {"direct": pod.url(), **{n: p.url() for n, p in procs.items()}}
            mixes = dict.fromkeys(targets, m)
            load = round(0.9 * capacity, 2)
            reps = []
            for k in range(conf["repeats"]):
                before = {n: rejections(p.url("admin")) for n, p in procs.items()}
                res = demo.compare(targets, mixes, [load], conf["open_s"], conf["open_warmup_s"], SEED + k, 600.0)
                reps.append(
                    {
                        "seed": SEED + k,
                        "figures": {n: sc.class_figures(r, sla)[0] for n, r in res.items()},
                        "rejected": {n: _delta(rejections(p.url("admin")), before[n]) for n, p in procs.items()},
                    }
                )
            run["open_load_rps"], run["open_repeats"], run["open_s"] = load, reps, conf["open_s"]
            run["open_warmup_s"] = conf["open_warmup_s"]
            run["closed4"] = closed_loop(targets, procs, m, conf["closed_s"], sla)
            run["admission"] = {
                n: httpx.get(p.url("admin") + "/admin/stats", timeout=10).json()["admission"]["models"]
                for n, p in procs.items()
            }
    return run


def closed_loop(targets: dict[str, str], procs: dict, m: lt.Mix, step_s: float, sla: dict) -> dict:
    """4 clients, each sending again the moment it is answered: nothing may be shed."""
    plan = lt.Plan.sweep([4], step_s=step_s, warmup_s=2.0, mode="closed")
    trace = lt.build_trace(plan, m, seed=SEED)
    out = {}
    for name, url in targets.items():
        before = rejections(procs[name].url("admin")) if name in procs else {}
        result = lt.run_sync(trace, lt.Target(url, name=name, timeout_s=600.0))
        step = result.analyze(lt.SLA()).steps[0].overall
        fig = sc.class_figures(result, sla)[0]
        out[name] = {
            "requests": step.requests,
            "ok": step.ok,
            "status": dict(step.status),
            "reasons": dict(step.reasons),
            "figures": fig,
            "rejected": _delta(rejections(procs[name].url("admin")), before) if name in procs else {},
        }
    return out


class Drain:
    """after_step hook: wait until the pod is idle; how long it kept computing after the load stopped."""

    def __init__(self, pod_url: str) -> None:
        self.pod_url = pod_url
        self.after_s: dict[str, list[float]] = {}
        self.stats: dict[str, list[dict]] = {}

    def __call__(self, name: str, index: int) -> None:
        stopped = time.monotonic()
        deadline = stopped + 300.0
        while True:
            s = httpx.get(self.pod_url + "/sim/stats", timeout=10).json()
            if s["running"] == 0 and s["waiting"] == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the pod did not go idle within 300 s")
            time.sleep(0.05)
        idle_at = time.monotonic() - s["idle_for_s"]
        self.after_s.setdefault(name, []).append(max(0.0, idle_at - stopped))
        self.stats.setdefault(name, []).append(
            {k: s[k] for k in ("requests_orphaned", "wasted_client_gone_s", "wasted_deadline_s", "useful_s")}
        )
        httpx.post(self.pod_url + "/sim/reset-stats", timeout=10)


def keeps_computing(args, conf: dict) -> dict:
    m = mix(4, 48, 0.5, deadline_ms=KEEPS_BUDGET_MS)
    run: dict = {"profile": "keeps-computing", "speed": 1.0, "users": KEEPS_USERS, "think_ms": KEEPS_THINK_MS}
    run |= {"budget_ms": KEEPS_BUDGET_MS, "client_timeout_s": KEEPS_CLIENT_TIMEOUT_S}
    sla = dict.fromkeys(sc.CLASSES, float(KEEPS_BUDGET_MS))
    with Proc(pod_argv("keeps-computing", 1.0), cpu=0, name="sim-pod") as pod:
        policies = {o: policy(o, 8, tuple(args.scheduling)) for o in ("fcfs", "sjf")}
        where = Path(args.out) / "keeps-computing"
        where.mkdir(exist_ok=True)
        with demo.sidecars(pod.url(), policies, where, cpu=1) as procs:
            targets = {"direct": pod.url(), **{n: p.url() for n, p in procs.items()}}
            plan = lt.Plan.sweep([KEEPS_USERS], step_s=conf["keeps_s"], warmup_s=conf["keeps_warmup_s"], mode="closed")
            plan = lt.Plan(plan.steps, mode="closed", think_ms=KEEPS_THINK_MS)
            trace = lt.build_trace(plan, m, seed=SEED)
            drain = Drain(pod.url())
            before = {n: rejections(p.url("admin")) for n, p in procs.items()}
            out = {}
            for name, url in targets.items():
                result = lt.run_sync(trace, lt.Target(url, name=name, timeout_s=KEEPS_CLIENT_TIMEOUT_S))
                drain(name, 0)
                step = result.analyze(lt.SLA()).steps[0].overall
                fig = sc.class_figures(result, sla)[0]
                out[name] = {
                    "requests": step.requests,
                    "ok": step.ok,
                    "status": dict(step.status),
                    "reasons": dict(step.reasons),
                    "errors": dict(step.errors),
                    "goodput_rps": fig["all"]["goodput_rps"],
                    "figures": fig,
                    "work_after_stop_s": drain.after_s[name][0],
                    "pod": drain.stats[name][0],
                }
            for n, p in procs.items():
                out[n]["rejected"] = _delta(rejections(p.url("admin")), before[n])
                adm = httpx.get(p.url("admin") + "/admin/stats", timeout=10).json()["admission"]
                out[n]["phantoms"] = adm["phantoms"] | {"counted": adm["counts"]["phantoms"]}
                out[n]["censored"] = {r: v.get("censored") for r, v in adm["models"].items() if v.get("censored")}
            run["configs"] = out
    return run


def _r(a, b):
    return None if a is None or b in (None, 0) else a / b


def serial_ratios(fig: dict) -> dict:
    return {
        "short_p50_ratio_fcfs_over_sjf": _r(fig["fcfs"][sc.SHORT]["p50_ms"], fig["sjf"][sc.SHORT]["p50_ms"]),
        "long_p99_ratio_sjf_over_fcfs": _r(fig["sjf"][sc.LONG]["p99_ms"], fig["fcfs"][sc.LONG]["p99_ms"]),
    }


def targets_of(run: dict) -> list[dict]:
    per = [serial_ratios(rep["figures"]) for rep in run["serial"]["open_repeats"]]
    med = {k: statistics.median([p[k] for p in per if p[k] is not None] or [0.0]) for k in per[0]}
    c4 = run["serial"]["closed4"]
    keeps = run["keeps"]["configs"]
    out = [
        target("serial_0.9_short_p50_ratio_fcfs_over_sjf", med["short_p50_ratio_fcfs_over_sjf"], ">=", 3.0),
        target("serial_0.9_long_p99_ratio_sjf_over_fcfs", med["long_p99_ratio_sjf_over_fcfs"], "<=", 1.3),
    ]
    for n in ("fcfs", "sjf"):
        sheds = sum(v for k, v in c4[n]["rejected"].items() if k in SHED_REASONS)
        out.append(target(f"serial_closed4_sheds_{n}", float(sheds), "==", 0.0))
    for n in ("fcfs", "sjf"):
        ratio = _r(keeps[n]["goodput_rps"], keeps["direct"]["goodput_rps"])
        if ratio is None:  # direct got nothing through: any goodput at all beats it
            ratio = float("inf") if keeps[n]["goodput_rps"] > 0 else 1.0
        out.append(target(f"keeps_goodput_ratio_{n}_over_direct", ratio, ">=", 1.0))
        out.append(target(f"keeps_work_after_stop_s_{n}", keeps[n]["work_after_stop_s"], "<=", 1.0))
    return out


def _ms(v) -> str:
    return demo._ms(v)


def markdown(run: dict, pinning: str) -> str:
    s, k = run["serial"], run["keeps"]
    lines = [
        "# real_habits",
        "",
        f"Generator {pinning}, sidecars on CPU 1, pod on CPU 0. Load average at the end: {os.getloadavg()[0]:.2f}.",
        "",
        f"## serial (one at a time, FIFO, keeps computing), speed {s['speed']:g}",
        "",
        (
            f"Alone: short {s['alone_ms'][sc.SHORT]:.1f} ms, long {s['alone_ms'][sc.LONG]:.1f} ms; capacity "
            f"{s['capacity_rps']:.2f} req/s; open-loop Poisson at 0.9 x = {s['open_load_rps']:g} req/s for "
            f"{s.get('open_s', 0):g} s a seed (the first {s.get('open_warmup_s', 0):g} s left out), limit 1, "
            "default policy otherwise."
        ),
    ]
    for rep in s["open_repeats"]:
        lines += ["", f"Seed {rep['seed']}:", "", demo.table({n: [f] for n, f in rep["figures"].items()}, 0), ""]
        lines.append(
            "Ratios: "
            + ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in serial_ratios(rep["figures"]).items())
            + "; rejected: "
            + "; ".join(f"{n} {r or 'none'}" for n, r in rep["rejected"].items())
        )
    lines += ["", "Closed loop of 4:", "", "| configuration | requests | ok | short p50 | long p99 | rejected |"]
    lines.append("|---|---:|---:|---:|---:|---|")
    for n, c in s["closed4"].items():
        f = c["figures"]
        lines.append(
            f"| {n} | {c['requests']} | {c['ok']} | {_ms(f[sc.SHORT]['p50_ms'])} | {_ms(f[sc.LONG]['p99_ms'])} "
            f"| {c['rejected'] or 'none'} |"
        )
    lines += [
        "",
        "## keeps-computing (padded batches of 8, keeps computing after a disconnect), speed 1",
        "",
        (
            f"{k['users']} clients, closed loop, {k['think_ms']:g} ms think time; 50% short (4 tokens) / 50% long "
            f"(48 tokens); budget {k['budget_ms']} ms sent and kept by the client ({k['client_timeout_s']} s timeout). "
            "Limit 8 for the sidecars."
        ),
        "",
        "| configuration | requests | ok | goodput req/s | short p50 | backend work after the load stopped | "
        "orphans | phantom leases | answers |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n, c in k["configs"].items():
        answers = ", ".join(f"{a} {b}" for a, b in sorted({**c["status"], **c["errors"]}.items()))
        phantoms = c.get("phantoms", {}).get("counted", "-")
        lines.append(
            f"| {n} | {c['requests']} | {c['ok']} | {c['goodput_rps']:.2f} | "
            f"{_ms(c['figures'][sc.SHORT]['p50_ms'])} | {c['work_after_stop_s']:.2f} s | "
            f"{c['pod']['requests_orphaned']} | {phantoms} | {answers} |"
        )
    return "\n".join(lines) + "\n"


def _add(p) -> None:
    p.add_argument(
        "--scheduling",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="experiment: a [scheduling] line for both sidecars, e.g. fcfs_wait_multiple=1.3 (repeatable)",
    )
    p.add_argument(
        "--open-s",
        type=float,
        default=None,
        help="experiment: seconds of the serial profile's open-loop trace per seed (quick 40, full 240, of which "
        "the first 90 are left out): at rho 0.9 FCFS's queue takes about 90 s to reach its steady state",
    )


def main() -> None:
    args = parse_args("real_habits", __doc__, _add)
    pinning = pin(1)
    conf = QUICK if args.quick else FULL
    if args.open_s:
        conf = conf | {"open_s": args.open_s}
    run = {"seed": SEED, "serial": serial(args, conf), "keeps": keeps_computing(args, conf)}
    targets = targets_of(run)
    out = write_result(args, run, targets, markdown(run, pinning))
    print((out / "result.md").read_text())
    print(json.dumps({t["name"]: t["met"] for t in targets}))


if __name__ == "__main__":
    main()
