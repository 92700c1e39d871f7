"""The admission defaults on a real server: LitServe's OpenAI chat endpoint, direct and through rampmeter.

LitServe 0.2.19 (/work/shared/servers/litserve_server.py) serves /v1/chat/completions from a
fake LM that emits one word every TOKEN_DELAY_S (0.02 s): one request at a time (one worker,
no batching), and it keeps computing after the client disconnects. Start it first
(`SERVERS_DIR=... PORT=... bash /work/shared/servers/litserve_start.sh`), then:

    python -m bench.real_habits_litserve --url http://127.0.0.1:PORT [--quick]

Two cases, each direct then through a sidecar (default policy but a fixed limit of 1, the
server's parallelism; stops_on_cancel left at "auto"), the same seeded trace:
1. a closed loop of 4 clients, 80% 16-token / 20% 64-token answers, no budgets: short p50,
   long p99, and nothing shed;
2. 8 clients (100 ms think time), half 16-token and half 64-token answers, every request
   with an 800 ms budget its client keeps (0.9 s timeout): goodput, and how long the server
   kept computing after the load stopped (a 1-token request sent straight to it right
   after: its latency less that of one sent to an idle server).
Not part of `make test`; the full real-server benchmark is bench/real_servers (servers-real).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from bench.common import parse_args, target, write_result
from proxy import loadtest as lt
from proxy.loadtest.shapes import Shape, chat_body
from proxy.testing import demo_scenario as demo
from proxy.testing import scheduling as sc

SEED = 5
CHAT = "/v1/chat/completions"
POLICY = """[warmup]
health_interval_s = 0.5
[gpu]
enabled = false
[scheduling]
order = "sjf"
[limits]
kind = "fixed"
initial_limit = 1
min_limit = 1
"""


def mix(short_share: float, deadline_ms: int | None = None) -> lt.Mix:
    def body(tokens: int) -> bytes:
        return chat_body(8, tokens, model="m")

    return lt.Mix(
        (
            Shape(sc.SHORT, CHAT, body(16), deadline_ms=deadline_ms, weight=short_share),
            Shape(sc.LONG, CHAT, body(64), deadline_ms=deadline_ms, weight=1.0 - short_share),
        )
    )


def probe_ms(url: str) -> float:
    t0 = time.monotonic()
    httpx.post(
        url + CHAT, content=chat_body(8, 1, model="m"), headers={"content-type": "application/json"}, timeout=600
    )
    return (time.monotonic() - t0) * 1000.0


def rejected(admin: str) -> dict:
    stats = httpx.get(admin + "/admin/stats", timeout=10).json()
    out = dict(stats["admission"]["counts"]["rejected"])
    for k, v in stats["shedding"]["shed"].items():
        out[k] = out.get(k, 0) + v
    return {k: v for k, v in out.items() if v}


def one(trace: lt.Trace, url: str, name: str, timeout_s: float, sla: dict) -> dict:
    result = lt.run_sync(trace, lt.Target(url, name=name, timeout_s=timeout_s))
    step = result.analyze(lt.SLA()).steps[0].overall
    fig = sc.class_figures(result, sla)[0]
    return {
        "requests": step.requests,
        "ok": step.ok,
        "answers": {**dict(step.status), **dict(step.errors)},
        "figures": fig,
        "goodput_rps": fig["all"]["goodput_rps"],
    }


def main() -> None:
    args = parse_args(
        "real_habits_litserve", __doc__, lambda p: p.add_argument("--url", required=True, help="LitServe base URL")
    )
    step_s = 20.0 if args.quick else 40.0
    idle_probe = min(probe_ms(args.url) for _ in range(3))
    run: dict = {"server": "LitServe 0.2.19, TOKEN_DELAY_S 0.02", "url": args.url, "idle_probe_ms": idle_probe}
    path = Path(args.out) / "policy.toml"
    path.write_text(POLICY)
    with demo.sidecars(args.url, {"sjf": POLICY}, args.out) as procs:
        proxy, admin = procs["sjf"].url(), procs["sjf"].url("admin")
        c4 = lt.build_trace(lt.Plan.sweep([4], step_s=step_s, warmup_s=3.0, mode="closed"), mix(0.8), seed=SEED)
        sla = {sc.SHORT: 5000.0, sc.LONG: 20000.0}
        before = rejected(admin)
        run["closed4"] = {
            "direct": one(c4, args.url, "direct", 600.0, sla),
            "rampmeter": one(c4, proxy, "sjf", 600, sla),
        }
        run["closed4"]["rampmeter"]["rejected"] = {k: v - before.get(k, 0) for k, v in rejected(admin).items()}
        plan = lt.Plan(
            lt.Plan.sweep([8], step_s=step_s, warmup_s=3.0).steps, mode="closed", think_ms=100.0
        )  # 8 clients
        tight = lt.build_trace(plan, mix(0.5, deadline_ms=800), seed=SEED)
        sla = dict.fromkeys(sc.CLASSES, 800.0)
        run["deadlines"] = {}
        for name, url in (("direct", args.url), ("rampmeter", proxy)):
            before = rejected(admin)
            run["deadlines"][name] = r = one(tight, url, name, 0.9, sla)
            r["work_after_stop_s"] = max(0.0, probe_ms(args.url) - idle_probe) / 1000.0
            if name == "rampmeter":
                r["rejected"] = {k: v - before.get(k, 0) for k, v in rejected(admin).items()}
                adm = httpx.get(admin + "/admin/stats", timeout=10).json()["admission"]
                r["phantoms"] = adm["counts"]["phantoms"]
                r["model"] = adm["models"][CHAT]
            time.sleep(max(2.0, r["work_after_stop_s"] + 1.0))  # the next case starts on an idle server
    c, d = run["closed4"], run["deadlines"]
    sheds = sum(v for k, v in c["rampmeter"]["rejected"].items() if k in ("overloaded", "queue_full"))
    direct_good = d["direct"]["goodput_rps"]
    targets = [
        target("closed4_sheds", float(sheds), "==", 0.0),
        target(
            "deadlines_goodput_ratio_rampmeter_over_direct",
            d["rampmeter"]["goodput_rps"] / direct_good if direct_good else float("inf"),
            ">=",
            1.0,
        ),
        target("deadlines_work_after_stop_s_rampmeter", d["rampmeter"]["work_after_stop_s"], "<=", 1.0),
    ]
    lines = [
        "# real_habits_litserve",
        "",
        f"LitServe 0.2.19 at {args.url} (serial, keeps computing). Idle 1-token probe {idle_probe:.0f} ms.",
        "",
        "| case | configuration | requests | ok | short p50 | long p99 | goodput req/s | work after stop | answers |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for case, rows in (("closed loop of 4", c), ("800 ms budgets, 8 clients", d)):
        for n, r in rows.items():
            f = r["figures"]
            after = f"{r['work_after_stop_s']:.2f} s" if "work_after_stop_s" in r else "-"
            lines.append(
                f"| {case} | {n} | {r['requests']} | {r['ok']} | {demo._ms(f[sc.SHORT]['p50_ms'])} | "
                f"{demo._ms(f[sc.LONG]['p99_ms'])} | {r['goodput_rps']:.2f} | {after} | {r['answers']} |"
            )
    out = write_result(args, run, targets, "\n".join(lines))
    print((out / "result.md").read_text())
    print(json.dumps({t["name"]: t["met"] for t in targets}))


if __name__ == "__main__":
    main()
