import pstats, sys
def load(f):
    st = pstats.Stats(f).stats
    return {f"{k[0].split('/work/main/')[-1].split('site-packages/')[-1]}:{k[1]}:{k[2]}": (v[1], v[2]) for k, v in st.items()}
full, wire = load(sys.argv[1]), load(sys.argv[2]); n = float(sys.argv[3])
rows = []
for k in set(full) | set(wire):
    fc, ft = full.get(k, (0, 0)); wc, wt = wire.get(k, (0, 0))
    rows.append(((fc - wc) / n, (ft - wt) / n * 1e6, fc / n, wc / n, k))
rows.sort(key=lambda r: -r[0])
tot = sum(r[0] for r in rows)
print("delta calls/req total %.1f" % tot)
for r in rows[:int(sys.argv[4]) if len(sys.argv) > 4 else 80]:
    if abs(r[0]) >= 0.5: print("%6.2f %7.2fus full %6.2f wire %6.2f  %s" % r)
