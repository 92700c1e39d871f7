"""Every direct / rampmeter pair of a bench.real_servers result: python pairs.py RESULT_DIR"""
import json, sys
d = json.load(open(sys.argv[1] + "/result.json"))
r = d["runs"]["vllm"]
c = r["calibrate"]
print(f"calibrated limit {c['limit']}, budget {c['budget_ms']} ms; capacity closed {r['capacity_rps']:.1f}/s, open {r.get('open_capacity_rps') or 0:.1f}/s")
def g(x, *ks):
    for k in ks:
        if x is None: return None
        x = x.get(k)
    return x
def f(v, spec=".0f"):
    return "-" if v is None else format(v, spec)
for case, per in r["cases"].items():
    print(f"## {case}")
    print("| pair | offered/s | direct: ans/s, short p50, long p50, long p99, run/wait | through: ans/s, short p50, long p50, long p99, run/wait, limit/queued, run\\|q, wait\\|q, sheds, cpu us/req, cpu ms/s | short ratio | thr ratio |")
    for i, (a, b) in enumerate(zip(per["direct"], per["rampmeter"])):
        def side(x, through):
            s = x["sampled"]
            out = [f(x["achieved_rps"], ".1f"), f(g(x, "by_shape", "short", "p50_ms")), f(g(x, "by_shape", "long", "p50_ms")), f(g(x, "by_shape", "long", "p99_ms")),
                   f"{f(g(s, 'running', 'mean'), '.1f')}/{f(g(s, 'waiting', 'mean'), '.1f')}"]
            if through:
                out += [f"{f(g(s, 'limit', 'mean'), '.1f')}/{f(g(s, 'queued', 'mean'), '.1f')}", f(s.get("running_while_queued"), ".1f"), f(s.get("waiting_while_queued"), ".1f"),
                        str(x["sheds"]) + (f" (+{x['requests'] - x['ok'] - x['sheds']} other)" if x['requests'] - x['ok'] - x['sheds'] else ""),
                        f(x.get("sidecar_cpu_us_per_request")), f(x.get("sidecar_cpu_ms_per_s"), ".1f")]
            else:
                nok = x['requests'] - x['ok']
                if nok: out[-1] += f" ({nok} non-2xx)"
            return ", ".join(out)
        ds, ts = g(a, "by_shape", "short", "p50_ms"), g(b, "by_shape", "short", "p50_ms")
        print(f"| {i+1} | {a['offered_rps']:.1f} | {side(a, False)} | {side(b, True)} | {f(ds/ts if ds and ts else None, '.2f')} | {f(b['achieved_rps']/a['achieved_rps'] if a['achieved_rps'] else None, '.2f')} |")
    # what the non-2xx were, per pair (reasons from x-rampmeter-reason; client time-outs under errors)
    for i, (a, b) in enumerate(zip(per["direct"], per["rampmeter"])):
        print(f"- pair {i+1}: direct non-2xx {dict(a.get('reasons', {}))} errors {dict(a.get('errors', {}))}; "
              f"through {dict(b.get('reasons', {}))} errors {dict(b.get('errors', {}))}")
