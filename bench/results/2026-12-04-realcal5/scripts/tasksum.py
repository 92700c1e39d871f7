"""Per-task CPU of the windows in a taskcpu file: python tasksum.py FILE [requests-in-window-2]"""
import json, sys
docs = [json.loads(l) for l in open(sys.argv[1])]
# windows: [0] startup, [1] idle, [2] load, [3] teardown
for name, i in (("idle", 1), ("load", 2)):
    if i >= len(docs): break
    d = docs[i]; dur = d["at"] - docs[i - 1]["at"]; tot = sum(d["cpu_ms"].values())
    print(f"== {name}: {dur:.1f} s, {tot:.0f} ms CPU in the trio thread ({tot/dur:.1f} ms/s)")
    for k, v in list(d["cpu_ms"].items())[:18]:
        print(f"   {v:8.1f} ms {v/dur:6.2f} ms/s {100*v/tot:5.1f}%  steps {d['steps'].get(k, 0):6d}  {k}")
