"""Scratch: vLLM closed loop of 16 through a pass-through sidecar (as s26 passthru.py), with tcpdump on lo.
Runs: direct, through (admin polled), through (no polling), direct, through(polled), through(no poll). Saves pcap."""
import json, os, statistics, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main")
import httpx
from bench.real_servers.cases import closed_case, run_case
from bench.real_servers.servers import SERVERS, RunningServer, model_name, probe_ms
from proxy.testing.stack import sidecar
out = Path("/tmp/s27/gap"); out.mkdir(exist_ok=True, parents=True)
spec = SERVERS["vllm"]
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
[access_log]
enabled = true
"""
(out / "policy.toml").write_text(POLICY)
vport = spec.url.rsplit(":", 1)[1]
with RunningServer(spec, out) as server:
    server.install(); server.start()
    model = model_name(spec.url)
    probe = statistics.median(probe_ms(spec, model) for _ in range(3))
    with sidecar([], "--log-level", "info", "--log-format", "json", policy=str(out / "policy.toml")) as proc:
        time.sleep(3)
        dport = proc.url("data").rsplit(":", 1)[1]; aport = proc.url("admin").rsplit(":", 1)[1]
        (out / "ports.json").write_text(json.dumps({"data": dport, "admin": aport, "vllm": vport}))
        case = closed_case(spec, model, 8, 10000, 12.0)
        for i, (name, poll) in enumerate([("rampmeter", True), ("rampmeter", False), ("direct", True)] * 2):
            url, pid = (proc.url("data"), proc.popen.pid) if name == "rampmeter" else (spec.url, None)
            cap = subprocess.Popen(["tcpdump", "-i", "lo", "-s", "128", "-w", str(out / f"run{i}-{name}-{'poll' if poll else 'nopoll'}.pcap"),
                                    f"tcp port {dport} or tcp port {aport} or tcp port {vport}"], stderr=subprocess.DEVNULL)
            time.sleep(1)
            t0 = time.time()
            one = run_case(case, spec, model, {name: (url, pid)}, 10000, proc.url("admin") if poll else None, probe, 1, seed=1)
            cap.terminate(); cap.wait()
            r = one[name][0]
            print(i, name, "poll" if poll else "nopoll", f"t0 {t0:.3f} rps {r['achieved_rps']:.2f} p50 {r['p50_ms']:.0f}", r["sampled"].get("readings"), flush=True)
        import shutil; shutil.copy(proc.log_path, out / "sidecar.log")
