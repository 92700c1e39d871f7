import glob, time, sys
def snap():
    d = {}
    for t in glob.glob("/proc/[0-9]*/task/[0-9]*"):
        try:
            run = int(open(t + "/schedstat").read().split()[0]); comm = open(t + "/comm").read().strip()
            pid = t.split("/")[2]; pcomm = open(f"/proc/{pid}/comm").read().strip()
            d[t] = (f"{pid}/{pcomm}/{comm}", run)
        except OSError: pass
    return d
out = open(sys.argv[1], "a")
for rep in range(int(sys.argv[2])):
    a = snap(); t = time.time(); time.sleep(1.0); b = snap(); dt = time.time() - t
    rows = sorted(((b[k][1] - a[k][1]) / 1e6, b[k][0]) for k in b if k in a)
    rows = [r for r in rows if r[0] > 5][::-1][:15]
    out.write(f"== {t:.3f} dt {dt:.2f}\n" + "\n".join(f"{ms:7.1f} ms {name}" for ms, name in rows) + "\n"); out.flush()
