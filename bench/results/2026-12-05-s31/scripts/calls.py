"""cProfile call counts per request of the full sidecar and of the wire under h2load -n N (h1 or h2c)."""
import os, subprocess, sys, tempfile, time, signal, glob
from pathlib import Path
sys.path.insert(0, os.getcwd())
from bench.common import Nginx
from bench.overhead import BENCH_POLICY
from proxy.testing.procs import Proc
proto, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.environ["PROF_OUT"] = out
os.environ["PYTHONPATH"] = "/work/main/bench/results/2026-12-05-s30/scripts"
ng = Nginx(cpu=1)
tmp = Path(tempfile.mkdtemp()); (tmp / "p.toml").write_text(BENCH_POLICY)
p = ["--h1", "-m", "1"] if proto == "http1" else ["-m", "10"]
def drive(pid, url, tag):
    subprocess.run(["taskset", "-c", "1", "h2load", "-c10", *p, "-n", "3000", url], capture_output=True)
    os.kill(pid, signal.SIGUSR1); time.sleep(0.3)
    subprocess.run(["taskset", "-c", "1", "h2load", "-c10", *p, "-n", str(n), url], capture_output=True)
    os.kill(pid, signal.SIGUSR2); time.sleep(1.0)
with Proc(["serve", "--policy", str(tmp / "p.toml"), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
           "--upstream", ng.h1_url, "--log-level", "warning"], cpu=0, name="rm") as rm:
    drive(rm.popen.pid, rm.url() + "/", "full")
w = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-m", "bench.overhead", "--serve-wire", "127.0.0.1:0", ng.h1_url], stdout=subprocess.PIPE, text=True)
line = w.stdout.readline(); url = "http://" + line.split('"data": "')[1].split('"')[0]
drive(w.pid, url + "/", "wire")
w.terminate(); w.wait(10)
print(sorted(glob.glob(out + ".*")))
