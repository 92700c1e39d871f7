import os, sys
if "serve" in sys.argv and os.environ.get("GC_OUT"):
    import gc, time, atexit, threading
    _t = [0.0, 0.0, 0]; rec = []; hist = {}
    def cb(phase, info):
        if phase == "start":
            _t[0] = time.perf_counter(); _t[1] = time.thread_time(); _t[2] = gc.get_count()[0]
        else:
            d = time.perf_counter() - _t[0]; c = time.thread_time() - _t[1]
            g = info["generation"]; b = hist.setdefault(g, [0, 0.0, 0.0]); b[0] += 1; b[1] += c; b[2] = max(b[2], d)
            if d > 0.005: rec.append((time.time(), g, d, c, info["collected"]))
    gc.callbacks.append(cb)
    def dump():
        with open(os.environ["GC_OUT"] + f".{os.getpid()}", "w") as f:
            f.write("hist %r freeze %d\n" % (hist, gc.get_freeze_count()))
            for r in rec: f.write("%.3f gen%d wall %.4f cpu %.4f collected %d\n" % r)
    atexit.register(dump)
    if os.environ.get("GCX"):
        period = float(os.environ["GCX"])
        def loop():
            while True:
                time.sleep(period)
                gc.collect(0); gc.freeze()
        threading.Thread(target=loop, daemon=True).start()
if "serve" in sys.argv and os.environ.get("PASS_OUT"):
    import time as _time, atexit as _atexit
    from collections import Counter as _Counter
    import trio as _trio
    class _Passes(_trio.abc.Instrument):
        def __init__(self):
            self.t = None; self.steps = _Counter(); self.rec = []
        def after_io_wait(self, timeout):
            self.t = _time.perf_counter(); self.steps.clear()
        def before_task_step(self, task):
            self.steps[task.name.rsplit(".", 1)[-1]] += 1
        def before_io_wait(self, timeout):
            if self.t is not None:
                d = _time.perf_counter() - self.t
                if d > 0.008:
                    self.rec.append((_time.time(), d, sum(self.steps.values()), self.steps.most_common(5)))
    _P = _Passes()
    _orig_run = _trio.run
    def _run(*a, **k):
        k.setdefault("instruments", []); k["instruments"] = list(k["instruments"]) + [_P]
        return _orig_run(*a, **k)
    _trio.run = _run
    def _dump():
        with open(os.environ["PASS_OUT"] + f".{os.getpid()}", "w") as f:
            for r in _P.rec: f.write("%.3f pass %.1f ms steps %d %s\n" % (r[0], r[1] * 1000, r[2], r[3]))
    _atexit.register(_dump)
