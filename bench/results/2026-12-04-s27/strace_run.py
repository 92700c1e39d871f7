"""Scratch: vLLM + pass-through sidecar, closed loop of 16 through, strace the sidecar for 6 s mid-run, and tcpdump."""
import json, os, statistics, subprocess, sys, time, threading
from pathlib import Path
sys.path.insert(0, "/work/main")
from bench.real_servers.cases import closed_case, run_case
from bench.real_servers.servers import SERVERS, RunningServer, model_name, probe_ms
from proxy.testing.stack import sidecar
out = Path("/tmp/s27/st"); out.mkdir(exist_ok=True, parents=True)
spec = SERVERS["vllm"]
policy = Path("/tmp/s27/gap/policy.toml")
vport = spec.url.rsplit(":", 1)[1]
with RunningServer(spec, out) as server:
    server.install(); server.start()
    model = model_name(spec.url)
    probe = statistics.median(probe_ms(spec, model) for _ in range(3))
    os.environ["IO_OUT"] = "/tmp/s27/st/io.bin"; os.environ["PYTHONPATH"] = "/tmp/s27/sc:/work/main"
    with sidecar([], "--log-level", "info", "--log-format", "json", policy=str(policy)) as proc:
        time.sleep(3)
        dport = proc.url("data").rsplit(":", 1)[1]; aport = proc.url("admin").rsplit(":", 1)[1]
        (out / "ports.json").write_text(json.dumps({"data": dport, "admin": aport, "vllm": vport, "pid": proc.popen.pid}))
        case = closed_case(spec, model, 8, 10000, 12.0)
        for i in range(int(os.environ.get("RUNS", "2"))):
            cap = subprocess.Popen(["tcpdump", "-i", "lo", "-s", "128", "-w", str(out / f"run{i}.pcap"),
                                    f"tcp port {dport} or tcp port {vport}"], stderr=subprocess.DEVNULL)
            def trace():
                subprocess.run(["timeout", "-s", "INT", "14", "strace", "-f", "-tt", "-T", "-o", str(out / f"run{i}.strace"), "-p", str(proc.popen.pid)], stderr=subprocess.DEVNULL)
            def spy():
                with open(out / f"spy{i}.txt", "w") as f:
                    for k in range(24):
                        time.sleep(0.5)
                        f.write(f"=== {time.time():.4f}\n"); f.flush()
                        subprocess.run(["/work/main/.venv/bin/py-spy", "dump", "--pid", str(proc.popen.pid)], stdout=f, stderr=f)
            def sched():
                import glob
                with open(out / f"sched{i}.txt", "w") as f:
                    tids = {}
                    for k in range(160):
                        if k == 3:
                            pids = subprocess.run("pgrep -f 'vllm|proxy serve'", shell=True, capture_output=True, text=True).stdout.split() + [str(os.getpid())]
                            for p_ in pids:
                                for t in glob.glob(f"/proc/{p_}/task/*"):
                                    try: tids[t] = p_ + ":" + open(t + "/comm").read().strip()
                                    except OSError: pass
                        line = [f"{time.time():.4f}", open("/proc/stat").readline().strip()]
                        for t, name in tids.items():
                            try: a = open(t + "/schedstat").read().split()
                            except OSError: continue
                            line.append(f"{t.split('/')[-1]}|{name}|{a[0]}|{a[1]}")
                        f.write("S2 " + " ;; ".join(line) + "\n")
                        time.sleep(0.05)
            sp = threading.Thread(target=lambda: subprocess.run(["python3", "/tmp/s27/snap2.py", str(out / f"snap{i}.txt"), "10"])); sp.start()
            th = threading.Thread(target=trace)
            if os.environ.get("STRACE"): th.start()
            one = run_case(case, spec, model, {"rampmeter": (proc.url("data"), proc.popen.pid)}, 10000, None, probe, 1, seed=1)
            sp.join(); th.join() if os.environ.get("STRACE") else None; os.kill(proc.popen.pid, 12); time.sleep(1); os.rename("/tmp/s27/st/io.bin", f"/tmp/s27/st/io{i}.bin"); cap.terminate(); cap.wait()
            r = one["rampmeter"][0]
            print(i, f"rps {r['achieved_rps']:.2f} p50 {r['p50_ms']:.0f}", flush=True)
