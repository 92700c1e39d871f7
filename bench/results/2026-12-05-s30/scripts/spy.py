"""py-spy the full sidecar (or the wire) under unthrottled h2load; collapsed stacks to OUT."""
import contextlib, os, subprocess, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
from bench.common import Nginx, cpu_seconds
from bench.overhead import BENCH_POLICY
from proxy.testing.procs import Proc
proto, out, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 15
ng = Nginx(cpu=1)
tmp = Path(tempfile.mkdtemp()); (tmp / "p.toml").write_text(BENCH_POLICY)
p = ["--h1", "-m", "1"] if proto == "http1" else ["-m", "10"]
with Proc(["serve", "--policy", str(tmp / "p.toml"), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
           "--upstream", ng.h1_url, "--log-level", "warning"], cpu=0, name="rm") as rm:
    pid = rm.popen.pid
    subprocess.run(["taskset", "-c", "1", "h2load", "-c10", *p, "-D", "3", rm.url() + "/"], capture_output=True)
    h = subprocess.Popen(["taskset", "-c", "1", "h2load", "-c10", *p, "-D", str(secs + 4), rm.url() + "/"], stdout=subprocess.PIPE, text=True)
    time.sleep(2)
    c0 = cpu_seconds(pid)
    subprocess.run(["py-spy", "record", "-p", str(pid), "-r", "997", "-d", str(secs), "--format", "raw", "-o", out, "--nonblocking"], capture_output=True)
    c1 = cpu_seconds(pid)
    o = h.communicate()[0]
    line = [l for l in o.splitlines() if l.startswith("finished in")]
    print(line, "cpu s", c1 - c0)
