"""Admission's cost in process, by part: bench.policy_path's loop with one part of the controller's
common case stubbed (inst: the admission metrics; load: the load estimator's accepted / released;
gate: the arrival gate's quiet pass and its CoDel dequeue; svc: service_ms as the ticket's expected
time; fold: samples dropped unlearned).

    REPS=7 python bench/results/2026-12-05-s33/scripts/admission_parts.py [inst] [load] [gate] [svc] [fold]
"""
import os
import statistics
import sys

sys.path.insert(0, os.getcwd())
import bench.policy_path as pp  # noqa: E402
from proxy.core import admission, arrival, load  # noqa: E402
from proxy.runtime import scheduler  # noqa: E402

v = sys.argv[1:]
if "inst" in v:
    scheduler._Instruments.released = lambda *a, **k: None
    scheduler._Instruments.admitted = lambda *a, **k: None
if "load" in v:
    load.LoadEstimator.accepted = lambda *a, **k: None
    load.LoadEstimator.released = lambda *a, **k: None
if "gate" in v:
    arrival.ArrivalGate.passes_at_once = lambda *a, **k: True
    arrival.ArrivalGate.dequeued = lambda *a, **k: None
if "svc" in v:
    admission.AdmissionController.service_ms = lambda self, t, now: t.expected_ms
if "fold" in v:
    admission.AdmissionController._fold = lambda self, learn_last=False: self._samples.clear()
raw = pp.run(20000, int(os.environ.get("REPS", 7)), None)
for ver, f in raw.items():
    w, fu = statistics.median(f["wire"]), statistics.median(f["full"])
    print(ver, "+".join(v) or "base", "wire %.1f full %.1f policy %.1f" % (w, fu, fu - w), flush=True)
