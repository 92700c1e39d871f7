"""Syscalls per request, full vs wire, HTTP/1.1 and h2c, fixed rate (strace -c)."""
import subprocess, sys, time, tempfile, os, signal, re, contextlib
from pathlib import Path
sys.path.insert(0, os.getcwd())
from bench.common import Nginx
from bench.overhead import BENCH_POLICY
from proxy.testing.procs import Proc
RATE, SECS = int(os.environ.get("RATE", 1000)), 3
def h2(url, proto):
    p = ["--h1"] if proto == "http1" else []
    n = RATE * SECS
    subprocess.run(["taskset","-c","1","h2load","-c","4","-m","1",*p,"--rps",str(RATE/4),"-n",str(n),url+"/"],capture_output=True,check=True)
    return n
def trace(pid, url, proto):
    h2(url, proto)  # warm
    out = "/tmp/s29/st.%d" % pid
    st = subprocess.Popen(["strace","-c","-f","-q","-p",str(pid),"-o",out])
    time.sleep(0.5); n = h2(url, proto); time.sleep(0.2)
    st.send_signal(signal.SIGINT); st.wait()
    rows = {}
    for line in Path(out).read_text().splitlines():
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            calls = int(f[3]); rows[f[-1]] = calls / n
    return rows
ng = Nginx(cpu=1)
tmp = Path(tempfile.mkdtemp()); (tmp/"p.toml").write_text(BENCH_POLICY)
with contextlib.ExitStack() as stack:
    rm = stack.enter_context(Proc(["serve","--policy",str(tmp/"p.toml"),"--listen","127.0.0.1:0","--admin","127.0.0.1:0","--upstream",ng.h1_url,"--log-level","warning"],cpu=0,name="rm"))
    w = subprocess.Popen(["taskset","-c","0",sys.executable,"-m","bench.overhead","--serve-wire","127.0.0.1:0",ng.h1_url],stdout=subprocess.PIPE,text=True)
    line = w.stdout.readline(); import json; wurl = "http://" + json.loads(line)["data"] if line.startswith("{") else None
    print("wire line", line.strip())
    m = re.search(r"127\.0\.0\.1:\d+", line); wurl = "http://" + m.group(0)
    from bench.common import cpu_seconds
    for proto in ("http1","h2c"):
      for rep in range(int(os.environ.get("REPS", 3))):
        for name, pid, url in (("full", rm.popen.pid, rm.url()), ("wire", w.pid, wurl)):
            h2(url, proto)
            os.kill(pid, signal.SIGUSR1); time.sleep(0.3)
            n = h2(url, proto); time.sleep(0.3)
            os.kill(pid, signal.SIGUSR2); time.sleep(1.0)
            import pstats, glob
            f = max(glob.glob(os.environ["PROF_OUT"] + ".*"), key=os.path.getmtime)
            st = pstats.Stats(f); calls = sum(v[1] for v in st.stats.values())
            print(proto, name, "calls/req %.1f" % (calls / n), f, flush=True)
            os.rename(f, f"/tmp/s29/prof/{proto}-{name}.pstats")
    w.terminate(); w.wait()
ng.stop() if hasattr(ng,"stop") else None
