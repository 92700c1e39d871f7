import sys, os, statistics
sys.path.insert(0, os.getcwd())
import bench.policy_path as pp
from proxy.runtime import observe, scheduler, edge
from proxy.core import admission, service_model
v = sys.argv[1:]
if "obs" in v:
    observe.Observatory.record = lambda *a, **k: None
    observe.Observatory.timeout_hint_ms = lambda *a, **k: 1000
if "inst" in v:
    scheduler._Instruments.released = lambda *a, **k: None
    scheduler._Instruments.admitted = lambda *a, **k: None
if "learn" in v:
    admission.AdmissionController._fold = lambda self: self._samples.clear()
if "rid" in v:
    edge.request_ids.make = lambda b: b"0" * 32
raw = pp.run(20000, int(os.environ.get("REPS", 7)), None)
for ver, f in raw.items():
    w, fu = statistics.median(f["wire"]), statistics.median(f["full"])
    print(ver, v, "wire %.1f full %.1f policy %.1f  min-policy %.1f" % (w, fu, fu - w, min(f["full"]) - min(f["wire"])))
