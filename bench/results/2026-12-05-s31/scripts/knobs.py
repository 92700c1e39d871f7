"""bench.scheduling at 1.1x capacity only: FCFS, and SJF and the oracle at several settings of one
scheduling knob, over several traces.

    python knobs.py aging 100,200,400 7,8,9 OUT
    python knobs.py fcfs_wait_multiple 2,3,0 7,8,9 OUT
"""
import json, os, sys, statistics
sys.path.insert(0, os.getcwd())
from pathlib import Path
import bench.scheduling as bs
from proxy.testing import demo_scenario as demo
from proxy.testing import scheduling as sc
from proxy.testing.procs import Proc
knob = sys.argv[1]
assert knob in ("aging", "fcfs_wait_multiple"), knob
agings = [float(a) for a in sys.argv[2].split(",")]  # the knob's settings
seeds = [int(s) for s in sys.argv[3].split(",")]
out = Path(sys.argv[4]); out.mkdir(parents=True, exist_ok=True)
profile, mix = demo.demo_profile(), sc.chat_mix()
with Proc(demo.pod_argv(profile, bs.SEED), cpu=0, name="sim-pod") as pod:
    sweep = demo.measure_capacity(pod.url(), mix, profile, bs.SEED, [24, 32, 48], 8.0, 2.0)
    limit, capacity = demo.choose_limit(sweep, bs.LIMIT_FRACTION)
    load = round(1.1 * capacity, 1)
    print("capacity", capacity, "limit", limit, "load", load, flush=True)
    def policy(order, value, **kw):
        aging = value if knob == "aging" else 100
        toml = sc.policy_toml(order, limit, profile, aging_ms_per_s=aging, max_queue_wait_ms=bs.BACKSTOP_MS, **kw)
        if knob == "fcfs_wait_multiple":
            toml = toml.replace("aging_ms_per_s = 100", f"aging_ms_per_s = 100\nfcfs_wait_multiple = {value:g}")
        return toml

    pol = {"fcfs": sc.policy_toml("fcfs", limit, profile, aging_ms_per_s=100, max_queue_wait_ms=bs.BACKSTOP_MS)}
    for a in agings:
        pol[f"sjf{a:g}"] = policy("sjf", a)
        pol[f"oracle{a:g}"] = policy("sjf", a, oracle_route=True)
    rows = []
    with demo.sidecars(pod.url(), pol, out, cpu=1) as procs:
        targets = {n: p.url() for n, p in procs.items()}
        hinted = sc.with_oracle_hints(mix, profile, bs.SEED, limit)
        mixes = {n: (hinted if n.startswith("oracle") else mix) for n in targets}
        for seed in seeds:
            res = demo.compare(targets, mixes, [load], 16.0, 3.0, seed)
            f = {n: sc.class_figures(r, sc.sla_ms(profile))[0] for n, r in res.items()}
            row = {"seed": seed, "fcfs_mean": f["fcfs"]["all"]["mean_ms"]}
            for a in agings:
                s, o = f[f"sjf{a:g}"], f[f"oracle{a:g}"]
                row[a] = {"sjf_mean": s["all"]["mean_ms"], "oracle_mean": o["all"]["mean_ms"],
                          "ratio": s["all"]["mean_ms"] / o["all"]["mean_ms"],
                          "cut": 1 - s["all"]["mean_ms"] / f["fcfs"]["all"]["mean_ms"],
                          "short_p99x": f["fcfs"][sc.SHORT]["p99_ms"] / s[sc.SHORT]["p99_ms"],
                          "long_p99x": s[sc.LONG]["p99_ms"] / f["fcfs"][sc.LONG]["p99_ms"],
                          "oracle_long_p99x": o[sc.LONG]["p99_ms"] / f["fcfs"][sc.LONG]["p99_ms"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    (out / "rows.json").write_text(json.dumps(rows, indent=1))
    for a in agings:
        med = {k: statistics.median(r[a][k] for r in rows) for k in rows[0][agings[0]]}
        print(knob, a, {k: round(v, 3) for k, v in med.items()})
