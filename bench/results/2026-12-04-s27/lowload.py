"""Scratch: vLLM open loop at RATES, direct vs calibrated policy vs pass-through, alternated."""
import json, os, statistics, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main")
from bench.real_servers.cases import open_case, run_case
from bench.real_servers.servers import SERVERS, RunningServer, model_name, probe_ms
from proxy.testing.stack import sidecar
out = Path("/tmp/s27/low"); out.mkdir(exist_ok=True, parents=True)
spec = SERVERS["vllm"]
rates = [float(x) for x in os.environ.get("RATES", "20,40").split(",")]
pols = {"calibrated": "/tmp/s27/cal_al.toml"} if os.environ.get("AL") else {"calibrated": "/work/main/bench/results/2026-12-04-s27/vllm-yield/vllm.policy.toml", "passthru": "/tmp/s27/gap/policy.toml"}
with RunningServer(spec, out) as server:
    server.install(); server.start()
    model = model_name(spec.url)
    probe = statistics.median(probe_ms(spec, model) for _ in range(3))
    print("probe", probe, flush=True)
    for pname, pol in pols.items():
        with sidecar([], "--log-level", "info", "--log-format", "json", policy=pol) as proc:
            time.sleep(10)
            for rate in rates:
                case = open_case("x", spec, model, rate, 10000, 10.0)
                for rep in range(2):
                    targets = {"direct": (spec.url, None), pname: (proc.url("data"), proc.popen.pid)}
                    one = run_case(case, spec, model, targets, 10000, proc.url("admin"), probe, 1, seed=rep + 1)
                    line = []
                    for name, rows in one.items():
                        r = rows[0]; s = r["by_shape"]
                        line.append(f"{name}: short p50 {s['short']['p50_ms']:.0f} p99 {s['short']['p99_ms']:.0f} long p50 {s['long']['p50_ms']:.0f} rps {r['achieved_rps']:.1f} cpu/req {r['sidecar_cpu_us_per_request'] or 0:.0f}")
                    print(pname, rate, rep, " | ".join(line), flush=True)
            import shutil; shutil.copy(proc.log_path, out / f"{pname}.log")
