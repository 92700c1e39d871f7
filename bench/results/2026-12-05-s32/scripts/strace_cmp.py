"""Syscalls a request, the wire configuration against the full sidecar (BENCH_POLICY): strace -c -f on the
server while h2load sends 10,000 requests (10 clients) after 3,000 of warm-up. Writes /tmp/strace_{wire,full}_PROTO.txt.

    python bench/results/2026-12-05-s32/scripts/strace_cmp.py http1|h2c
"""
import os, sys, time, tempfile, subprocess
from pathlib import Path
sys.path.insert(0, os.getcwd())
from bench.common import Nginx
from bench.overhead import BENCH_POLICY
ng = Nginx(cpu=1)
pol = Path(tempfile.mkdtemp()) / "p.toml"; pol.write_text(BENCH_POLICY)
proto = sys.argv[1]
p = ["--h1", "-m", "1"] if proto == "http1" else ["-m", "10"]
for cfg in ("wire", "full"):
    argv = [sys.executable, "-m", "bench.overhead", "--serve-wire", "127.0.0.1:0", ng.h1_url] if cfg == "wire" else \
        [sys.executable, "-m", "proxy", "serve", "--policy", str(pol), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--upstream", ng.h1_url, "--log-level", "warning"]
    w = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True); line = w.stdout.readline()
    url = "http://" + line.split('"data": "')[1].split('"')[0] + "/"
    subprocess.run(["h2load", "-c10", *p, "-n", "3000", url], capture_output=True)
    st = subprocess.Popen(["strace", "-c", "-f", "-p", str(w.pid), "-o", f"/tmp/strace_{cfg}_{proto}.txt"])
    time.sleep(1)
    subprocess.run(["h2load", "-c10", *p, "-n", "10000", url], capture_output=True)
    st.terminate(); st.wait()
    w.terminate(); w.wait()
ng.stop()
