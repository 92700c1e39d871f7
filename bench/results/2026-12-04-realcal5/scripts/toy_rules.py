"""Compare EngineQueue update rules on the timed toy of tests/core/test_engine_follow.py."""
import random, statistics, sys
sys.path.insert(0, ".")
import proxy.core.limits as L
from tests.core.test_engine_follow import Toy

orig = L.EngineQueue.reading

def make(gain_up, gain_down, signed=False, alpha=None, frac=False):
    def reading(self, running, waiting, inflight, lo, hi):
        self.waiting_mean += L.WAITING_ALPHA * (waiting - self.waiting_mean)
        runs = running if running is not None else max(0.0, inflight - waiting)
        self.peak_running = max(runs, self.peak_running * L.PEAK_DECAY)
        if inflight <= 0:
            self.reason = "engine_not_ours"; return self.limit
        idle = max(0.0, self.peak_running - runs)
        standing = waiting - idle if signed else max(0.0, waiting - idle)
        if alpha is not None:
            f = getattr(self, "_f", None)
            standing = standing if f is None else f + alpha * (standing - f)
            object.__setattr__(self, "_f", standing) if False else None
            self.__dict__["_f"] = standing
        base = self.limit if (frac and inflight >= int(self.limit)) else float(inflight)
        if standing > self.target:
            follow = base + self.target - standing
            if runs + waiting > inflight + 0.5:
                follow = float(inflight)
            if follow < self.limit:
                self.limit, self.reason = max(float(lo), self.limit + gain_down * (follow - self.limit)), "engine_queue"
        elif standing < self.target and inflight >= int(self.limit) and self.limit < hi:
            self.limit, self.reason = min(float(hi), self.limit + gain_up * (self.target - standing)), "engine_idle"
        return self.limit
    return reading

rules = {
    "current(1,.5)": orig,
    "sym 1": make(1.0, 1.0),
    "sym .5 frac": make(0.5, 0.5, frac=True),
    "sym .35 frac": make(0.35, 0.35, frac=True),
}
target = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
for name, fn in rules.items():
    L.EngineQueue.reading = fn
    if name.endswith("") and "alpha" in name:
        pass
    rows = []
    for transit in (0.05, 0.15, 0.3, 0.6):
        for load in (0.9, 1.1, 2.0):
            ws, rq, lim = [], [], []
            for seed in range(6):
                toy = Toy(8, transit, L.EngineQueueLimit(8, 1, 64, target_waiting=target), random.Random(seed))
                toy.run(load * toy.capacity_rps, 300.0)
                ws.append(toy.mean(1)); lim.append(toy.mean(3))
                try: rq.append(toy.running_while_queued())
                except ZeroDivisionError: pass
            rows.append((transit, load, statistics.mean(ws), min(rq) if rq else float('nan'), statistics.mean(rq) if rq else float('nan'), statistics.mean(lim)))
    print(name, "T=", target)
    for r in rows:
        print("  transit %.2f load %.1f  waiting %.2f  run|queued min %.2f mean %.2f  limit %.1f" % r)
