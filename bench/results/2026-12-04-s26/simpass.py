"""Scratch: the pass-through closed loop of passthru.py, on the sim pod (llm profile, 8 sequences) instead of vLLM."""
import statistics, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main")
import trio
from bench.real_servers.cases import closed_case
from bench.real_servers.servers import SERVERS
from proxy import loadtest as lt
from proxy.testing.stack import sidecar, sim_pod
out = Path("/tmp/s26/simpass"); out.mkdir(exist_ok=True)
spec = SERVERS["vllm"]
with sim_pod("--max-num-seqs", "8", *sys.argv[1:]) as pod:
    url = pod.url()
    (out / "policy.toml").write_text(f"""
[[upstreams]]
url = "{url}"
timeout_s = 60.0
[slow_start]
window_s = 0
[scheduling]
order = "fcfs"
[limits]
kind = "fixed"
initial_limit = 64
max_limit = 64
""")
    with sidecar([], "--log-level", "warning", policy=str(out / "policy.toml")) as car:
        time.sleep(2)
        case = closed_case(spec, "tiny", 8, 10000, 10.0)
        trace = lt.build_trace(case.plan, case.mix, seed=1)
        import threading, httpx, os
        stop = threading.Event()
        def poll():
            with httpx.Client(timeout=5) as c:
                while not stop.wait(0.5):
                    try: c.get(car.url("admin") + "/admin/stats").json()
                    except Exception: pass
        if os.environ.get("POLL"):
            threading.Thread(target=poll, daemon=True).start()
        for _ in range(3):
            for name, u in (("direct", url), ("sidecar", car.url())):
                target = lt.Target(u, name=name, timeout_s=10.0, max_in_flight=2048, check_json=False)
                res = trio.run(lt.run, trace, target)
                a = res.analyze(lt.SLA()).steps[0]
                sh = {k: round(v.latency.p50_ms) for k, v in a.by_shape.items() if v.latency}
                print(name, f"rps {a.overall.achieved_rps:.2f}", sh, flush=True)
