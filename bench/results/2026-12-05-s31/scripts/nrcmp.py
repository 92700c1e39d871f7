import json, sys
from pathlib import Path
old, new = Path(sys.argv[1]), Path(sys.argv[2])
for b in ("scheduling", "overload", "dedup", "retry_storm", "coldstart"):
    o, n = old / f"s30-{b}" / "result.json", new / f"s31-{b}" / "result.json"
    if not (o.exists() and n.exists()):
        print(b, "missing", o.exists(), n.exists()); continue
    to = {t["name"]: t for t in json.loads(o.read_text())["targets"]}
    tn = {t["name"]: t for t in json.loads(n.read_text())["targets"]}
    for k in to:
        a, c = to[k], tn.get(k, {})
        f = lambda v: "-" if v is None else ("%.4g" % v)
        print(f"{b:12s} {k:55s} s30 {f(a['value']):>9s} {'met' if a['met'] else 'NO ':3s}  s31 {f(c.get('value')):>9s} {'met' if c.get('met') else 'NO '}")
