import os
if os.environ.get("GAP_OUT"):
    import json, signal
    from proxy.http import patrol as P
    last, gaps = {}, []
    _idle, _run = P.Patrol.idle_since, P.Patrol.running
    def idle_since(self, conn, now):
        last[id(conn)] = now
        return _idle(self, conn, now)
    def running(self, conn, n, now):
        t = last.pop(id(conn), None)
        if t is not None: gaps.append(now - t)
        return _run(self, conn, n, now)
    P.Patrol.idle_since, P.Patrol.running = idle_since, running
    def dump(*_):
        g = sorted(gaps)
        q = lambda p: round(1000 * g[min(len(g) - 1, int(p * len(g)))], 2) if g else None
        with open(os.environ["GAP_OUT"], "a") as f:
            f.write(json.dumps({"n": len(g), "p50_ms": q(.5), "p90_ms": q(.9), "p99_ms": q(.99), "max_ms": q(1.0)}) + "\n")
        gaps.clear()
    signal.signal(signal.SIGUSR2, dump)
