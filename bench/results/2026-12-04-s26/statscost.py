import sys, time, httpx
sys.path.insert(0, "/work/main")
from bench.common import cpu_seconds
from proxy.testing.stack import sidecar, sim_pod
with sim_pod("--max-num-seqs", "8", speed=20.0) as pod:
    with sidecar([pod.url()], "--log-level", "warning") as car:
        with httpx.Client(timeout=30) as c:
            for i in range(200):
                c.post(car.url() + "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi " * (i % 50)}], "max_tokens": 8 + i % 64})
            for path in ("/admin/stats", "/metrics", "/readyz"):
                pid = car.popen.pid; c0 = cpu_seconds(pid); t0 = time.perf_counter(); n = 20
                for _ in range(n): r = c.get(car.url("admin") + path)
                print(path, f"{len(r.content)} bytes, wall {1000*(time.perf_counter()-t0)/n:.1f} ms, sidecar CPU {1000*(cpu_seconds(pid)-c0)/n:.1f} ms per GET")
