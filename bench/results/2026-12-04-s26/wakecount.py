import sys, threading, time, subprocess, os
sys.path.insert(0, "/work/main")
from proxy.http import patrol
calls = {"wake": 0, "running": 0, "late": []}
_w, _r = patrol.Patrol._wake, patrol.Patrol.running
def wake(self, at): calls["wake"] += 1; return _w(self, at)
def running(self, conn, n, now):
    calls["running"] += 1
    if now + patrol.WATCH_AFTER_S < self._wake_at and len(calls["late"]) < 5: calls["late"].append((now, self._wake_at, len(self._running), self._running[0][0] if self._running else None))
    return _r(self, conn, n, now)
patrol.Patrol._wake, patrol.Patrol.running = wake, running
from bench.common import Nginx
ng = Nginx(cpu=1)
import bench.overhead as ov
def load():
    time.sleep(2)
    out = subprocess.run(["h2load", "--h1", "-n", "20000", "-c", "10", "http://127.0.0.1:18777/"], capture_output=True, text=True).stdout
    print([l for l in out.splitlines() if "requests:" in l]); print(calls["wake"], calls["running"], calls["late"]); os._exit(0)
threading.Thread(target=load, daemon=True).start()
try: ov.serve_wire("127.0.0.1:18777", ng.h1_url)
finally: ng.stop()
