import sys, threading, time, subprocess, os, gc
sys.path.insert(0, "/work/main")
from proxy.http import patrol
seen = []
_r = patrol.Patrol.running
def running(self, conn, n, now):
    if not seen: seen.append(self)
    return _r(self, conn, n, now)
patrol.Patrol.running = running
from bench.common import Nginx
ng = Nginx(cpu=1)
import bench.overhead as ov
def load():
    time.sleep(2)
    subprocess.run(["h2load", "--h1", "-n", "30000", "-c", "10", "http://127.0.0.1:18778/"], capture_output=True)
    p = seen[0]; print("running deque after 30000 requests:", len(p._running), "distinct connections held:", len({id(e[1]) for e in p._running})); os._exit(0)
threading.Thread(target=load, daemon=True).start()
try: ov.serve_wire("127.0.0.1:18778", ng.h1_url)
finally: ng.stop()
