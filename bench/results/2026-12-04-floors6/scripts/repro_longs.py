"""Slow-then-fast reproduction: how long the sidecar keeps rejecting a recovered shape."""
import sys, time, json
import httpx, trio
from proxy.testing.stack import sidecar, sim_pod

POLICY = """
[warmup]
health_interval_s = 0.2
[gpu]
enabled = false
[limits]
kind = "fixed"
initial_limit = 32
min_limit = 1
"""

def chat(n):
    return {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": n}

kwdump = False
LONGS_ONLY = True
async def main(warm_s=2.0, slow_s=4.0, recover_s=8.0, rate=10.0, budget_ms=1000, slowdown=5.0):
    open("/tmp/floors6/policy.toml", "w").write(POLICY)
    with sim_pod("--stop-mean-tokens", "0", profile="llm", speed=1.0) as pod, sidecar(pod.url(), policy="/tmp/floors6/policy.toml") as proxy:
        rows = []
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=200)) as client:
            t0 = trio.current_time()
            async def one(n):
                sent = trio.current_time() - t0
                r = await client.post(proxy.url() + "/v1/chat/completions", json=chat(n), headers={"x-request-timeout-ms": str(budget_ms)})
                rows.append((sent, trio.current_time() - t0 - sent, n, r.status_code, r.headers.get("x-rampmeter-reason", "")))
            async with trio.open_nursery() as nursery:
                k = 0
                fault_at = warm_s
                faulted = False
                end = warm_s + slow_s + recover_s
                while trio.current_time() - t0 < end:
                    now = trio.current_time() - t0
                    if not faulted and now >= fault_at:
                        await client.post(pod.url() + "/sim/faults", json={"slowdown": slowdown, "duration_s": slow_s})
                        faulted = True
                    nursery.start_soon(one, 64 if (k % 2 == 0 or LONGS_ONLY) else 4)
                    k += 1
                    await trio.sleep(1.0 / rate)
            stats = (await client.get(proxy.url("admin") + "/admin/stats")).json()
    rec = warm_s + slow_s
    if kwdump: [print("   ", round(r[0],2), round(r[1],2), r[3], r[4]) for r in sorted(rows) if r[2] == 64 and warm_s - 0.5 <= r[0] < rec + 2]
    longs = sorted([r for r in rows if r[2] == 64])
    after = [r for r in longs if r[0] >= rec]
    unmeet_after = [r for r in after if r[4] == "deadline_unmeetable"]
    ok_after = [r for r in after if r[3] == 200]
    first_ok = min((r[0] for r in ok_after), default=None)
    last_un = max((r[0] for r in unmeet_after), default=None)
    print("phases: warm", warm_s, "slow", slow_s, "recover", recover_s, "rate", rate, "budget", budget_ms)
    for phase, lo, hi in (("warm", 0, warm_s), ("slow", warm_s, rec), ("recover", rec, rec + recover_s)):
        for n in (4, 64):
            sel = [r for r in rows if r[2] == n and lo <= r[0] < hi]
            counts = {}
            for r in sel:
                key = f"{r[3]} {r[4]}".strip()
                counts[key] = counts.get(key, 0) + 1
            print(f"  {phase:8s} max_tokens={n:3d}: {counts}")
    print("recovery: long requests sent after the backend recovered:", len(after), "rejected deadline_unmeetable:", len(unmeet_after), f"({len(unmeet_after)/max(1,len(after)):.0%})")
    print("first 200 for a long request after recovery at +%s s; last deadline_unmeetable at +%s s" % (None if first_ok is None else round(first_ok - rec, 2), None if last_un is None else round(last_un - rec, 2)))
    ok_lat = [r[1] for r in longs if r[3] == 200 and r[0] >= rec + 1]
    print("long 200 latency after recovery (s): max", max(ok_lat, default=None))
    print(json.dumps(stats["admission"]["models"]["/v1/chat/completions"].get("censored"), indent=None))

import functools
kw = {k: float(v) for k, v in (a.split("=") for a in sys.argv[1:] if a != "dump")}
kwdump = "dump" in sys.argv
if "budget_ms" in kw: kw["budget_ms"] = int(kw["budget_ms"])
trio.run(functools.partial(main, **kw))
