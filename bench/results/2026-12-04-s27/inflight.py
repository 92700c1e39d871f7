import json, sys
sys.path.insert(0, "/tmp/s27")
from pcap import packets
from collections import defaultdict
path, ports = sys.argv[1], json.load(open(sys.argv[2]))
dport, vport = int(ports["data"]), int(ports["vllm"])
ev = defaultdict(list)
for t, sp, dp, n, fl in packets(path):
    if n <= 0: continue
    for port, role in ((dport, "data"), (vport, "vllm")):
        if dp == port: ev[(role, sp)].append((t, "c", n))
        elif sp == port: ev[(role, dp)].append((t, "s", n))
# requests: start at first c byte after s (or start), end at last s byte before next c
reqs = {"data": [], "vllm": []}
for (role, port), es in ev.items():
    cur = None
    for t, d, n in es:
        if d == "c":
            if cur is None or cur["end"] is not None:
                cur = {"start": t, "end": None, "bytes": 0, "port": port, "last_c": t}; reqs[role].append(cur)
            cur["bytes"] += n; cur["last_c"] = t
        else:
            if cur is not None:
                cur["end"] = t
big = [r for r in reqs["vllm"] if r["bytes"] > 300]
print("vllm POSTs", len(big), "small", len(reqs["vllm"]) - len(big))
t0 = min(r["start"] for r in reqs["data"] + big) if reqs["data"] else min(r["start"] for r in big)
t1 = max(r["end"] or r["start"] for r in reqs["data"] + big)
def avg(rs):
    tot = sum(((r["end"] or t1) - r["start"]) for r in rs)
    return tot / (t1 - t0)
print(f"span {t1-t0:.1f}s  mean in flight: data {avg(reqs['data']):.2f}  vllm {avg(big):.2f}")
# per second buckets
import math
for s in range(int(t1 - t0) + 1):
    a, b = t0 + s, t0 + s + 1
    def occ(rs):
        return sum(max(0, min(b, r["end"] or t1) - max(a, r["start"])) for r in rs)
    print(s, f"data {occ(reqs['data']):5.1f} vllm {occ(big):5.1f}", end=" | ")
print()
# match: each data request -> next vllm POST starting after its start with nearest start (greedy order)
import bisect
vs = sorted(big, key=lambda r: r["start"]); used = [False] * len(vs)
lag_in, lag_out = [], []
for r in sorted(reqs["data"], key=lambda r: r["start"]):
    for i, v in enumerate(vs):
        if not used[i] and v["start"] >= r["last_c"] - 0.0005:
            used[i] = True
            lag_in.append((v["start"] - r["last_c"]) * 1000)
            if r["end"] and v["end"]: lag_out.append((r["end"] - v["end"]) * 1000)
            break
def q(xs, p):
    xs = sorted(xs); return round(xs[min(len(xs)-1, int(p*len(xs)))], 1) if xs else None
print("arrive->forward ms p50/p90/max", q(lag_in,.5), q(lag_in,.9), q(lag_in,.999), " upstream end->client end", q(lag_out,.5), q(lag_out,.9), q(lag_out,.999))
if len(sys.argv) > 3:
    a, b = t0 + float(sys.argv[3]), t0 + float(sys.argv[4])
    rows = [("D", r) for r in reqs["data"]] + [("V", r) for r in reqs["vllm"]]
    for kind, r in sorted(rows, key=lambda x: x[1]["start"]):
        if a <= r["start"] <= b or (r["end"] and a <= r["end"] <= b):
            print(kind, r["port"], f"start {r['start']-t0:7.3f} end {((r['end'] or t1)-t0):7.3f} bytes {r['bytes']}")
