"""Floors by chunk, in process: bench.policy_path's loop (real App, stand-in pool and sink) with the
chunks named on the command line at their floors (stubs.py); the drop from `base` is what they cost.

    REPS=5 python bench/results/2026-12-05-s33/scripts/chunks.py [classify] [admit] [observe] [notes] [ready]
    REPS=7 python bench/results/2026-12-05-s33/scripts/chunks.py [inst] [load] [gate] [svc] [fold]  (admission's parts)
    PROF=FILE ... : a cProfile of the full path instead (FILE.1.1, FILE.2)
"""
import os
import statistics
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench.policy_path as pp  # noqa: E402
import stubs  # noqa: E402

v = sys.argv[1:]
stubs.apply(v)
raw = pp.run(20000, int(os.environ.get("REPS", 5)), os.environ.get("PROF"))
if not os.environ.get("PROF"):
    for ver, f in raw.items():
        w, fu = statistics.median(f["wire"]), statistics.median(f["full"])
        print(ver, "+".join(v) or "base", "wire %.1f full %.1f policy %.1f" % (w, fu, fu - w), flush=True)
