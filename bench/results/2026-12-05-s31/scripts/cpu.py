"""CPU us/request of the full sidecar (or wire) under unthrottled h2load."""
import os, subprocess, sys, tempfile, time, signal
from pathlib import Path
sys.path.insert(0, os.getcwd())
from bench.common import Nginx, cpu_seconds
from bench.overhead import BENCH_POLICY
from proxy.testing.procs import Proc
proto, secs = sys.argv[1], int(sys.argv[2])
ng = Nginx(cpu=1)
tmp = Path(tempfile.mkdtemp()); (tmp / "p.toml").write_text(BENCH_POLICY)
p = ["--h1", "-m", "1"] if proto == "http1" else ["-m", "10"]
with Proc(["serve", "--policy", str(tmp / "p.toml"), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
           "--upstream", ng.h1_url, "--log-level", "warning"], cpu=0, name="rm") as rm:
    pid = rm.popen.pid
    subprocess.run(["taskset", "-c", "1", "h2load", "-c10", *p, "-D", "3", rm.url() + "/"], capture_output=True)
    h = subprocess.Popen(["taskset", "-c", "1", "h2load", "-c10", *p, "-D", str(secs + 3), rm.url() + "/"], stdout=subprocess.PIPE, text=True)
    time.sleep(1.5); c0 = cpu_seconds(pid); t0 = time.time()
    time.sleep(secs)
    c1 = cpu_seconds(pid); t1 = time.time()
    o = h.communicate()[0]
    rps = float([l for l in o.splitlines() if l.startswith("finished in")][0].split(",")[1].split()[0])
    print(proto, os.environ.get("TAG", ""), "rps %.0f cpu/req %.1f us busy %.2f" % (rps, (c1 - c0) / (rps * (t1 - t0)) * 1e6, (c1 - c0) / (t1 - t0)))
    if os.environ.get("RM_GC_COUNT"):
        os.kill(pid, signal.SIGUSR1); time.sleep(0.5)
