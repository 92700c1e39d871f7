import contextlib, subprocess, sys, time, os
sys.path.insert(0, "/work/main")
from pathlib import Path
from bench.common import Nginx
from bench.overhead import BENCH_POLICY
from proxy.testing.procs import Proc
secs = int(sys.argv[1])
pol = Path("/tmp/s26/bp2.toml"); pol.write_text(BENCH_POLICY)
def rss(pid): return int([l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")][0].split()[1]) // 1024
with contextlib.ExitStack() as st:
    ng = Nginx(cpu=1); st.callback(ng.stop)
    rm = st.enter_context(Proc(["serve", "--policy", str(pol), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
        "--upstream", ng.h1_url, "--log-level", "warning"], cpu=0, name="rampmeter"))
    pid = rm.popen.pid
    h = subprocess.Popen(["taskset", "-c", "1", "h2load", "--h1", "-c10", "--rps", "100", "-D", str(secs), rm.url() + "/"], stdout=subprocess.PIPE, text=True)
    samples = []
    for i in range(secs // 10):
        time.sleep(10); samples.append(rss(pid))
    out = h.communicate()[0]
    print("RSS MiB every 10 s:", samples, [l for l in out.splitlines() if "requests:" in l])
