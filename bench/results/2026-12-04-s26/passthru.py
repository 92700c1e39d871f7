"""Scratch: vLLM closed loop of 16, direct vs through a pass-through sidecar (fixed limit 64, FCFS), alternated."""
import json, os, statistics, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main")
import httpx
from bench.real_servers.cases import closed_case, run_case
from bench.real_servers.servers import SERVERS, RunningServer, model_name, probe_ms
from proxy.testing.stack import sidecar
out = Path("/tmp/s26/passthru"); out.mkdir(exist_ok=True)
spec = SERVERS["vllm"]
extra = sys.argv[1] if len(sys.argv) > 1 else ""
POLICY = f"""
[[upstreams]]
url = "{spec.url}"
timeout_s = 60.0
stops_on_cancel = true
[warmup]
health_path = "/health"
[slow_start]
window_s = 0
[scheduling]
order = "fcfs"
[limits]
kind = "fixed"
initial_limit = 64
max_limit = 64
{extra}
[access_log]
enabled = true
"""
(out / "policy.toml").write_text(POLICY)
with RunningServer(spec, out) as server:
    server.install(); server.start()
    model = model_name(spec.url)
    probe = statistics.median(probe_ms(spec, model) for _ in range(3))
    if os.environ.get("GAP_OUT"):
        os.environ["PYTHONPATH"] = "/tmp/s26/sc3:/work/main"
    with sidecar([], "--log-level", "info", "--log-format", "json", policy=str(out / "policy.toml")) as proc:
        time.sleep(3)
        if os.environ.get("SIDECAR_NICE"):  # the sidecar only
            os.setpriority(os.PRIO_PROCESS, proc.popen.pid, -int(os.environ["SIDECAR_NICE"]))
        if os.environ.get("NICE"):
            os.nice(-int(os.environ["NICE"]))  # the load generator only: vLLM and the sidecar started before
        targets = {"direct": (spec.url, None), "rampmeter": (proc.url("data"), proc.popen.pid)}
        case = closed_case(spec, model, 8, 10000, 12.0)
        res = {"direct": [], "rampmeter": []}
        import signal as _s
        for _ in range(3):
            one = run_case(case, spec, model, targets, 10000, None if os.environ.get("NOADMIN") else proc.url("admin"), probe, 1, seed=1)
            for k in res: res[k] += one[k]
            if os.environ.get("GAP_OUT"):
                os.kill(proc.popen.pid, _s.SIGUSR2); time.sleep(0.5)
        for name, rows in res.items():
            for r in rows:
                s = r["sampled"]
                run_ = {k: round(v["mean"], 2) for k, v in s.items() if isinstance(v, dict) and "mean" in v}
                shapes = {k: (v["requests"], round(v["p50_ms"] or 0)) for k, v in r.get("by_shape", {}).items()}
                print(name, f"rps {r['achieved_rps']:.2f} p50 {r['p50_ms']:.0f}", run_, shapes)
        st = httpx.get(proc.url("admin") + "/admin/stats", timeout=10).json()
        (out / "stats.json").write_text(json.dumps(st, indent=1))
        print(json.dumps(st.get("latency", {}).get("service", [])[:3]))
        import shutil; shutil.copy(proc.log_path, out / "sidecar.log")
