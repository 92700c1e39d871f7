"""Scratch: vLLM closed loop of 16, direct vs pass-through sidecar alternated; AG=n sets vLLM's autogroup nice."""
import json, os, statistics, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/tmp/s27")
from bench.real_servers.cases import closed_case, run_case
from bench.real_servers.servers import SERVERS, RunningServer, model_name, probe_ms
from proxy.testing.stack import sidecar
out = Path(f"/tmp/s27/ag{os.environ.get('AG', 'x')}"); out.mkdir(exist_ok=True, parents=True)
spec = SERVERS["vllm"]
vport = spec.url.rsplit(":", 1)[1]
with RunningServer(spec, out) as server:
    server.install(); server.start()
    if os.environ.get("AG"):
        Path(f"/proc/{server.pid}/autogroup").write_text(os.environ["AG"])
    print("vllm autogroup:", Path(f"/proc/{server.pid}/autogroup").read_text().strip(), "ours:", Path("/proc/self/autogroup").read_text().strip(), flush=True)
    model = model_name(spec.url)
    probe = statistics.median(probe_ms(spec, model) for _ in range(3))
    with sidecar([], "--log-level", "info", "--log-format", "json", policy="/tmp/s27/gap/policy.toml") as proc:
        time.sleep(2)
        dport = proc.url("data").rsplit(":", 1)[1]
        case = closed_case(spec, model, 8, 10000, 12.0)
        for i in range(6):
            name = ("direct", "rampmeter")[i % 2]
            url, pid = (proc.url("data"), proc.popen.pid) if name == "rampmeter" else (spec.url, None)
            cap = subprocess.Popen(["tcpdump", "-i", "lo", "-s", "96", "-w", str(out / f"run{i}.pcap"), f"tcp port {vport}"], stderr=subprocess.DEVNULL)
            time.sleep(0.5)
            one = run_case(case, spec, model, {name: (url, pid)}, 10000, proc.url("admin") if name == "rampmeter" else None, probe, 1, seed=1)
            cap.terminate(); cap.wait()
            r = one[name][0]
            (out / "ports.json").write_text(json.dumps({"data": dport, "vllm": vport}))
            res = subprocess.run(["python3", "/tmp/s27/inflight.py", str(out / f"run{i}.pcap"), str(out / "ports.json")], capture_output=True, text=True).stdout.split("\n")
            secs = [float(x.split("vllm")[1].split("|")[0]) for x in res[2].split("|")[:-1] if "vllm" in x] if len(res) > 2 else []
            serial = sum(1 for v in secs[1:-1] if v <= 1.3)
            shapes = {k: (v["requests"], round(v["p50_ms"] or 0)) for k, v in r.get("by_shape", {}).items()}
            print(i, name, f"rps {r['achieved_rps']:.2f} p50 {r['p50_ms']:.0f}", shapes, f"serial seconds {serial}/{len(secs)-2}", flush=True)
