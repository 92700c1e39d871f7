"""Scratch: overload at FACTOR x CAP rps against the sim stand-in, direct vs through POLICY. Prints goodput."""
import os, sys, json, statistics, collections
from pathlib import Path
sys.path.insert(0, "/work/main")
os.environ.setdefault("RAMPMETER_SERVERS_RECIPES", "/tmp/s28/recipes")
from bench.real_servers.servers import SERVERS, RunningServer, model_name, probe_ms
from bench.real_servers.cases import open_case, run_case
from proxy.testing.stack import sidecar
from bench.real_servers.__main__ import wait_warm

policy = sys.argv[1]; factor = float(sys.argv[2]); cap = float(os.environ.get("CAP", "36.4"))
dur = float(os.environ.get("DUR", "10")); reps = int(os.environ.get("REPS", "1")); budget = int(os.environ.get("BUDGET", "10000"))
spec = SERVERS["vllm"]
out = Path("/tmp/s28/run"); out.mkdir(exist_ok=True)
with RunningServer(spec, out) as server:
    server.start()
    model = model_name(spec.url)
    alone = statistics.median(probe_ms(spec, model) for _ in range(3))
    with sidecar([], "--log-level", "warning", policy=policy) as proc:
        wait_warm(proc.url("admin"), 60)
        targets = {"direct": (spec.url, None), "rampmeter": (proc.url("data"), proc.popen.pid)}
        if os.environ.get("ONLY"):
            targets = {k: v for k, v in targets.items() if k == os.environ["ONLY"]}
        case = open_case("overload", spec, model, factor * cap, budget, dur)
        res = run_case(case, spec, model, targets, budget, proc.url("admin"), alone, reps, seed=int(os.environ.get("SEED", "2")))
        for name, rows in res.items():
            for r in rows:
                bs = r["by_shape"]
                print(name, f"req {r['requests']} ok {r['ok']} good {r['good']} good/s {r['goodput_rps']:.2f} status {r['status']} err {r['errors']}",
                      "short p50", round(bs.get("short", {}).get("p50_ms") or 0), "long p50", round(bs.get("long", {}).get("p50_ms") or 0),
                      "short good", bs.get("short", {}).get("good"), "long good", bs.get("long", {}).get("good"), "queued", r["sampled"].get("queued", {}).get("mean"))
                print("   reasons", r.get("reasons"))
